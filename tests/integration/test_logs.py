"""Log records end to end: rank processes, Kafka, archivers and worker; diagnose, query, show.

A 4-rank run on two hosts (``node-a``: ranks 0, 1; ``node-b``: ranks 2, 3) in three phases
of 10 steps, each phase a new process per rank (:mod:`tests.integration.log_run`); the
third phase inherits a trace context from the environment, as a launcher would set it.
Every record carries its id, so the answers are compared record by record. Two archivers
(two consumer groups) keep the run, one in a local directory, one under an s3:// root on
S3Proxy; every test that reads the archive runs on each.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from rlpulse.archive.catalog import run_sql
from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers import ControlClient, Settings
from rlpulse.producers.caller.sampling import keeps_trace
from rlpulse.schemas.jsonl import RankRecord, list_rank_files, read_rank_logs
from rlpulse.schemas.topics import Topics
from tests.integration.archive_location import KINDS, ArchiveLocation
from tests.integration.log_run import (
    CHATTY_PER_STEP,
    HOSTS,
    RANKS,
    SPIKE_STEP,
    TRACES,
    chatty_traces,
    planned,
    record_id,
    reward,
    start_ranks,
)
from tests.support.s3proxy import S3Proxy
from tests.waiting import wait_for

pytestmark = pytest.mark.broker

REPO = Path(__file__).resolve().parents[2]
PHASES = ((0, 10), (10, 20), (20, 30))
LAST_STEP = 29
WAIT_S = 120.0
ENV_TRACE = uuid.uuid4().hex

SEED_QUERY = """
SELECT run_id,
       count(*) FILTER (WHERE metrics['reward_mean'].mean < 0.1) / count(*) AS share_low_reward,
       count(*) AS steps
