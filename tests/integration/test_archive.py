"""The archiver as a process: SIGKILLed while writing it keeps every record exactly once; the
audit finds a producer's missing records; retention deletes what is old, keeping where to
resume. Each test runs on a local directory and on an s3:// root on S3Proxy
(``archive_location``)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.producers import EventLogger
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.transport.clients import new_producer
from tests.integration.archive_location import ArchiveLocation
from tests.kafka import settings_at
from tests.waiting import wait_for

pytestmark = pytest.mark.broker

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 120.0


def kill_while_writing(
    archiver: ArchiverProcess, location: ArchiveLocation, done: Callable[[], bool]
) -> bool:
    """SIGKILL the archiver the moment it has a flush half written; False when done.

    Half written: temporary files (a local root), or some of a flush's objects with two or
    more still to come (an s3:// root: the upload in flight when the archiver dies may
    still complete). What a previous (killed) archiver left does not count: only new ones.
    """
    left_before = location.flushes_in_progress()
    deadline = time.monotonic() + WAIT_S
    checked_done = 0.0
    while time.monotonic() < deadline:
        if location.flushes_in_progress(missing_at_least=2) - left_before:
            archiver.kill()
            return True
        if time.monotonic() - checked_done > 1.0:
            checked_done = time.monotonic()
            if done():
                return False
        assert archiver.alive(), archiver.log_text()
    raise AssertionError(f"the archiver never wrote a file; its log:\n{archiver.log_text()}")


@pytest.mark.slow
def test_sigkill_while_writing_loses_and_repeats_nothing(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, archive_location: ArchiveLocation
) -> None:
    settings = settings_at(kafka_bootstrap, topics, producer={"spool_dir": tmp_path / "spool"})
    loggers = [  # several runs share each partition: a flush writes several files
        EventLogger(f"run-{uuid.uuid4().hex[:6]}", rank=0, settings=settings) for _ in range(12)
    ]
    for step in range(800):
        for logger in loggers:
            logger.log({"loss": step / 10}, step, "actor")
            for number in range(4):
                logger.log_record("INFO", 20, "trainer", f"step {step} record {number}")
    for logger in loggers:
        assert logger.close(timeout_s=60) == 0
    total = sum(logger.logged for logger in loggers)
    location = archive_location
    archiver = ArchiverProcess(
        kafka_bootstrap,
        topics.prefix,
        location.root,
        tmp_path / "archiver.log",
        location.child_settings(
            **{
                "archive.roll_bytes": 300_000,
                "archive.roll_s": 0.2,
                "archive.batch_max": 2000,
                "archive.instance_id": "archiver-under-test",  # a restart takes over at once
            }
        ),
    )

    def archived() -> int:
        counts = "SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM logs)"
        return int(location.query(topics, counts)[0][0])

    kills = unfinished = 0
    try:
        for _ in range(6):
            archiver.start()
            if not kill_while_writing(archiver, location, lambda: archived() >= total):
                break
            kills += 1
            time.sleep(location.settle_s)  # an upload S3Proxy had may still complete
            unfinished += bool(location.flushes_in_progress())  # the kill cut a flush short
    finally:
        archiver.stop()  # no archiver outlives a failed test
    assert kills >= 5, archiver.log_text()  # the backlog outlasted five kills
    with archiver:
        wait_for(
            lambda: archived() >= total,
            "every record in the archive",
            state=lambda: f"{archived()} of {total} archived; log:\n{archiver.log_text()}",
        )
    records = "SELECT producer_id, seq FROM events UNION ALL SELECT producer_id, seq FROM logs"
    ((count, distinct),) = location.query(
        topics, f"SELECT count(*), count(DISTINCT (producer_id, seq)) FROM ({records})"
    )
    assert (count, distinct) == (total, total)
    found = set(location.query(topics, records))
    assert found == {(lg.producer_id, seq) for lg in loggers for seq in range(lg.logged)}
    recoveries = archiver.log_text().count("an unfinished flush")
    print(f"{kills} kills, {unfinished} left a flush unfinished, {recoveries} found and redone")
    assert unfinished >= kills - 1, archiver.log_text()  # (the last may land after a rename)
    assert recoveries == unfinished, archiver.log_text()
    assert not location.flushes_in_progress()


def _event(run_id: str, producer: str, seq: int, kind: str = "metrics") -> dict[str, Any]:
    return {
        "kind": kind, "run_id": run_id, "attempt": 0, "step": seq, "stage": "actor",
        "rank": 0, "world_size": 1, "metrics": {"loss": 1.0} if kind == "metrics" else {},
        "level": None, "message": None, "tags": {}, "timestamp_ns": time.time_ns(),
        "hostname": "node-z", "pid": 7, "producer_id": producer, "seq": seq,
        "policy_version": None, "trace_id": None,
    }  # fmt: skip


def _log(run_id: str, producer: str, seq: int) -> dict[str, Any]:
    return {
        "run_id": run_id, "attempt": 0, "step": seq, "stage": "actor", "rank": 0,
        "level": "INFO", "levelno": 20, "logger": "trainer", "message": f"record {seq}",
        "exception": None, "trace_id": None, "fields": {}, "sample_rate": 1.0,
        "sampled_out": {}, "tags": {}, "timestamp_ns": time.time_ns(), "hostname": "node-z",
        "host_ip": "10.0.0.9", "pid": 7, "producer_id": producer, "seq": seq,
    }  # fmt: skip


def rlpulse(location: ArchiveLocation, *args: str) -> subprocess.CompletedProcess[str]:
    """``rlpulse ARGS --archive ROOT`` with what reaching ``location`` takes."""
    return subprocess.run(
        [sys.executable, "-m", "rlpulse", *args, "--archive", location.root],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
        env={**location.environment(), "COLUMNS": "250"},
    )


def test_audit_names_the_producer_and_range_it_lost(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, archive_location: ArchiveLocation
) -> None:
    settings = settings_at(kafka_bootstrap, topics)
    codec = default_codec()
    producer = new_producer(settings, "test")
    lossy_run, lossy = f"lossy-{uuid.uuid4().hex[:6]}", f"p-{uuid.uuid4().hex[:8]}"
    for seq in [*range(7), *range(10, 20)]:  # 7, 8 and 9 dropped on purpose
        producer.produce(
            topics.events,
            codec.encode("TrainerEvent", _event(lossy_run, lossy, seq)),
            lossy_run.encode(),
        )
    for seq in (20, 21, 22, 22, 23):  # 22 twice: a retry, harmless
        producer.produce(
            topics.logs, codec.encode("LogRecord", _log(lossy_run, lossy, seq)), lossy_run.encode()
        )
    end = _event(lossy_run, lossy, 24, "run_end")
    producer.produce(topics.events, codec.encode("TrainerEvent", end), lossy_run.encode())
    assert producer.flush(30) == 0
    clean_run = f"clean-{uuid.uuid4().hex[:6]}"
    with EventLogger(clean_run, settings=settings) as clean:
        for step in range(10):
            clean.log({"loss": 1.0}, step)
            clean.log_record("WARNING", 30, "trainer", f"step {step}")
        clean.run_end(9)
    location = archive_location
    with ArchiverProcess(
        kafka_bootstrap, topics.prefix, location.root, tmp_path / "archiver.log",
        location.child_settings(**{"archive.roll_s": 0.5, "archive.audit_delay_s": 0.5}),
    ) as archiver:  # fmt: skip
        wait_for(
            lambda: location.query(topics, "SELECT count(DISTINCT run_id) FROM audits")[0][0] == 2,
            "the archiver's audits of both runs",
        )
    failed = rlpulse(location, "audit", "--run", lossy_run, "--prefix", topics.prefix)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"Producer {lossy} (rank 0 on node-z) is missing seq 7..9." in failed.stdout
    assert "3 lost, 1 duplicates" in failed.stdout
    passed = rlpulse(location, "audit", "--run", clean_run, "--prefix", topics.prefix)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "0 lost" in passed.stdout
    everything = rlpulse(location, "audit", "--prefix", topics.prefix)
    assert everything.returncode == 1  # one of the runs lost records
    published = location.query(
        topics, "SELECT run_id, ok, lost, duplicates, gaps FROM audits ORDER BY run_id"
    )
    assert [(r, ok, lost, dup) for r, ok, lost, dup, _ in published] == sorted(
        [(clean_run, True, 0, 0), (lossy_run, False, 3, 1)]
    )
    gaps = next(row[4] for row in published if row[0] == lossy_run)
    assert gaps == [
        {"producer_id": lossy, "hostname": "node-z", "rank": 0, "first_seq": 7, "last_seq": 9}
    ]
    assert archiver.process is not None and archiver.process.returncode == 0


def test_an_archiver_fenced_by_its_instance_id_exits_and_writes_nothing_twice(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Two archivers given one ``archive.instance_id``: the first is fenced and says so."""
    settings = settings_at(kafka_bootstrap, topics)
    location = ArchiveLocation.local(tmp_path / "archive")

    def log_steps(logger: EventLogger, steps: range) -> None:
        for step in steps:
            logger.log({"loss": step / 10}, step, "actor")
        assert logger.flush(timeout_s=30) == 0

    def archived() -> tuple[int, int]:
        counts = "SELECT count(*), count(DISTINCT (producer_id, seq)) FROM events"
        return tuple(location.query(topics, counts)[0])

    archivers = [
        ArchiverProcess(
            kafka_bootstrap, topics.prefix, location.root, tmp_path / f"archiver-{n}.log",
            {"archive.roll_s": 0.3, "archive.instance_id": "the-same"},
        )
        for n in (1, 2)
    ]  # fmt: skip
    first, second = archivers
    with EventLogger(f"run-{uuid.uuid4().hex[:6]}", settings=settings) as logger:
        try:
            first.start()
            log_steps(logger, range(100))
            wait_for(lambda: archived() == (100, 100), "the first archiver's records")
            second.start()
            wait_for(lambda: not first.alive(), "the fenced archiver to exit", 60.0)
            assert first.stop() == 1, first.log_text()
            assert "fatal Kafka error" in first.log_text()
            assert "archive.instance_id" in first.log_text()
            log_steps(logger, range(100, 200))
            wait_for(
                lambda: archived() == (200, 200),
                "the second archiver's records",
                state=lambda: f"{archived()} archived; log:\n{second.log_text()}",
            )
            assert second.alive(), second.log_text()
        finally:
            for archiver in archivers:
                archiver.stop()


