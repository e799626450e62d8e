"""``rlpulse spool list``: the write-ahead logs real loggers left, without a broker.

Each log here was written by an :class:`EventLogger` whose broker is not there and whose host
runs no agent (``agent.start: never``), so nothing is ever acknowledged: a child process that
logs and waits (live), the same child SIGKILLed (dead), a logger of this process that closed
with its records unsent (dead, its process alive), and a logger that says it runs on another
host (not listed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlpulse.cli import app
from rlpulse.producers import EventLogger, Settings
from rlpulse.producers.delivery.spool import (
    DEAD,
    LIVE,
    SpoolLog,
    host_name,
    list_spool,
    send_spool,
)
from rlpulse.producers.delivery.wal import SHIP_LOCK_NAME, LogMeta, WalClaim
from rlpulse.settings import AgentSettings, ProducerSettings

UNREACHABLE = "127.0.0.1:1"

WRITER = """
import sys, time
from pathlib import Path
from rlpulse.producers import EventLogger, Settings

spool, run_id, events, records = sys.argv[1:5]
settings = Settings(
    bootstrap="127.0.0.1:1", prefix="unit", producer={"spool_dir": Path(spool)},
    agent={"start": "never"},
)
logger = EventLogger(run_id, settings=settings)
for step in range(int(events)):
    logger.log({"loss": step / 10}, step)
for number in range(int(records)):
    logger.log_record("INFO", 20, "trainer", f"record {number}")
print(logger.producer_id, flush=True)
time.sleep(600)
"""


def unreachable(spool: Path, hostname: str | None = None) -> Settings:
    producer = ProducerSettings(spool_dir=spool, close_timeout_s=0.1, hostname=hostname)
    agent = AgentSettings(start="never")
    return Settings(bootstrap=UNREACHABLE, prefix="unit", producer=producer, agent=agent)


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    return tmp_path / "spool"


@pytest.fixture
def writer(spool: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A child process that logged 7 events and 30 records of run-a and waits; its producer id."""
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(spool), "run-a", "7", "30"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        producer_id = child.stdout.readline().strip()
        assert producer_id, "the writer said nothing"
        yield child, producer_id
    finally:
        child.kill()
        child.wait()


def closed_unsent(spool: Path, run_id: str, hostname: str | None = None) -> EventLogger:
    """A logger of this process that logged 3 events and 2 records and closed, all unsent."""
    logger = EventLogger(run_id, settings=unreachable(spool, hostname))
    for step in range(3):
        logger.log({"loss": 1.0}, step)
    logger.log_record("WARNING", 30, "trainer", "one")
    logger.log_record("WARNING", 30, "trainer", "two")
    assert logger.close(0.1) == 5
    return logger


def only(logs: tuple[SpoolLog, ...], producer_id: str) -> SpoolLog:
    [found] = [spooled for spooled in logs if spooled.producer_id == producer_id]
    return found


def test_a_live_producer_is_listed_live_and_the_same_one_killed_dead(
    spool: Path, writer: tuple[subprocess.Popen[str], str]
) -> None:
    child, producer_id = writer
    host = host_name(unreachable(spool))
    live = only(list_spool(spool, host).logs, producer_id)
    assert (live.run_id, live.host, live.pid, live.sender) == ("run-a", host, child.pid, None)
    assert (live.state, live.events, live.records) == (LIVE, 7, 30)
    assert live.disk_bytes >= Settings().producer.spool_file_bytes  # a segment, reserved whole
    child.send_signal(signal.SIGKILL)
    child.wait()
    listing = list_spool(spool, host)
    dead = only(listing.logs, producer_id)
    assert (dead.state, dead.pid, dead.sender, dead.events, dead.records) == (
        DEAD, child.pid, None, 7, 30,
    )  # fmt: skip
    assert listing.unsent == (dead,) and listing.held == ()
    assert dead.created_ns is not None and dead.age_s(dead.created_ns + 2 * 10**9) == 2.0


def test_a_closed_logger_s_unsent_log_is_dead_and_its_process_alive(spool: Path) -> None:
    logger = closed_unsent(spool, "run-b")
    listing = list_spool(spool, logger.hostname)
    spooled = only(listing.logs, logger.producer_id)
    assert (spooled.state, spooled.pid, spooled.sender) == (DEAD, os.getpid(), None)
    assert (spooled.events, spooled.records, spooled.path) == (3, 2, logger.wal_dir)


def test_a_log_a_sender_holds_is_listed_with_the_sender_s_pid(
    spool: Path, writer: tuple[subprocess.Popen[str], str]
) -> None:
    _child, producer_id = writer
    host = host_name(unreachable(spool))
    [directory] = [s.path for s in list_spool(spool, host).logs]
    claim = WalClaim.take(directory, SHIP_LOCK_NAME)  # as the host's agent holds it
    assert claim is not None
    try:
        listing = list_spool(spool, host)
        assert only(listing.logs, producer_id).sender == os.getpid()
        assert listing.unsent == () and len(listing.held) == 1
    finally:
        claim.release()
    assert only(list_spool(spool, host).logs, producer_id).sender is None