FROM steps
WHERE stage = 'rollout' AND revision = 1 AND time > now() - INTERVAL 1 HOUR
GROUP BY run_id
ORDER BY run_id
"""


def rlpulse(*args: str, expect: int = 0, archive: ArchiveLocation | None = None) -> str:
    """``rlpulse ARGS``, with what reaching ``archive`` takes in its environment."""
    environment = os.environ if archive is None else archive.environment()
    done = subprocess.run(
        [sys.executable, "-m", "rlpulse", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
        env={**environment, "COLUMNS": "250"},
    )
    assert done.returncode == expect, (
        f"rlpulse {args}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


def iso(ns: int) -> str:
    moment = datetime.datetime.fromtimestamp(ns // 10**9, datetime.UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{ns % 10**9 // 1000:06d}Z"


def naive_utc(ns: int) -> str:
    moment = datetime.datetime.fromtimestamp(ns // 10**9, datetime.UTC)
    return f"{moment:%Y-%m-%d %H:%M:%S}.{ns % 10**9 // 1000:06d}"


def csv_ids(path: Path) -> set[str]:
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    ids = {record_id(row["message"]) for row in rows}
    assert None not in ids
    assert len(ids) == len(rows), "a record came twice"
    return {i for i in ids if i is not None}


def planned_ids(
    steps: Iterable[int], ranks: Iterable[int], keep: Callable[[Any], bool] = lambda _p: True
) -> set[str]:
    return {p.id for step in steps for rank in ranks for p in planned(rank, step) if keep(p)}


class LoggedRun:
    """The scripted run, played once per module, and the archives it left."""

    def __init__(
        self, bootstrap: str, topics: Topics, work: Path, archives: dict[str, ArchiveLocation]
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.work = work
        self.run_id = f"logs-{uuid.uuid4().hex[:8]}"
        self.archives = archives
        self.log_dir = work / "logs"
        self.phase_ends: list[int] = []
        self.pids: dict[tuple[int, int], int] = {}

    def play(self) -> None:
        for phase, steps in enumerate(PHASES):
            processes = start_ranks(
                self.run_id, steps, LAST_STEP, self.bootstrap, self.topics.prefix, self.work,
                trace_context=ENV_TRACE if phase == 2 else None,
            )  # fmt: skip
            for rank, process in enumerate(processes):
                self.pids[(phase, rank)] = process.pid
            for process in processes:
                assert process.wait(timeout=WAIT_S) == 0
            self.phase_ends.append(time.time_ns())
            time.sleep(0.05)

    def count(self, sql: str, archive: ArchiveLocation) -> int:
        return int(self.rows(sql, archive)[0][0])

    def counts(self, sql: str) -> set[int]:
        """The answers of every archive."""
        return {self.count(sql, archive) for archive in self.archives.values()}

    def rows(self, sql: str, archive: ArchiveLocation) -> list[tuple[Any, ...]]:
        con = archive.open(self.topics)
        try:
            _, rows = run_sql(con, sql, [self.run_id])
        finally:
            con.close()
        return rows

    def archive_args(self, archive: ArchiveLocation) -> list[str]:
        return ["--archive", archive.root, "--prefix", self.topics.prefix]


@pytest.fixture(scope="module")
def logged_run(
    kafka_bootstrap: str, s3proxy: S3Proxy, tmp_path_factory: pytest.TempPathFactory
) -> LoggedRun:
    from rlpulse.transport.topics import ensure_topics
    from tests.kafka import settings_at

    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}")
    ensure_topics(settings_at(kafka_bootstrap), topics, partitions=3)
    work = tmp_path_factory.mktemp("logged-run")
    archives = {
        "local": ArchiveLocation.local(work / "archive"),
        "s3": ArchiveLocation.on_s3(s3proxy),
    }
    run = LoggedRun(kafka_bootstrap, topics, work, archives)
    archivers = [
        ArchiverProcess(
            kafka_bootstrap,
            topics.prefix,
            archive.root,
            work / f"archiver-{kind}.log",
            archive.child_settings(
                **{
                    "archive.roll_s": 1,
                    "archive.audit_delay_s": 1,
                    "archive.group_id": f"{topics.prefix}-archive-{kind}",  # each its own copy
                }
            ),
        )
        for kind, archive in archives.items()
    ]
    worker = WorkerProcess(
        kafka_bootstrap, topics.prefix, work / "worker.log", rules="seed", partitions=3
    )
    control = ControlClient(
        run.run_id, settings=Settings(bootstrap=kafka_bootstrap, prefix=topics.prefix)
    )
    with contextlib.ExitStack() as running:
        for archiver in archivers:
            running.enter_context(archiver)
        running.enter_context(worker)
        worker.wait_consuming()
        run.play()
        commands: list[Any] = []

        def acked() -> bool:
            for command in control.poll(timeout_s=0.2):
                commands.append(command)
                control.ack(command, "applied", applied_at_step=command["step"] + 1)
            return bool(commands)

        wait_for(acked, "the unstable-reward command")
        control.close()
        expected_logs = RANKS * sum(len(planned(0, s)) for s in range(30))  # same on every rank
        wait_for(
            lambda: (
                run.counts("SELECT count(*) FROM logs WHERE run_id = ? AND logger = 'trainer'")
                == {expected_logs}
            ),
            "the trainer's log records in the archives",
        )
        wait_for(
            lambda: (
                run.counts(
                    "SELECT count(*) FROM logs WHERE run_id = ? AND message LIKE 'chatty warning%'"
                )
                == {RANKS * 30}
            ),
            "the chatty warnings in the archives",
        )
        wait_for(
            lambda: run.counts("SELECT count(DISTINCT step) FROM steps WHERE run_id = ?") == {30},
            "30 step summaries in the archives",
        )
        wait_for(
            lambda: run.counts("SELECT count(*) FROM acks WHERE run_id = ?") == {1},
            "the ack in the archives",
        )
        wait_for(  # each archiver audits the run in its archive and publishes it
            lambda: run.counts("SELECT count(*) FROM audits WHERE run_id = ?") == {2},
            "both archivers' audits of the run",
        )
    for archiver in archivers:
        assert archiver.process is not None, archiver.log_text()
        assert archiver.process.returncode == 0, archiver.log_text()
    return run


@pytest.fixture(params=KINDS)
def archive(request: pytest.FixtureRequest, logged_run: LoggedRun) -> ArchiveLocation:
    """One of the run's archives: the local directory, then the s3:// root."""
    return logged_run.archives[request.param]


