"""The archive without Kafka: file names, crash recovery, retention, tables and views, audit."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rlpulse.archive.audit import audit_runs
from rlpulse.archive.catalog import open_archive, query_archive, run_sql
from rlpulse.archive.exceptions import QueryError
from rlpulse.archive.layout import FileName, plan_resume
from rlpulse.archive.store import ArchiveStore
from rlpulse.archive.tables import Table, tables_of
from rlpulse.cli import app
from rlpulse.offline.drilldown import step_context
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.streams.archiver.buffer import PartitionBuffer
from rlpulse.streams.archiver.prune import prune
from tests.unit.test_codec import SAMPLES

TOPICS = Topics("unit")
NOW_MS = int(time.time() * 1000)
RECORDS = {
    "events": "TrainerEvent",
    "logs": "LogRecord",
    "steps": "StepSummary",
    "commands": "ControlCommand",
    "acks": "CommandAck",
    "audits": "AuditReport",
}


def tables() -> dict[str, Table]:
    return tables_of(TOPICS, default_codec())


def buffered(
    table: Table,
    partition: int,
    records: list[tuple[int, dict[str, Any], int]],
    headers: list[tuple[str, bytes]] | None = None,
) -> PartitionBuffer:
    """A buffer of (offset, record, kafka ms) encoded and read back as the archiver does.

    ``headers``: every message's (none by default).
    """
    codec = default_codec()
    buffer = PartitionBuffer(table, partition, 0.0)
    for offset, record, stamp in records:
        data = codec.encode(table.record or "", record)
        rows, run, stamp_ms = table.rows(codec, b"k", data, partition, offset, (2, stamp), headers)
        buffer.add(rows, run, offset, len(data), stamp_ms)
    return buffer


def flush(store: ArchiveStore, buffer: PartitionBuffer, renamed: int | None = None) -> None:
    """Write a buffer's flush; ``renamed``: crash after renaming that many of its files."""
    staged = [store.stage(f.relative, f.table, "zstd") for f in buffer.flush_plan()]
    store.commit(staged if renamed is None else staged[:renamed])


def test_file_names_round_trip() -> None:
    name = FileName(2, 17, 90, 1, 3, NOW_MS)
    assert FileName.parse(str(name)) == name
    assert FileName.parse(".tmp-" + str(name)) is None and FileName.parse("x.parquet") is None


def events(
    *offsets: int, run: str = "run-1", stamp: int = NOW_MS
) -> list[tuple[int, dict[str, Any], int]]:
    return [(o, {**SAMPLES["TrainerEvent"], "run_id": run, "seq": o}, stamp) for o in offsets]


def test_resume_after_the_last_complete_flush(tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path))
    table = tables()["events"]
    assert plan_resume(store.files(table.topic), 0).next_offset is None  # nothing: from the start
    flush(store, buffered(table, 0, events(0, 1, 2)))
    flush(store, buffered(table, 0, events(3, 4, run="run-1") + events(5, run="run-2")))
    plan = plan_resume(store.files(table.topic), 0)
    assert (plan.next_offset, plan.incomplete) == (6, [])
    assert plan_resume(store.files(table.topic), 1).next_offset is None


@pytest.mark.parametrize("renamed", [0, 1])
def test_a_crash_inside_a_flush_is_undone_and_redone(tmp_path: Path, renamed: int) -> None:
    """Killed after writing the temporary files (0 renamed) or between two renames (1)."""
    store = ArchiveStore(str(tmp_path))
    table = tables()["events"]
    flush(store, buffered(table, 0, events(0, 1)))
    flush(store, buffered(table, 0, events(2, run="a") + events(3, run="b")), renamed=renamed)
    plan = plan_resume(store.files(table.topic), 0)
    assert plan.next_offset == 2
    assert len(plan.incomplete) == renamed
    assert len(store.temp_files(table.topic, 0)) == 2 - renamed
    store.delete(plan.incomplete + store.temp_files(table.topic, 0))  # what the archiver does
    flush(store, buffered(table, 0, events(2, run="a") + events(3, run="b")))  # read again
    _, rows = query_archive(str(tmp_path), TOPICS, "SELECT seq FROM events ORDER BY seq")
    assert rows == [(0,), (1,), (2,), (3,)]  # each once