def test_the_archiver_prunes_old_files_but_keeps_where_to_resume(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path, archive_location: ArchiveLocation
) -> None:
    settings = settings_at(kafka_bootstrap, topics)
    run_id = f"old-{uuid.uuid4().hex[:6]}"
    location = archive_location
    retention_s = 3.0
    archiver = ArchiverProcess(
        kafka_bootstrap, topics.prefix, location.root, tmp_path / "archiver.log",
        location.child_settings(**{
            "archive.roll_s": 0.3,
            "archive.retention_days": retention_s / 86400,
            "archive.prune_interval_s": 0.5,
        }),
    )  # fmt: skip
    with archiver, EventLogger(run_id, settings=settings) as logger:
        for step in range(50):
            logger.log_record("INFO", 20, "trainer", f"old {step}", step=step)
        assert logger.flush(30) == 0
        count = "SELECT count(*) FROM logs WHERE message LIKE ?"
        wait_for(lambda: location.query(topics, count, ["old %"])[0][0] == 50, "the old records")
        time.sleep(retention_s)  # the first records age past the (3 s) retention
        for step in range(50, 60):
            logger.log_record("INFO", 20, "trainer", f"new {step}", step=step)
        assert logger.flush(30) == 0
        wait_for(lambda: location.query(topics, count, ["new %"])[0][0] == 10, "the new records")
        wait_for(lambda: location.query(topics, count, ["old %"])[0][0] == 0, "the old ones pruned")
        assert "retention: deleted" in archiver.log_text()
    # The newest flush of the partition stays however old it gets: it says where to resume.
    store = location.store()
    partitions = {name.partition for _, name in store.files(topics.logs)}
    assert len(partitions) == 1 and store.files(topics.logs)