def test_diagnose_a_time_window_a_level_and_a_host(
    logged_run: LoggedRun, archive: ArchiveLocation, tmp_path: Path
) -> None:
    start, end = logged_run.phase_ends[0], logged_run.phase_ends[1]
    output = tmp_path / "error_analysis.csv"
    printed = rlpulse(
        "diagnose", *logged_run.archive_args(archive),
        "--start_time", naive_utc(start), "--end_time", naive_utc(end), "--tz", "UTC",
        "--level", "ERROR", "--host", "node-b", "--output", str(output), archive=archive,
    )  # fmt: skip
    want = planned_ids(range(10, 20), (2, 3), lambda p: p.level in ("ERROR", "CRITICAL"))
    assert csv_ids(output) == want
    assert f"{len(want)} records" in printed
    assert "node-b" in printed and "node-a" not in printed
    assert "step <n> error on rank <n> id=<n>/<n>/<n>" in printed  # numbers folded together
    with output.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    oom = [row for row in rows if row["level"] == "ERROR" and int(row["step"]) % 2 == 0]
    assert oom and all("MemoryError: CUDA out of memory" in row["exception"] for row in oom)
    assert all(row["time"].endswith("Z") and row["host_ip"] for row in rows)


def test_diagnose_reads_the_local_files_the_same(
    logged_run: LoggedRun, archive: ArchiveLocation, tmp_path: Path
) -> None:
    start, end = logged_run.phase_ends[0], logged_run.phase_ends[1]
    from_files, from_archive = tmp_path / "files.csv", tmp_path / "archive.csv"
    window = ["--start-time", iso(start), "--end-time", iso(end), "--level", "WARN"]
    rlpulse("diagnose", "--log_dir", str(logged_run.log_dir), *window, "--output", str(from_files))
    rlpulse(
        "diagnose",
        *logged_run.archive_args(archive),
        *window,
        "--output",
        str(from_archive),
        archive=archive,
    )
    assert csv_ids(from_files) == csv_ids(from_archive)
    want = planned_ids(range(10, 20), range(RANKS), lambda p: p.level not in ("DEBUG", "INFO"))
    warnings = {f"{rank}/{step}/300" for rank in range(RANKS) for step in range(10, 20)}
    assert csv_ids(from_files) == want | warnings


def test_diagnose_a_trace_a_pid_and_a_pattern(
    logged_run: LoggedRun, archive: ArchiveLocation, tmp_path: Path
) -> None:
    traced = tmp_path / "traced.csv"
    rlpulse(
        "diagnose",
        *logged_run.archive_args(archive),
        "--trace-id",
        "trace-step-12",
        "--output",
        str(traced),
        archive=archive,
    )
    assert csv_ids(traced) == planned_ids([12], range(RANKS))  # every level, every rank and host

    inherited = tmp_path / "inherited.csv"
    rlpulse(
        "diagnose", *logged_run.archive_args(archive), "--trace_id", ENV_TRACE,
        "--level", "WARNING", "--output", str(inherited), archive=archive,
    )  # fmt: skip
    third = [s for s in range(20, 30) if s % 3 != 0]  # the others carry their own trace id
    want = planned_ids(third, range(RANKS), lambda p: p.level not in ("DEBUG", "INFO"))
    want |= {f"{rank}/{step}/300" for rank in range(RANKS) for step in range(20, 30)}
    assert csv_ids(inherited) == want

    by_pid = tmp_path / "pid.csv"
    pid = logged_run.pids[(1, 2)]
    rlpulse(
        "diagnose", *logged_run.archive_args(archive), "--pid", str(pid), "--grep", "^step ",
        "--output", str(by_pid), archive=archive,
    )  # fmt: skip
    assert csv_ids(by_pid) == planned_ids(range(10, 20), [2])


def test_query_answers_the_seed_reward_question(
    logged_run: LoggedRun, archive: ArchiveLocation
) -> None:
    printed = rlpulse(
        "query", *logged_run.archive_args(archive), "--format", "json", SEED_QUERY, archive=archive
    )
    rows = [json.loads(line) for line in printed.splitlines()]
    low = sum(1 for step in range(30) if reward(step) < 0.1)
    assert rows == [{"run_id": logged_run.run_id, "share_low_reward": low / 30, "steps": 30}]
    table = rlpulse(
        "query",
        *logged_run.archive_args(archive),
        "SELECT count(*) AS n FROM events",
        archive=archive,
    )
    assert str(RANKS * 30 + 2) in table  # every rank's metrics, run_start and run_end


