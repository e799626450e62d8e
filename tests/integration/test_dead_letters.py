"""Bad input never stops the worker: fuzzed garbage, mixed with good events, through a real one.

Hypothesis draws a few thousand malformed payloads of every kind the worker must refuse;
they are produced, interleaved with the events of a few well-formed runs, to a real broker
and a real worker process. Then every good step has its summary, every bad payload is on
the DLQ (same key, same bytes) with a reason header, and the worker is still running.
"""

from __future__ import annotations

import random
import struct
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlpulse.local.broker import tail
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import REASON_HEADER, SOURCE_HEADER, Topics

pytestmark = pytest.mark.broker

CODEC = default_codec()
RUNS, RANKS, STEPS = 5, 4, 20
BAD_EXAMPLES = 2500


def event(run_id: str, step: int, rank: int, **overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "kind": "metrics",
        "run_id": run_id,
        "attempt": 0,
        "step": step,
        "stage": "rollout",
        "rank": rank,
        "world_size": RANKS,
        "metrics": {"loss": float(step), "reward_mean": 1.0},
        "tags": {},
        "timestamp_ns": time.time_ns(),
        "producer_id": f"{run_id}/{rank}",
        "seq": step,
    }
    record.update(overrides)
    return record


def encoded(record: dict[str, Any]) -> bytes:
    return CODEC.encode("TrainerEvent", record)


names = st.text(st.characters(codec="ascii", exclude_characters="|"), min_size=1, max_size=8)
seqs = st.integers(10_000, 2**40)  # never a good event's seq


