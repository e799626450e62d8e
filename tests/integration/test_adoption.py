"""What a SIGKILLed trainer left is sent by the next process of its run on the host, always.

A child process logs 4,000 text records and 400 events with librdkafka holding them (a linger
of 60 s: none of them is sent) and is SIGKILLed; its write-ahead log holds them all. The next
process of the run on the host then adopts the log from its start, on a thread of its own,
and its ``close(60)`` returns only once the adopted log was delivered too:

- the next process logs one event and closes;
- the next process never logs, and closes;
- two next processes (sibling ranks) start at once: exactly one of them claims the log;
- no process of the run comes back: ``rlpulse spool send`` sends it, and leaves alone the log
  of a live process beside it.

Each time every event and record of the dead producer is on its topic exactly once (its seqs
0..4,399, by identity), and no write-ahead log of it is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from rlpulse.producers.delivery.wal import logs_under
from rlpulse.schemas.topics import Topics
from tests.integration.test_producer_faults import events_on_topic, log_records_on_topic

pytestmark = pytest.mark.broker

REPO = Path(__file__).resolve().parents[2]

EVENTS = 400
RECORDS = 4_000

DYING = """
import sys, time
from pathlib import Path
from rlpulse.producers import EventLogger, Settings

bootstrap, prefix, spool, run_id, events, records = sys.argv[1:7]
settings = Settings(  # librdkafka holds every record for 60 s: none is sent before the kill
    bootstrap=bootstrap, prefix=prefix,
    producer={"spool_dir": Path(spool), "linger_ms": 60_000, "delivery_timeout_s": 130},
)
logger = EventLogger(run_id, settings=settings)
per_event = int(records) // int(events)
for step in range(int(events)):
    logger.log({"loss": step / 10}, step, "actor")
    for number in range(per_event):
        logger.log_record("INFO", 20, "trainer", f"step {step} record {number}", step=step)
print(logger.producer_id, flush=True)
time.sleep(600)
"""

NEXT = """
import json, sys, time
from pathlib import Path
from rlpulse.producers import EventLogger, Settings

bootstrap, prefix, spool, run_id, logs = sys.argv[1:6]
settings = Settings(bootstrap=bootstrap, prefix=prefix, producer={"spool_dir": Path(spool)})
logger = EventLogger(run_id, rank=1, world_size=2, settings=settings)
if logs == "yes":
    logger.log({"restarted": 1.0}, 0, "actor")
