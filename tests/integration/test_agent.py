"""The host's agent against a real broker, with real processes: what it promises, by identity.

- A rank SIGKILLed mid-run, whose run never returns to the host: every record ``log()``
  accepted reaches its topic once, sent by the agent, no successor needed; the log is gone.
- Eight ranks started at once start one agent.
- The agent SIGKILLed three times mid-run: the ranks start another each time; nothing is lost
  or repeated (the new agent reads the topics back).
- Logs it cannot read (a newer protocol; a frame of a kind it does not know) stay in place.
- Two runs on one host share one agent; another prefix on the same host gets its own.

Every agent here is started by the ranks themselves (``agent.start: auto``) and exits a second
after its last writer is gone (``tests/conftest.py`` checks that none is left).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from rlpulse.producers import EventLogger
from rlpulse.producers.delivery.agent_place import agents_under, read_json
from rlpulse.producers.delivery.agent_process import place_for
from rlpulse.producers.delivery.wal import (
    PROTOCOL,
    AckFile,
    LogMeta,
    logs_under,
    unsent_frames,
)
from rlpulse.schemas.records import LogRecord, TrainerEvent
from rlpulse.schemas.topics import Topics
from rlpulse.settings import AgentSettings, ProducerSettings
from rlpulse.transport.topics import ensure_topics
from tests.integration.killed_rank import TWO_THREADS, Accepted
from tests.integration.test_producer_faults import events_on_topic, log_records_on_topic
from tests.kafka import settings_at
from tests.waiting import wait_for

pytestmark = pytest.mark.broker

REPO = Path(__file__).resolve().parents[2]


def run_child(script: str, *args: str) -> tuple[subprocess.Popen[str], list[str]]:
    """Start ``script`` with ``args``; its stdout lines gather in the list returned (read by
    one thread only: wait for the child with ``wait``, never ``communicate``)."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True
    )
    lines: list[str] = []

    def read() -> None:
        for line in child.stdout or ():
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return child, lines


def records_of(
    bootstrap: str, topics: Topics, producer_id: str
) -> tuple[list[TrainerEvent], list[LogRecord]]:
    """The events and the text records of one producer on the topics."""
    events = [
        e for e in events_on_topic(bootstrap, topics.events) if e["producer_id"] == producer_id
    ]
    records = [
        r for r in log_records_on_topic(bootstrap, topics.logs) if r["producer_id"] == producer_id
    ]
    return events, records


def assert_each_seq_once(seqs: list[int], at_least: int) -> None:
    """Seqs 0..n-1 each once, n at least ``at_least``."""
    counts = Counter(seqs)
    twice = sorted(seq for seq, count in counts.items() if count > 1)
    missing = sorted(set(range(max(counts, default=-1) + 1)) - set(counts))
    assert not twice and not missing, f"twice: {twice[:10]}, missing: {missing[:10]}"
    assert len(counts) >= at_least, f"{len(counts)} of at least {at_least} records arrived"


def agent_log(spool: Path) -> str:
    """The log of the (one) agent kept under ``spool``."""
    [directory] = agents_under(spool)
    return (directory / "agent.log").read_text()