def test_retention_deletes_old_files_except_each_partition_s_newest_flush(tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path))
    table = tables()["events"]
    day = 86_400_000
    flush(store, buffered(table, 0, events(0, 1, stamp=NOW_MS - 3 * day)))
    flush(store, buffered(table, 0, events(2, stamp=NOW_MS)))
    flush(store, buffered(table, 1, events(0, stamp=NOW_MS - 3 * day)))  # newest of partition 1
    result = prune(store, [table.topic], NOW_MS - day)
    assert len(result.deleted) == 1 and len(result.kept_newest) == 1
    remaining = sorted((name.partition, name.first) for _, name in store.files(table.topic))
    assert remaining == [(0, 2), (1, 0)]
    assert not any(  # emptied directories are gone too
        not os.listdir(d) for d, _, _ in os.walk(tmp_path / table.topic)
    )


def test_rlpulse_archive_prune(tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path))
    table = tables()["logs"]
    old = NOW_MS - 10 * 86_400_000
    record = SAMPLES["LogRecord"]
    flush(store, buffered(table, 0, [(0, record, old), (1, record, old)]))
    flush(store, buffered(table, 0, [(2, record, old)]))
    done = subprocess.run(
        [sys.executable, "-m", "rlpulse", "archive", "prune", "--root", str(tmp_path),
         "--prefix", TOPICS.prefix, "--retention-days", "7"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "deleted 1 file(s) older than 7 days" in done.stdout
    assert [name.first for _, name in store.files(table.topic)] == [2]


def test_every_table_reads_back_through_its_view(tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path))
    for name, record in RECORDS.items():
        flush(store, buffered(tables()[name], 0, [(0, SAMPLES[record], NOW_MS)]))
    con = open_archive(str(tmp_path), TOPICS)
    for name, record in RECORDS.items():
        columns, rows = run_sql(con, f"SELECT * FROM {name}")
        (row,) = rows
        got = dict(zip(columns, row, strict=True))
        for field, value in SAMPLES[record].items():
            if not isinstance(value, dict | list):  # nested values: checked below
                assert got[field] == value, (name, field)
        assert (got["kafka_offset"], got["run"]) == (0, "run-1")
    _, rows = run_sql(con, "SELECT actions[2].params['factor'], evidence['value'] FROM commands")
    assert rows == [("2.0", 0.41)]  # a union of types becomes text
    # A string parameter is stored as itself, so the obvious filter finds it (not '"kl_..."').
    _, rows = run_sql(
        con, "SELECT count(*) FROM commands WHERE actions[1].params['tag'] = 'kl_violation'"
    )
    assert rows == [(1,)]
    _, rows = run_sql(con, "SELECT metrics['reward_mean'].mean, missing_ranks FROM steps")
    assert rows == [(1.5, [])]


def test_a_step_shows_the_commands_applied_at_it_with_their_acks(tmp_path: Path) -> None:
    """The sample command is issued for step 40 and acked applied at step 41."""
    store = ArchiveStore(str(tmp_path))
    event = {**SAMPLES["TrainerEvent"], "step": 41}
    flush(store, buffered(tables()["events"], 0, [(0, event, NOW_MS)]))
    for name in ("commands", "acks"):
        flush(store, buffered(tables()[name], 0, [(0, SAMPLES[RECORDS[name]], NOW_MS)]))
    con = open_archive(str(tmp_path), TOPICS)
    for step in (40, 41):
        context = step_context(con, "run-1", step)
        assert [row["command_id"] for row in context.commands.dicts()] == ["c-1"], step
        assert [row["command_id"] for row in context.acks.dicts()] == ["c-1"], step


def test_undecodable_messages_are_kept_as_dead_letters(tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path))
    codec = default_codec()
    for table in (tables()["logs"], tables()["dead_letters"]):
        buffer = PartitionBuffer(table, 0, 0.0)
        got, run, stamp_ms = table.rows(
            codec, b"run-9", b"\x00garbage", 0, 5, (2, NOW_MS),
            [("rlpulse-reason", b"invalid: rank 9 outside [0, 8)"), ("rlpulse-source", "e/1/2")],
        )  # fmt: skip
        buffer.add(got, run, 5, 8, stamp_ms)
        flush(store, buffer)
    _, rows = query_archive(
        str(tmp_path),
        TOPICS,
        "SELECT run_id, reason, source, value FROM dead_letters ORDER BY reason",
    )
    assert rows == [
        ("run-9", "invalid: rank 9 outside [0, 8)", "e/1/2", b"\x00garbage"),
        ("run-9", "undecodable in the archive: garbage: no single-object encoding marker",
         "unit.logs/0/5", b"\x00garbage"),
    ]  # fmt: skip
    assert query_archive(str(tmp_path), TOPICS, "SELECT count(*) FROM logs")[1] == [(0,)]