left = logger.close(60)
print(json.dumps({"left": left, "adopted_left": logger.adopted_left, "replayed": logger.replayed}))
"""


def logging_producer(
    bootstrap: str, topics: Topics, spool: Path, run_id: str
) -> tuple[subprocess.Popen[str], str]:
    """Run DYING until it logged everything (it then waits, holding its log); it, its producer id.

    The caller ends it (SIGKILL).
    """
    child = subprocess.Popen(
        [sys.executable, "-c", DYING, bootstrap, topics.prefix, str(spool), run_id,
         str(EVENTS), str(RECORDS)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        producer_id = child.stdout.readline().strip()
        assert producer_id, "the dying process said nothing"
    except BaseException:
        child.send_signal(signal.SIGKILL)
        child.wait()
        raise
    return child, producer_id


def killed_producer(bootstrap: str, topics: Topics, spool: Path, run_id: str) -> str:
    """Run DYING until it logged everything, SIGKILL it; its producer id."""
    child, producer_id = logging_producer(bootstrap, topics, spool, run_id)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert len(logs_under(spool)) == 1
    return producer_id


def next_process(
    bootstrap: str, topics: Topics, spool: Path, run_id: str, logs: bool
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", NEXT, bootstrap, topics.prefix, str(spool), run_id,
         "yes" if logs else "no"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def outcome(process: subprocess.Popen[str]) -> dict[str, int]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, out + err
    result: dict[str, int] = json.loads(out.strip().splitlines()[-1])
    return result


def assert_sent_once(
    bootstrap: str, topics: Topics, producer_id: str, spool: Path, left: Sequence[Path] = ()
) -> None:
    """Every seq of the dead producer on its topic once; no log but ``left`` on the host."""
    events = [
        e for e in events_on_topic(bootstrap, topics.events) if e["producer_id"] == producer_id
    ]
    records = [
        r for r in log_records_on_topic(bootstrap, topics.logs) if r["producer_id"] == producer_id
    ]
    seqs = Counter([e["seq"] for e in events] + [r["seq"] for r in records])
    twice = sorted(seq for seq, count in seqs.items() if count > 1)
    missing = sorted(set(range(EVENTS + RECORDS)) - set(seqs))
    assert not twice and not missing, (
        f"twice: {twice[:20]}, missing: {missing[:20]} ({len(missing)})"
    )
    assert len(events) == EVENTS and len(records) == RECORDS
    assert logs_under(spool) == sorted(left), f"write-ahead logs left: {logs_under(spool)}"


@pytest.mark.parametrize("logs", [True, False], ids=["logs-one-event", "never-logs"])
def test_the_next_process_sends_what_a_killed_one_left_before_its_close_returns(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, logs: bool
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    spool = tmp_path / "spool"
    dead = killed_producer(kafka_bootstrap, topics, spool, run_id)
    result = outcome(next_process(kafka_bootstrap, topics, spool, run_id, logs))
    assert result == {"left": 0, "adopted_left": 0, "replayed": EVENTS + RECORDS}
    assert_sent_once(kafka_bootstrap, topics, dead, spool)


def test_two_siblings_looking_at_once_send_the_log_once(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    spool = tmp_path / "spool"
    dead = killed_producer(kafka_bootstrap, topics, spool, run_id)
    siblings = [next_process(kafka_bootstrap, topics, spool, run_id, logs=True) for _ in range(2)]
    results = [outcome(sibling) for sibling in siblings]
    assert sorted(r["replayed"] for r in results) == [0, EVENTS + RECORDS], results
    assert all(r["left"] == 0 and r["adopted_left"] == 0 for r in results), results
    assert_sent_once(kafka_bootstrap, topics, dead, spool)


def rlpulse(*args: str) -> str:
    """``rlpulse ARGS`` of this checkout; its output (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, "-m", "rlpulse", *args],
        capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
        env={**os.environ, "COLUMNS": "250"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_spool_send_sends_a_killed_process_s_log_once_and_never_a_live_one(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """The live process beside it logs to the same topics through a broker that is not there:
    whatever of it reached the topics, ``rlpulse spool send`` would have sent."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    spool = tmp_path / "spool"
    dead = killed_producer(kafka_bootstrap, topics, spool, run_id)
    live, alive = logging_producer("127.0.0.1:1", topics, spool, f"live-{run_id}")
    try:
        [live_log] = [path for path in logs_under(spool) if path.name == alive]
        listed = rlpulse("spool", "list", "--json", "--spool-dir", str(spool))
        rows = {row["producer_id"]: row for row in map(json.loads, listed.splitlines())}
        assert {producer: row["state"] for producer, row in rows.items()} == {
            dead: "dead", alive: "live"
        }  # fmt: skip
        assert (rows[dead]["events"], rows[dead]["records"]) == (EVENTS, RECORDS)
        sent = rlpulse("spool", "send", "--spool-dir", str(spool), "--bootstrap", kafka_bootstrap)
        assert f"sent {EVENTS + RECORDS} record(s) from 1 write-ahead log(s)" in sent, sent
        assert "skipped 1 log(s) held by a live process" in sent, sent
        assert_sent_once(kafka_bootstrap, topics, dead, spool, left=[live_log])
        assert live.poll() is None, "the live process died"
        on_topics = [e["producer_id"] for e in events_on_topic(kafka_bootstrap, topics.events)]
        on_topics += [r["producer_id"] for r in log_records_on_topic(kafka_bootstrap, topics.logs)]
        assert alive not in on_topics
        again = rlpulse("spool", "list", "--json", "--spool-dir", str(spool))
        assert [json.loads(row)["producer_id"] for row in again.splitlines()] == [alive]
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait()
