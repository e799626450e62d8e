"""Bad input never stops the worker: fuzzed garbage, mixed with good events, through a real one.

A seeded generator (the seed is printed; ``RLPULSE_FUZZ_SEED=N`` replays a run) makes a few
thousand malformed payloads of every kind the worker must refuse, each with the reason the
worker must give it, written here from the rules in docs/design.md ("One validation of an
event", "Contracts"), not computed by the code under test. They are produced, interleaved
with the events of a few well-formed runs, to a real broker and a real worker process whose
reason headers are cut at 64 bytes. Then: every bad payload is on the DLQ exactly once, with
its key, its bytes, its reason (cut where the setting says) and its source; nothing good is;
every good step has one summary whose metrics are what the ranks logged; the worker runs on.
"""

from __future__ import annotations

import os
import random
import struct
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from rlpulse.local.broker import tail
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers import EventLogger
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import REASON_HEADER, SOURCE_HEADER, Topics
from tests.kafka import read_all, read_to_end, settings_at

pytestmark = pytest.mark.broker

CODEC = default_codec()
RUNS, RANKS, STEPS = 5, 4, 20
BAD_EXAMPLES = 2500
REASON_BYTES = 64
LIMIT_BYTES = 256 * 1024


@dataclass(frozen=True)
class Bad:
    """A payload the worker must refuse, and the reason it must give."""

    key: bytes
    value: bytes
    reason: str
    exact: bool = True  # False: ``reason`` is the start of the reason (details vary)


def event(run_id: str, step: int, rank: int, **overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "kind": "metrics",
        "run_id": run_id,
        "attempt": 0,
        "step": step,
        "stage": "rollout",
        "rank": rank,
        "world_size": RANKS,
        "metrics": {"loss": float(step), "reward_mean": 1.0 + rank},
        "tags": {},
        "timestamp_ns": time.time_ns(),
        "producer_id": f"{run_id}/{rank}",
        "seq": step,
    }
    record.update(overrides)
    return record


def encoded(record: dict[str, Any]) -> bytes:
    return CODEC.encode("TrainerEvent", record)