def test_a_killed_rank_whose_run_never_returns_loses_nothing(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """A rank logging events and records from two threads is SIGKILLed; nothing of its run
    comes back. Its agent sends the rest and deletes the log: every accepted record is on its
    topic once."""
    spool = tmp_path / "spool"
    child, lines = run_child(TWO_THREADS, kafka_bootstrap, topics.prefix, str(spool), "run-k", "60")
    try:
        wait_for(lambda: lines, "the rank to start", 60.0)

        def sent() -> int:
            logs = logs_under(spool)
            return AckFile.read(logs[0]).frames if logs else 0

        wait_for(lambda: sent() > 1000, "its agent to send", 60.0)
        time.sleep(1.0)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    killed = time.monotonic()
    accepted = Accepted([line for line in list(lines) if line.endswith("\n")])
    wait_for(lambda: not logs_under(spool), "the agent to send and delete the log", 60.0)
    print(f"the log was sent whole and deleted {time.monotonic() - killed:.2f} s after the kill")
    events, records = records_of(kafka_bootstrap, topics, accepted.producer_id)
    assert_each_seq_once(
        [e["seq"] for e in events] + [r["seq"] for r in records],
        accepted.events + accepted.records + 2,
    )
    indexes = sorted(int(e["metrics"]["index"]) for e in events)
    assert indexes == list(range(len(indexes))) and len(indexes) >= accepted.events + 1
    texts = sorted(int(r["message"].split()[1]) for r in records)
    assert texts == list(range(len(texts))) and len(texts) >= accepted.records + 1
    assert "writer of" in agent_log(spool) and "is gone" in agent_log(spool)


AT_ONCE = """
import json, sys, time
from pathlib import Path
from rlpulse.producers import EventLogger, Settings

bootstrap, prefix, spool, run_id, rank, go = sys.argv[1:7]
settings = Settings(bootstrap=bootstrap, prefix=prefix, producer={"spool_dir": Path(spool)})
logger = EventLogger(run_id, rank=int(rank), world_size=8, settings=settings)
Path(go).with_name(f"built-{rank}").touch()
while not Path(go).exists():
    time.sleep(0.001)
for step in range(20):
    logger.log({"loss": step / 10}, step)
left = logger.close(60)
print(json.dumps({"producer_id": logger.producer_id, "left": left}), flush=True)
"""


def test_eight_ranks_started_at_once_start_one_agent(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    spool, go = tmp_path / "spool", tmp_path / "go"
    ranks = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                AT_ONCE,
                kafka_bootstrap,
                topics.prefix,
                str(spool),
                "run-8",
                str(rank),
                str(go),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(8)
    ]
    built = [tmp_path / f"built-{rank}" for rank in range(8)]
    wait_for(lambda: all(path.exists() for path in built), "every rank to build its logger", 60.0)
    go.touch()
    results = []
    for rank in ranks:
        out, err = rank.communicate(timeout=120)
        assert rank.returncode == 0, out + err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert [result["left"] for result in results] == [0] * 8
    started = [line for line in agent_log(spool).splitlines() if " serves " in line]
    assert len(started) == 1, started
    for result in results:
        events, _records = records_of(kafka_bootstrap, topics, result["producer_id"])
        assert_each_seq_once([e["seq"] for e in events], 20)


RANKS_IN_THREADS = """
import json, sys, threading, time
from pathlib import Path
from rlpulse.producers import EventLogger, Settings

bootstrap, prefix, spool, seconds = sys.argv[1:5]
settings = Settings(
    bootstrap=bootstrap, prefix=prefix, producer={"spool_dir": Path(spool)},
    agent={"check_interval_s": 0.5},
)
loggers = [EventLogger("run-a", rank=r, world_size=4, settings=settings) for r in range(4)]
until = time.monotonic() + float(seconds)

def rank(logger):
    step = 0
    while time.monotonic() < until:
        logger.log({"loss": step / 10}, step)
        logger.log_record("INFO", 20, "trainer", f"step {step}")
        step += 1
        time.sleep(0.003)

threads = [threading.Thread(target=rank, args=(logger,)) for logger in loggers]
for thread in threads:
    thread.start()
print("started", flush=True)
for thread in threads:
    thread.join()
print(json.dumps([[lg.producer_id, lg.logged, lg.close(60)] for lg in loggers]), flush=True)
"""


def test_an_agent_killed_mid_run_loses_and_repeats_nothing(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Four ranks log events and records for 15 s; their agent is SIGKILLed three times. The
    ranks' watch starts another each time (``agent.check_interval_s`` 0.5 s here); it reads
    back what the killed one sent unacknowledged and sends only the rest."""
    spool = tmp_path / "spool"
    child, lines = run_child(RANKS_IN_THREADS, kafka_bootstrap, topics.prefix, str(spool), "15")
    killed: list[int] = []

    def acked() -> int:
        """The frames Kafka acknowledged, over the ranks' logs (their ``acked`` files)."""
        return sum(AckFile.read(log).frames for log in logs_under(spool))

    def sends(beyond: int) -> Callable[[], bool]:
        """Whether the agent acknowledged more than ``beyond`` frames (a condition to wait for)."""
        return lambda: acked() > beyond

    try:
        wait_for(lambda: lines, "the ranks to start", 60.0)
        for _ in range(3):

            def agent_pid() -> int | None:
                agents = agents_under(spool)
                info = read_json(agents[0] / "agent.json") if agents else None
                pid = None if info is None else info.get("pid")
                return pid if isinstance(pid, int) and pid not in killed else None

            wait_for(agent_pid, "an agent to run", 30.0)
            wait_for(sends(acked()), "the agent to send some of the ranks' frames", 30.0)
            pid = agent_pid()
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        child.wait(timeout=120)
        wait_for(lambda: lines and lines[-1].startswith("[["), "the ranks' last line", 10.0)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    ranks = json.loads(lines[-1])
    all_events = events_on_topic(kafka_bootstrap, topics.events)
    all_records = log_records_on_topic(kafka_bootstrap, topics.logs)
    for producer_id, logged, left in ranks:
        assert left == 0
        seqs = [e["seq"] for e in all_events if e["producer_id"] == producer_id]
        seqs += [r["seq"] for r in all_records if r["producer_id"] == producer_id]
        assert_each_seq_once(seqs, logged)
        assert len(seqs) == logged
    log = agent_log(spool)
    assert log.count(" serves ") == 4, log  # the first agent and three restarts
    found = [line for line in log.splitlines() if "found on the topics already" in line]
    print(f"{len(killed)} agents killed; {sum(r[1] for r in ranks)} records; " + "; ".join(found))


def test_logs_an_agent_cannot_read_stay_in_place(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """A log of a newer protocol is left whole; in a log of this protocol, the frames before
    one of a kind this release does not know are sent, it and those after it stay."""
    spool = tmp_path / "spool"
    settings = settings_at(
        kafka_bootstrap, topics, producer=ProducerSettings(spool_dir=spool),
        agent=AgentSettings(start="never"),
    )  # fmt: skip
    future_kind = EventLogger("run-p", settings=settings)
    future_kind.log({"loss": 0.0}, 0)
    future_kind.log({"loss": 0.1}, 1)
    with future_kind._lock:  # a frame a newer rlpulse writes, with its seq
        assert future_kind._writer is not None
        future_kind._writer.append(7, 2, b"a frame of a kind from the future")
        future_kind._seq = 3
    future_kind.log({"loss": 0.3}, 3)
    future_kind.close(timeout_s=0)
    newer = EventLogger("run-q", settings=settings)
    newer.log({"loss": 0.0}, 0)
    newer.close(timeout_s=0)
    meta = LogMeta.read(newer.wal_dir)
    assert meta is not None
    (newer.wal_dir / "meta.json").write_text(
        json.dumps(
            {**json.loads((newer.wal_dir / "meta.json").read_text()), "protocol": PROTOCOL + 1}
        )
    )
    agent = subprocess.run(
        [sys.executable, "-m", "rlpulse", "agent", "--bootstrap", kafka_bootstrap, "--prefix",
         topics.prefix, "--spool-dir", str(spool), "--idle-exit-s", "2"],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
    )  # fmt: skip
    assert agent.returncode == 0, agent.stdout + agent.stderr
    said = " ".join(agent.stderr.split())
    assert "frame kind 7 (seq 2) is not one this release reads" in said, said
    assert f"protocol {PROTOCOL + 1}, newer than this agent's {PROTOCOL}" in said, said
    events, _records = records_of(kafka_bootstrap, topics, future_kind.producer_id)
    assert sorted(e["seq"] for e in events) == [0, 1]
    assert unsent_frames(future_kind.wal_dir) == 2  # the unknown frame and the event after it
    assert unsent_frames(newer.wal_dir) == 1 and not (newer.wal_dir / "acked").exists()
    assert records_of(kafka_bootstrap, topics, newer.producer_id) == ([], [])
    assert place_for(settings).key in {d.name for d in agents_under(spool)}


RUN = """
import sys
from pathlib import Path
from rlpulse.producers import EventLogger, Settings

bootstrap, prefix, spool, run_id = sys.argv[1:5]
settings = Settings(bootstrap=bootstrap, prefix=prefix, producer={"spool_dir": Path(spool)})
logger = EventLogger(run_id, settings=settings)
for step in range(10):
    logger.log({"loss": step / 10}, step)
assert logger.close(60) == 0
print(logger.producer_id, flush=True)
"""


def test_two_runs_on_one_host_share_an_agent_and_another_prefix_has_its_own(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    other = Topics(prefix=f"other-{uuid.uuid4().hex[:8]}")
    ensure_topics(settings_at(kafka_bootstrap), other, partitions=3)
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", RUN, kafka_bootstrap, prefix, str(spool), run_id],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for prefix, run_id in (
            (topics.prefix, "run-1"),
            (topics.prefix, "run-2"),
            (other.prefix, "run-3"),
        )
    ]
    producers = []
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, out + err
        producers.append(out.strip())
    agents = agents_under(spool)
    assert len(agents) == 2
    prefixes = {(read_json(d / "agent.json") or {}).get("prefix"): d for d in agents}
    assert set(prefixes) == {topics.prefix, other.prefix}
    shared = (prefixes[topics.prefix] / "agent.log").read_text()
    assert "run run-1" in shared and "run run-2" in shared and "run run-3" not in shared
    for producer_id, on in zip(producers, (topics, topics, other), strict=True):
        events, _records = records_of(kafka_bootstrap, on, producer_id)
        assert sorted(e["seq"] for e in events) == list(range(10))