def semantic(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A decodable TrainerEvent the joiner must refuse, keyed by its run."""
    run_id = f"bad-{uuid.uuid4().hex[:12]}"
    kind = draw(st.sampled_from(["step", "rank", "world", "huge_world", "metrics", "run_id"]))
    base: dict[str, Any] = {"seq": draw(seqs), "step": draw(st.integers(0, 50)), "rank": 0}
    if kind == "step":
        base["step"] = draw(st.integers(-(2**40), -1))
    elif kind == "rank":
        base["rank"] = draw(st.integers(RANKS, 2**20))
    elif kind == "world":
        base["world_size"], base["rank"] = draw(st.integers(-5, 0)), 0
    elif kind == "huge_world":
        base["world_size"] = draw(st.integers(65_537, 2**31 - 1))
    elif kind == "metrics":
        base["metrics"] = {f"m{i}": 0.0 for i in range(draw(st.integers(1_025, 1_100)))}
    else:
        run_id = "x" * draw(st.integers(257, 2_000))
    step, rank = base.pop("step"), base.pop("rank")
    return run_id.encode()[:64], encoded(event(run_id, step, rank, **base))


def undecodable(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """Bytes that are not a decodable TrainerEvent: garbage, truncated, trailing, wrong record."""
    good = encoded(event("some-run", 1, 0, seq=draw(seqs)))
    kind = draw(st.sampled_from(["random", "fingerprint", "truncated", "trailing", "summary"]))
    if kind == "random":
        data = draw(st.binary(min_size=0, max_size=300))
        if data.startswith(b"\xc3\x01"):
            data = b"\x00" + data
    elif kind == "fingerprint":
        data = b"\xc3\x01" + struct.pack("<Q", draw(st.integers(0, 2**64 - 1))) + good[10:]
        if CODEC.registry.by_fingerprint(data[2:10]) is not None:
            data = data[:2] + b"\x00" * 8 + data[10:]
    elif kind == "truncated":
        data = good[: draw(st.integers(0, len(good) - 1))]
    elif kind == "trailing":
        data = good + draw(st.binary(min_size=1, max_size=20))
    else:
        data = CODEC.encode("CommandAck", {
            "command_id": "c", "run_id": "r", "attempt": 0, "status": "applied",
            "applied_at_step": None, "detail": {}, "acked_ns": 0,
        })  # fmt: skip
    return f"garbage-{uuid.uuid4().hex}".encode(), data


@st.composite
def malformed(draw: st.DrawFn) -> tuple[bytes, bytes]:
    maker: Callable[[st.DrawFn], tuple[bytes, bytes]] = draw(
        st.sampled_from([semantic, undecodable])
    )
    return maker(draw)


def draw_bad_payloads() -> list[tuple[bytes, bytes]]:
    found: list[tuple[bytes, bytes]] = []

    @settings(
        max_examples=BAD_EXAMPLES,
        deadline=timedelta(milliseconds=500),
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(malformed())
    def collect(payload: tuple[bytes, bytes]) -> None:
        found.append(payload)

    collect()
    return found


def read_all(
    bootstrap: str, topic: str, done: Callable[[list[Any]], bool], timeout_s: float
) -> list[Any]:
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex}",
        "auto.offset.reset": "earliest", "enable.auto.commit": False,
    })  # fmt: skip
    consumer.subscribe([topic])
    messages: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not done(messages):
            batch = consumer.consume(500, timeout=0.5)
            messages += [m for m in batch if m.error() is None]
    finally:
        consumer.close()
    return messages


def test_fuzzed_bad_input_goes_to_the_dlq_and_the_worker_keeps_going(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    bad = draw_bad_payloads()
    runs = [f"good-{uuid.uuid4().hex[:8]}" for _ in range(RUNS)]
    good = [
        (run.encode(), encoded(event(run, step, rank)))
        for step in range(STEPS)
        for run in runs
        for rank in range(RANKS)
    ]
    # world_size changing inside a group: after the first rank of step 0 of each good run
    conflicts = [
        (run.encode(), encoded(event(run, 0, 1, world_size=RANKS + 1, seq=10**9))) for run in runs
    ]
    stream = good[:]
    for payload in bad:
        stream.insert(random.randrange(len(stream) + 1), payload)
    for conflict, run in zip(conflicts, runs, strict=True):
        first = next(i for i, (key, _) in enumerate(stream) if key == run.encode())
        stream.insert(first + 1, conflict)
    refused = {(key, value) for key, value in [*bad, *conflicts]}

    worker = WorkerProcess(
        kafka_bootstrap, topics.prefix, tmp_path / "worker.log", partitions=3, grace_s=30.0
    )
    worker.start()
    try:
        worker.wait_consuming(timeout_s=90.0)
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 5})
        for key, value in stream:
            producer.produce(topics.events, key=key, value=value)
            producer.poll(0)
        assert producer.flush(30) == 0
        want = RUNS * STEPS

        def all_summaries(messages: list[Any]) -> bool:
            return len({CODEC.decode_summary(m.value())["summary_id"] for m in messages}) >= want

        summaries = [
            CODEC.decode_summary(m.value())
            for m in read_all(kafka_bootstrap, topics.steps, all_summaries, timeout_s=120.0)
        ]
        dead = read_all(
            kafka_bootstrap, topics.dlq, lambda ms: len(ms) >= len(refused), timeout_s=120.0
        )
        assert worker.alive(), tail(worker.log_file, 40)
    finally:
        worker.stop()
    log = tail(worker.log_file, 40)
    firsts = {(s["run_id"], s["step"]): s for s in summaries if s["revision"] == 1}
    assert set(firsts) == {(run, step) for run in runs for step in range(STEPS)}, log
    assert all(s["ranks_reported"] == list(range(RANKS)) for s in firsts.values())
    on_dlq = {(m.key(), m.value()): dict(m.headers() or []) for m in dead}
    missing = refused - set(on_dlq)
    assert not missing, f"{len(missing)} of {len(refused)} bad payloads not on the DLQ\n{log}"
    assert set(on_dlq) == refused  # nothing good was dead-lettered
    reasons = [headers[REASON_HEADER].decode() for headers in on_dlq.values()]
    assert all(
        reason.split(":")[0] in {"undecodable", "invalid", "too_large"} for reason in reasons
    )
    assert all(
        headers[SOURCE_HEADER].startswith(topics.events.encode()) for headers in on_dlq.values()
    )
    conflict_reasons = {on_dlq[c][REASON_HEADER].decode() for c in conflicts}
    assert all("world_size" in reason for reason in conflict_reasons), conflict_reasons