def test_show_prints_the_whole_context_of_a_step(
    logged_run: LoggedRun, archive: ArchiveLocation
) -> None:
    printed = rlpulse(
        "show",
        logged_run.run_id,
        "--step",
        str(SPIKE_STEP),
        *logged_run.archive_args(archive),
        archive=archive,
    )
    assert f"run {logged_run.run_id}, step {SPIKE_STEP}" in printed
    assert "summary stage rollout revision 1: 4/4 ranks, missing none" in printed
    assert "reward_mean" in printed and "rank_time_s=1.3" in printed  # rank 3's own metrics
    for rank in range(RANKS):
        for record in planned(rank, SPIKE_STEP):
            assert f"id={record.id}" in printed
    assert "unstable-reward" in printed  # the command issued for the step
    assert "applied" in printed  # and its ack


def test_sampling_keeps_warnings_a_tenth_of_info_and_whole_traces(
    logged_run: LoggedRun, archive: ArchiveLocation
) -> None:
    chatty = "run_id = ? AND logger = 'trainer.chatty'"
    assert (
        logged_run.count(f"SELECT count(*) FROM logs WHERE {chatty} AND levelno >= 30", archive)
        == RANKS * 30
    )
    untraced = logged_run.count(
        f"SELECT count(*) FROM logs WHERE {chatty} AND message LIKE 'chatty %' "
        "AND levelno = 20 AND step < 20",
        archive,
    )
    emitted = RANKS * 20 * CHATTY_PER_STEP
    assert 0.06 * emitted <= untraced <= 0.14 * emitted, untraced  # 10 %, 5 sigma either side
    for trace in chatty_traces():
        found = logged_run.count(
            f"SELECT count(*) FROM logs WHERE {chatty} AND trace_id = '{trace}'", archive
        )
        assert found == (RANKS * 30 if keeps_trace(trace, 0.1) else 0), trace
    inherited = logged_run.count(
        f"SELECT count(*) FROM logs WHERE {chatty} AND message LIKE 'chatty %' AND levelno = 20 "
        "AND step >= 20",
        archive,
    )
    assert inherited == (RANKS * 10 * CHATTY_PER_STEP if keeps_trace(ENV_TRACE, 0.1) else 0)
    # Every process's last record carries what its filter dropped: the totals add up.
    rows = logged_run.rows(
        f"SELECT producer_id, count(*) FILTER (WHERE levelno = 20), "
        f"arg_max(sampled_out['INFO'], seq), min(step), max(step) FROM logs WHERE {chatty} "
        "GROUP BY producer_id",
        archive,
    )
    assert len(rows) == RANKS * len(PHASES)
    for _producer, kept, dropped, first, last in rows:
        assert kept + (dropped or 0) == (last - first + 1) * (CHATTY_PER_STEP + TRACES)
    rates = logged_run.rows(
        f"SELECT DISTINCT levelno, sample_rate FROM logs WHERE {chatty} ORDER BY levelno", archive
    )
    assert rates == [(20, 0.1), (30, 1.0)]


def test_audit_is_clean_and_the_archiver_published_it(
    logged_run: LoggedRun, archive: ArchiveLocation
) -> None:
    printed = rlpulse(
        "audit", "--run", logged_run.run_id, *logged_run.archive_args(archive), archive=archive
    )
    assert "0 lost, 0 duplicates" in printed
    ((ok, lost, producers),) = logged_run.rows(
        "SELECT ok, lost, producers FROM audits WHERE run_id = ? ORDER BY audited_ns DESC LIMIT 1",
        archive,
    )
    assert (ok, lost, producers) == (True, 0, RANKS * len(PHASES))


def test_local_files_hold_every_rank_s_metrics_and_records(logged_run: LoggedRun) -> None:
    files = list_rank_files(logged_run.log_dir)
    assert [(f.component, f.rank) for f in files] == [("trainer", r) for r in range(RANKS)]
    metrics = [item for item in read_rank_logs(logged_run.log_dir) if isinstance(item, RankRecord)]
    assert len(metrics) == RANKS * 30  # log record lines are not read as metrics
    assert {(m.rank, m.step) for m in metrics} == {(r, s) for r in range(RANKS) for s in range(30)}
    assert all(m.fields["hostname"] == HOSTS[m.rank] and m.fields["pid"] for m in metrics)