class Fuzz:
    """Malformed payloads of every kind, drawn from one seeded generator."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def semantic(self) -> Bad:
        """A decodable TrainerEvent the validation refuses."""
        rng = self.rng
        run_id = f"bad-{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}"
        fields: dict[str, Any] = {"seq": rng.randrange(10_000, 2**40)}
        step, rank = rng.randrange(0, 50), 0
        kind = rng.choice(
            ["step", "rank", "world", "huge_world", "metrics", "tags", "name", "stage", "run_id"]
        )
        if kind == "step":
            step = rng.randrange(-(2**40), 0)
            reason = f"invalid: negative step {step}"
        elif kind == "rank":
            rank = rng.randrange(RANKS, 2**20)
            reason = f"invalid: rank {rank} outside [0, {RANKS})"
        elif kind == "world":
            fields["world_size"] = rng.randrange(-5, 1)
            reason = f"invalid: world_size {fields['world_size']} < 1"
        elif kind == "huge_world":
            fields["world_size"] = rng.randrange(65_537, 2**31)
            reason = f"too_large: world_size {fields['world_size']} > 65536"
        elif kind == "metrics":
            count = rng.randrange(1_025, 1_100)
            fields["metrics"] = {f"m{i}": 0.0 for i in range(count)}
            reason = f"too_large: {count} metrics > 1024"
        elif kind == "tags":
            count = rng.randrange(65, 80)
            fields["tags"] = {f"t{i}": "v" for i in range(count)}
            reason = f"too_large: {count} tags > 64"
        elif kind == "name":
            length = rng.randrange(257, 400)
            fields["metrics"] = {"m" * length: 1.0}
            reason = f"too_large: a name or tag of {length} chars > 256"
        elif kind == "stage":
            fields["stage"] = f"roll|out{rng.randrange(100)}"
            reason = f"invalid: stage {fields['stage']!r} contains '|'"
        else:
            run_id = "x" * rng.randrange(257, 2_000)
            reason = f"too_large: run_id of {len(run_id)} chars > 256"
        return Bad(run_id.encode()[:64], encoded(event(run_id, step, rank, **fields)), reason)

    def undecodable(self) -> Bad:
        """Bytes that are not a decodable TrainerEvent."""
        rng = self.rng
        key = f"garbage-{uuid.UUID(int=rng.getrandbits(128)).hex}".encode()
        good = encoded(event("some-run", 1, 0, seq=rng.randrange(10_000, 2**40)))
        kind = rng.choice(["random", "empty", "fingerprint", "truncated", "trailing", "record"])
        if kind == "random":
            data = bytes([rng.randrange(256) for _ in range(rng.randrange(1, 300))])
            if data[0] == 0xC3:
                data = b"\x00" + data
            return Bad(key, data, "undecodable: garbage: ", exact=False)
        if kind == "empty":
            return Bad(key, b"", "undecodable: truncated: 0 bytes, header needs 10")
        if kind == "fingerprint":
            fingerprint = struct.pack("<Q", rng.getrandbits(64))
            while CODEC.registry.by_fingerprint(fingerprint) is not None:
                fingerprint = struct.pack("<Q", rng.getrandbits(64))
            unknown = fingerprint.hex()
            reason = f"undecodable: unknown_fingerprint: no schema with fingerprint {unknown}"
            return Bad(key, good[:2] + fingerprint + good[10:], reason)
        if kind == "truncated":
            cut = rng.randrange(10, len(good))
            return Bad(key, good[:cut], "undecodable: truncated: TrainerEvent: body ends early")
        if kind == "trailing":
            extra = rng.randrange(1, 20)
            data = good + bytes(rng.randrange(256) for _ in range(extra))
            return Bad(key, data, f"undecodable: garbage: {extra} bytes after the record")
        ack = CODEC.encode("CommandAck", {
            "command_id": "c", "run_id": "r", "attempt": 0, "status": "applied",
            "applied_at_step": None, "detail": {}, "acked_ns": 0,
        })  # fmt: skip
        return Bad(key, ack, "undecodable: wrong_record: got CommandAck, need TrainerEvent")

    def payloads(self, count: int) -> list[Bad]:
        makers: list[Callable[[], Bad]] = [self.semantic, self.undecodable]
        return [self.rng.choice(makers)() for _ in range(count)]

    def too_large(self) -> Bad:
        """An event over the byte limit: refused before it is even decoded."""
        record = event("big-run", 1, 0, kind="log", message="x" * (LIMIT_BYTES + 1000))
        data = encoded(record)
        return Bad(b"big-run", data, f"too_large: {len(data)} bytes > {LIMIT_BYTES}")


def test_fuzzed_bad_input_goes_to_the_dlq_and_the_worker_keeps_going(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    seed = int(os.environ.get("RLPULSE_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
    print(f"fuzz seed {seed} (RLPULSE_FUZZ_SEED={seed} replays this run)")
    fuzz = Fuzz(seed)
    bad = [*fuzz.payloads(BAD_EXAMPLES), fuzz.too_large()]
    runs = [f"good-{uuid.UUID(int=fuzz.rng.getrandbits(128)).hex[:8]}" for _ in range(RUNS)]
    good = [
        (run.encode(), encoded(event(run, step, rank)))
        for step in range(STEPS)
        for run in runs
        for rank in range(RANKS)
    ]
    stream = good[:]
    for payload in bad:
        stream.insert(fuzz.rng.randrange(len(stream) + 1), (payload.key, payload.value))
    for run in runs:  # world_size changing inside a group: right after its first rank
        conflict = encoded(event(run, 0, 1, world_size=RANKS + 1, seq=10**9))
        reason = f"invalid: world_size {RANKS + 1} differs from the {RANKS} of {run}|0|rollout|0"
        bad.append(Bad(run.encode(), conflict, reason))
        first = next(i for i, (key, _) in enumerate(stream) if key == run.encode())
        stream.insert(first + 1, (run.encode(), conflict))

    worker = WorkerProcess(
        kafka_bootstrap,
        topics.prefix,
        tmp_path / "worker.log",
        partitions=3,
        grace_s=30.0,
        env={"RLPULSE_WORKER__MAX_REASON_BYTES": str(REASON_BYTES)},
    )
    worker.start()
    try:
        worker.wait_consuming(timeout_s=90.0)
        producer = Producer(
            {"bootstrap.servers": kafka_bootstrap, "linger.ms": 5, "message.max.bytes": 2**20}
        )
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
            kafka_bootstrap, topics.dlq, lambda ms: len(ms) >= len(bad), timeout_s=120.0
        )
        assert worker.alive(), tail(worker.log_file, 40)
    finally:
        worker.stop()
    log = f"seed {seed}\n{tail(worker.log_file, 40)}"

    # Every bad payload on the DLQ exactly once, nothing else, each with its own reason.
    expected = {(b.key, b.value): b for b in bad}
    assert len(expected) == len(bad), "the generator made two identical payloads"
    on_dlq = Counter((m.key(), m.value()) for m in dead)
    assert on_dlq == Counter(expected.keys()), f"{len(on_dlq)} on the DLQ, {len(bad)} bad\n{log}"
    for message in dead:
        payload = expected[(message.key(), message.value())]
        headers = dict(message.headers() or [])
        reason = headers[REASON_HEADER]
        assert len(reason) <= REASON_BYTES, reason
        want_reason = payload.reason.encode()[:REASON_BYTES]
        if payload.exact:
            assert reason == want_reason, (payload.reason, reason, log)
        else:
            assert reason.startswith(want_reason), (payload.reason, reason, log)
        assert headers[SOURCE_HEADER].startswith(f"{topics.events}/".encode()), headers

    # Every good step summarised once, from exactly what its ranks logged.
    firsts = [s for s in summaries if s["run_id"] in runs and s["revision"] == 1]
    assert sorted((s["run_id"], s["step"]) for s in firsts) == sorted(
        (run, step) for run in runs for step in range(STEPS)
    ), log
    for summary in firsts:
        step = summary["step"]
        assert (summary["ranks_reported"], summary["closed_by"]) == (list(range(RANKS)), "complete")
        loss, reward = summary["metrics"]["loss"], summary["metrics"]["reward_mean"]
        assert (loss["count"], loss["mean"], loss["std"], loss["min"], loss["max"]) == (
            RANKS,
            float(step),
            0.0,
            float(step),
            float(step),
        )
        rewards = [1.0 + rank for rank in range(RANKS)]
        assert (reward["sum"], reward["mean"], reward["min_rank"], reward["max_rank"]) == (
            sum(rewards),
            sum(rewards) / RANKS,
            0,
            RANKS - 1,
        )


def test_events_the_trainer_refuses_never_reach_the_dlq(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """A stage with ``|`` and a 2,000-metric event stop at ``log()``, counted by reason.

    A worker runs the whole time; a raw bad payload produced after the trainer's events is
    the marker that the worker has read past them: it is then the DLQ's only record.
    """
    worker = WorkerProcess(kafka_bootstrap, topics.prefix, tmp_path / "worker.log", partitions=3)
    worker.start()
    try:
        worker.wait_consuming(timeout_s=90.0)
        run_id = f"refused-{uuid.uuid4().hex[:8]}"
        with EventLogger(
            run_id, rank=0, world_size=1, settings=settings_at(kafka_bootstrap, topics)
        ) as logger:
            logger.log({"loss": 1.0}, step=0, stage="a|b")
            logger.log({f"m{i}": float(i) for i in range(2000)}, step=0, stage="rollout")
            logger.log({"loss": 0.5}, step=0, stage="rollout")
            assert logger.flush(30) == 0
            assert logger.refused == {"stage_separator": 1, "metrics": 1}
            assert (logger.logged, logger.delivered) == (1, 1)
        marker = Producer({"bootstrap.servers": kafka_bootstrap})
        marker.produce(topics.events, key=run_id.encode(), value=b"marker: not avro")
        assert marker.flush(30) == 0

        def summary_of_step_0(messages: list[Any]) -> bool:
            return any(CODEC.decode_summary(m.value())["run_id"] == run_id for m in messages)

        (summary,) = read_all(kafka_bootstrap, topics.steps, summary_of_step_0, timeout_s=60.0)
        read_all(kafka_bootstrap, topics.dlq, lambda ms: len(ms) >= 1, timeout_s=60.0)
        dead = read_to_end(kafka_bootstrap, topics.dlq)  # all
    finally:
        worker.stop()
    decoded = CODEC.decode_summary(summary.value())
    assert (decoded["stage"], decoded["step"], decoded["ranks_reported"]) == ("rollout", 0, [0])
    assert [m.value() for m in dead] == [b"marker: not avro"], tail(worker.log_file, 40)