def test_the_audit_finds_gaps_duplicates_and_clock_offsets(tmp_path: Path) -> None:
    """The clock is the agent's estimate with the smallest error, not the Kafka timestamps'."""
    store = ArchiveStore(str(tmp_path))
    event = {
        **SAMPLES["TrainerEvent"],
        "producer_id": "p-a",
        "timestamp_ns": NOW_MS * 10**6 - 5 * 10**6,
    }
    log = {**SAMPLES["LogRecord"], "producer_id": "p-a", "timestamp_ns": NOW_MS * 10**6 - 9 * 10**6}
    flush(store, buffered(tables()["events"], 0, [
        (o, {**event, "seq": seq}, NOW_MS) for o, seq in enumerate([0, 1, 2, 6, 7, 7])
    ], [("rlpulse-clock", b"4000000/300000")]))  # fmt: skip
    flush(store, buffered(tables()["logs"], 0, [(0, {**log, "seq": 3}, NOW_MS)]))  # no estimate
    con = open_archive(str(tmp_path), TOPICS)
    (audit,) = audit_runs(con, "run-1")
    report = audit.report
    assert (report["ok"], report["received"], report["lost"], report["duplicates"]) == (
        False,
        7,
        2,
        1,
    )
    assert [(g["first_seq"], g["last_seq"]) for g in report["gaps"]] == [(4, 5)]
    assert report["clocks"] == [{"hostname": "node-7", "offset_ms": 4.0, "records": 6}]
    assert [(c.offset_ms, c.error_ms) for c in audit.clocks] == [(4.0, 0.3)]
    assert "Producer p-a (rank 3 on node-7) is missing seq 4..5." in report["summary"]
    assert (
        audit_runs(con, "run-unknown")[0].report["summary"]
        == "run run-unknown: no records in the archive."
    )


def test_bad_sql_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(QueryError, match="no_such_table"):
        query_archive(str(tmp_path), TOPICS, "SELECT * FROM no_such_table")


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, [*args, "--prefix", TOPICS.prefix], env={"COLUMNS": "200"})


@pytest.mark.parametrize(
    "command", [["audit"], ["diagnose"], ["query", "SELECT 1"], ["show", "r", "--step", "1"]]
)
def test_a_missing_archive_is_an_error(tmp_path: Path, command: list[str]) -> None:
    missing = tmp_path / "no" / "such" / "dir"
    outcome = cli(*command, "--archive", str(missing))
    assert outcome.exit_code == 1, outcome.output
    assert f"no archive at {missing}" in " ".join(outcome.output.split())
    assert not missing.exists()


def test_auditing_a_run_the_archive_does_not_hold_is_not_ok(tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path))
    event = {**SAMPLES["TrainerEvent"], "producer_id": "p-a", "seq": 0}
    flush(store, buffered(tables()["events"], 0, [(0, event, NOW_MS)]))
    known = cli("audit", "--archive", str(tmp_path))
    assert known.exit_code == 0, known.output
    assert f"ok run {event['run_id']}: 1 records" in known.output
    unknown = cli("audit", "--run", "no-such-run", "--archive", str(tmp_path))
    assert unknown.exit_code == 1, unknown.output
    assert "ok run" not in unknown.output
    assert "run no-such-run: no records in the archive" in " ".join(unknown.output.split())


def test_an_error_line_keeps_brackets(tmp_path: Path) -> None:
    """One-line errors are text, not rich markup: ``[x]`` is not swallowed."""
    outcome = cli("audit", "--run", "[gpu-0]", "--archive", str(tmp_path))
    assert outcome.exit_code == 1
    assert "run [gpu-0]: no records in the archive" in outcome.stderr