def test_runs_are_listed_apart_and_other_hosts_logs_only_counted(spool: Path) -> None:
    here = [closed_unsent(spool, "run-c"), closed_unsent(spool, "run-c")]
    elsewhere = closed_unsent(spool, "run-d")
    other_host = closed_unsent(spool, "run-c", hostname="node-elsewhere")
    host = here[0].hostname
    listing = list_spool(spool, host)
    assert {run: len(logs) for run, logs in listing.runs.items()} == {"run-c": 2, "run-d": 1}
    assert listing.other_hosts == 1
    assert other_host.producer_id not in {s.producer_id for s in listing.logs}
    one_run = list_spool(spool, host, run_id="run-c")
    assert sorted(s.producer_id for s in one_run.logs) == sorted(h.producer_id for h in here)
    assert elsewhere.producer_id not in {s.producer_id for s in one_run.logs}
    assert list_spool(spool, "node-elsewhere").other_hosts == 3
    assert list_spool(spool / "nothing-here", host).logs == ()


def test_spool_send_leaves_other_hosts_logs_alone(spool: Path) -> None:
    """Their writers may be alive there: no claim is taken, no client made, nothing sent."""
    other_host = closed_unsent(spool, "run-g", hostname="node-elsewhere")
    settings = unreachable(spool)
    report = send_spool(spool, settings, host=host_name(settings), timeout_s=1.0)
    assert (report.other_hosts, report.logs, report.delivered, report.kept) == (1, 0, 0, [])
    assert list_spool(spool, "node-elsewhere").logs[0].path == other_host.wal_dir


def test_a_log_without_its_meta_is_listed_from_its_path(spool: Path) -> None:
    logger = closed_unsent(spool, "run-e")
    (logger.wal_dir / "meta.json").unlink()
    assert LogMeta.read(logger.wal_dir) is None
    spooled = only(list_spool(spool, logger.hostname).logs, logger.producer_id)
    assert (spooled.run_id, spooled.host, spooled.pid, spooled.created_ns) == (
        "run-e", None, None, None,
    )  # fmt: skip
    assert (spooled.state, spooled.events, spooled.records) == (DEAD, 3, 2)


def test_spool_list_prints_every_log_and_what_send_would_send(
    spool: Path, writer: tuple[subprocess.Popen[str], str]
) -> None:
    _child, live_id = writer
    dead = closed_unsent(spool, "run-f")
    env = {"COLUMNS": "80", "RLPULSE_BOOTSTRAP": UNREACHABLE}
    listed = CliRunner().invoke(
        app, ["spool", "list", "--spool-dir", str(spool), "--json"], env=env
    )
    assert listed.exit_code == 0, listed.output
    documents = [json.loads(line) for line in listed.stdout.splitlines()]
    rows = {row["producer_id"]: row for row in documents if "producer_id" in row}
    [agent] = [row for row in documents if "agent" in row]
    assert (agent["alive"], agent["prefix"], agent["logs"]) == (False, "unit", 0)
    assert set(rows) == {live_id, dead.producer_id}
    assert (rows[live_id]["state"], rows[live_id]["sent_by_spool_send"]) == (LIVE, True)
    assert (rows[dead.producer_id]["events"], rows[dead.producer_id]["records"]) == (3, 2)
    assert rows[dead.producer_id]["sent_by_spool_send"] is True
    table = CliRunner().invoke(app, ["spool", "list", "--spool-dir", str(spool)], env=env)
    assert table.exit_code == 0, table.output
    text = " ".join(table.stdout.split())
    assert "2 log(s) of 2 run(s)" in text
    assert "10 event(s) and 32 record(s) not acknowledged by Kafka" in text
    assert "2 log(s) no agent sends (42 record(s)): `rlpulse spool send` sends them" in text
    assert "run-a" in text and "run-f" in text and "live" in text and "dead" in text
    (spool / "empty").mkdir()
    empty = CliRunner().invoke(app, ["spool", "list", "--spool-dir", str(spool / "empty")], env=env)
    assert empty.exit_code == 0 and "nothing waits under" in empty.stdout
    # A --spool-dir that does not exist is a typo, not an empty spool.
    typo = CliRunner().invoke(app, ["spool", "list", "--spool-dir", str(spool / "none")], env=env)
    assert typo.exit_code == 1 and f"no spool at {spool / 'none'}" in " ".join(typo.output.split())
    # Sending a run that has no log here says so and fails; sending nothing at all does not.
    unknown = CliRunner().invoke(
        app, ["spool", "send", "--spool-dir", str(spool / "empty"), "--run", "nope"], env=env
    )
    assert unknown.exit_code == 1 and "nothing of run 'nope' waits" in unknown.output
    idle = CliRunner().invoke(app, ["spool", "send", "--spool-dir", str(spool / "empty")], env=env)
    assert idle.exit_code == 0 and "nothing sent" in idle.stdout