def test_a_log_batch_is_one_row_per_record_and_old_single_records_still_read(
    tmp_path: Path,
) -> None:
    """A LogBatch message becomes a row per record, with the batch's shared fields and the
    message's Kafka columns; a LogRecord message of an earlier release is still one row."""
    store = ArchiveStore(str(tmp_path))
    codec = default_codec()
    table = tables()["logs"]
    single = {**SAMPLES["LogRecord"], "producer_id": "p-old", "seq": 1, "message": "old"}
    shared = {k: single[k] for k in ("run_id", "attempt", "rank", "tags", "hostname")}
    shared |= {"host_ip": single["host_ip"], "pid": single["pid"], "producer_id": "p-new"}
    entries = [
        {k: single[k] for k in ("timestamp_ns", "step", "stage", "level", "levelno", "logger")}
        | {"seq": seq, "message": f"m{seq}", "exception": None, "trace_id": f"t{seq}"}
        | {"fields": {}, "sample_rate": 1.0, "sampled_out": {}}
        for seq in (3, 4, 6)
    ]
    messages = [
        (7, codec.encode("LogRecord", single)),
        (8, codec.encode("LogBatch", {**shared, "entries": entries})),
    ]
    buffer = PartitionBuffer(table, 0, 0.0)
    for offset, data in messages:
        got, run, stamp_ms = table.rows(codec, b"k", data, 0, offset, (2, NOW_MS))
        buffer.add(got, run, offset, len(data), stamp_ms)
    assert buffer.records == 4 and (buffer.first, buffer.last) == (7, 8)
    flush(store, buffer)
    _, rows = query_archive(
        str(tmp_path),
        TOPICS,
        "SELECT producer_id, seq, message, trace_id, hostname, kafka_offset FROM logs "
        "ORDER BY kafka_offset, seq",
    )
    host = single["hostname"]
    assert rows == [
        ("p-old", 1, "old", single["trace_id"], host, 7),
        ("p-new", 3, "m3", "t3", host, 8),
        ("p-new", 4, "m4", "t4", host, 8),
        ("p-new", 6, "m6", "t6", host, 8),
    ]


def test_readers_read_only_archive_files(tmp_path: Path) -> None:
    """Strays beside the files (an object store's directory markers, notes) are never read."""
    store = ArchiveStore(str(tmp_path))
    table = tables()["events"]
    flush(store, buffered(table, 0, events(0, 1, 2)))
    (run_dir,) = (tmp_path / table.topic).glob("date=*/run=*")
    (run_dir / "README.txt").write_text("not Parquet")
    (run_dir.parent / "run=empty").mkdir()
    (tmp_path / table.topic / "date=2020-01-01").mkdir()  # a prefix retention emptied
    _, rows = query_archive(str(tmp_path), TOPICS, "SELECT seq, run FROM events ORDER BY seq")
    assert rows == [(0, "run-1"), (1, "run-1"), (2, "run-1")]


def test_an_unreachable_object_store_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    port = closed.getsockname()[1]
    monkeypatch.setenv("RLPULSE_ARCHIVE__S3_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("RLPULSE_ARCHIVE__S3_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("RLPULSE_ARCHIVE__S3_SECRET_ACCESS_KEY", "secret")
    with closed:
        outcome = cli("query", "SELECT 1", "--archive", "s3://bucket/rlpulse")
    assert outcome.exit_code == 1, outcome.output
    assert "cannot reach the archive at s3://bucket/rlpulse" in " ".join(outcome.output.split())
    assert outcome.exception is None or isinstance(outcome.exception, SystemExit)


def test_an_archive_root_that_cannot_be_written_is_refused_at_start(tmp_path: Path) -> None:
    not_a_directory = tmp_path / "archive"
    not_a_directory.write_text("a file where the archive should be")
    outcome = cli("archive", "--root", str(not_a_directory), "--bootstrap", "127.0.0.1:1")
    assert outcome.exit_code == 1, outcome.output
    said = " ".join(outcome.output.split())
    assert f"cannot write to the archive at {not_a_directory}" in said  # not a Kafka error
