"""Host clocks in the archive, without Kafka: the header's columns, files from before them, and
the order of two hosts' records (one clock 5 s behind) in diagnose, show, the run page's step
panel and the audit."""

from __future__ import annotations

import dataclasses
import datetime
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from rlpulse.archive.audit import audit_runs
from rlpulse.archive.catalog import open_archive, query_archive
from rlpulse.archive.store import ArchiveStore
from rlpulse.cli import app
from rlpulse.offline.diagnose import LogFilter, iso_utc, select_records, summarize
from rlpulse.offline.drilldown import step_context
from rlpulse.schemas import default_codec
from rlpulse.schemas.clock import CLOCK_HEADER, MAX_OFFSET_NS, corrected_ns, parse_clock_header
from rlpulse.settings import ArchiveSettings, Settings
from rlpulse.streams.archiver.buffer import PartitionBuffer
from rlpulse.ui.data import RunData
from tests.unit.test_archive import NOW_MS, TOPICS, buffered, events, flush, tables
from tests.unit.test_codec import SAMPLES

RUN = "run-clocks"
STEP = 7
TURN_NS = 100_000_000
"""Real time between two turns: far more than either host's estimate is off."""
FIRST_NS = (NOW_MS - 60_000) * 1_000_000
"""The real time of turn 0."""
TURNS = 6
HOSTS: dict[str, tuple[int, int, bytes | None]] = {
    "clock-a": (0, -120_000, b"120000/50000"),
    "clock-b": (1, -5_000_000_000, b"4999000000/40000"),
    "clock-c": (2, 0, None),
}
"""Host name: rank, how far its clock is ahead of the real time (ns), its agent's header
(clock-a's exact, clock-b's 1 ms short)."""
TURN_HOSTS = ("clock-a", "clock-b") * (TURNS // 2)
"""Who logs each turn (clock-c logs only before the step)."""


def test_the_clock_header_reads_as_offset_and_error_or_not_at_all() -> None:
    assert parse_clock_header(b"5000000000/1200") == (5_000_000_000, 1200)
    assert parse_clock_header("-3/0") == (-3, 0)
    assert parse_clock_header(b"17") == (17, 0)  # no error given
    too_far = str(MAX_OFFSET_NS + 1).encode()
    for bad in (None, b"", b"soon", b"x/1", b"5/y", b"5/-1", too_far + b"/1", b"1/" + b"9" * 30):
        assert parse_clock_header(bad) is None, bad
    assert (corrected_ns(100, None), corrected_ns(100, -30)) == (100, 70)


@pytest.mark.parametrize(
    ("headers", "columns"),
    [
        ([(CLOCK_HEADER, b"5000000000/1200")], (5_000_000_000, 1200)),
        ([], (None, None)),
        ([(CLOCK_HEADER, b"5 s/1 ms")], (None, None)),
    ],
    ids=["present", "absent", "bad"],
)
def test_events_and_log_batches_keep_the_clock_header_as_columns(
    headers: list[tuple[str, bytes]], columns: tuple[int | None, int | None]
) -> None:
    codec = default_codec()
    headers = [("rlpulse-producer", b"p-1"), *headers, ("rlpulse-seqs", b"1-3")]
    for name, record in (("events", "TrainerEvent"), ("logs", "LogBatch")):
        table = tables()[name]
        data = codec.encode(record, SAMPLES[record])
        rows, run, stamp_ms = table.rows(codec, b"k", data, 0, 9, (2, NOW_MS), headers)
        buffer = PartitionBuffer(table, 0, 0.0)
        buffer.add(rows, run, 9, len(data), stamp_ms)
        (planned,) = buffer.flush_plan()
        got = planned.table.select(["clock_offset_ns", "clock_error_ns"]).to_pylist()
        want = {"clock_offset_ns": columns[0], "clock_error_ns": columns[1]}
        assert got == [want] * planned.table.num_rows, name
    assert "clock_offset_ns" not in tables()["steps"].schema.names  # no host agent sends those


def test_files_written_before_the_clock_columns_read_as_null(tmp_path: Path) -> None:
    store = ArchiveStore(str(tmp_path))
    table = tables()["events"]
    older = pa.schema([f for f in table.schema if not f.name.startswith("clock_")])
    flush(store, buffered(dataclasses.replace(table, schema=older, host_clock=False), 0, events(0)))
    flush(store, buffered(table, 1, events(1), [(CLOCK_HEADER, b"7/1")]))
    _, rows = query_archive(
        str(tmp_path),
        TOPICS,
        "SELECT seq, clock_offset_ns, clock_error_ns FROM events ORDER BY seq",
    )
    assert rows == [(0, None, None), (1, 7, 1)]


def skewed_host_archive(root: Path) -> None:
    """Turns 0..5 of step 7, 100 ms apart, alternately by clock-a (its clock right) and
    clock-b (5 s behind): each an event and a log record ``turn <n>``, each host's with its
    agent's header; clock-c (no agent's estimate) logs once 10 s before."""
    store = ArchiveStore(str(root))
    codec = default_codec()
    for partition, (host, (rank, ahead_ns, header)) in enumerate(HOSTS.items()):
        turns = [turn for turn, by in enumerate(TURN_HOSTS) if by == host] or [-100]
        logged = [(turn, FIRST_NS + turn * TURN_NS + ahead_ns) for turn in turns]
        source = {"run_id": RUN, "rank": rank, "hostname": host, "producer_id": f"p-{host}"}
        step = STEP if turns[0] >= 0 else STEP - 1
        messages = {
            "events": [
                codec.encode("TrainerEvent", {
                    **SAMPLES["TrainerEvent"], **source, "seq": 2 * index, "step": step,
                    "world_size": 3, "timestamp_ns": stamp, "metrics": {"turn": float(turn)},
                })
                for index, (turn, stamp) in enumerate(logged)
            ],
            "logs": [
                codec.encode("LogBatch", {
                    **SAMPLES["LogBatch"], **source,
                    "entries": [{
                        **SAMPLES["LogBatch"]["entries"][0], "seq": 2 * index + 1, "step": step,
                        "timestamp_ns": stamp, "message": f"turn {turn}", "trace_id": None,
                    }],
                })
                for index, (turn, stamp) in enumerate(logged)
            ],
        }  # fmt: skip
        for name, encoded in messages.items():
            table = tables()[name]
            buffer = PartitionBuffer(table, partition, 0.0)
            for offset, data in enumerate(encoded):
                rows, run, stamp_ms = table.rows(
                    codec, RUN.encode(), data, partition, offset, (2, NOW_MS),
                    [(CLOCK_HEADER, header)] if header else [],
                )  # fmt: skip
                buffer.add(rows, run, offset, len(data), stamp_ms)
            flush(store, buffer)


def turns(messages: list[str]) -> list[int]:
    """The turn numbers of ``turn <n>`` messages, in their order."""
    return [int(found) for found in re.findall(r"\bturn (-?\d+)", "\n".join(messages))]


def test_diagnose_orders_and_selects_by_corrected_time(tmp_path: Path) -> None:
    skewed_host_archive(tmp_path)
    con = open_archive(str(tmp_path), TOPICS)
    everything = select_records(con, LogFilter(run_id=RUN), partitioned=True)
    assert turns([r["message"] for r in everything]) == [-100, *range(TURNS)]
    by_raw = sorted(everything, key=lambda r: r["timestamp_ns"])
    assert turns([r["message"] for r in by_raw]) == [-100, 1, 3, 5, 0, 2, 4]  # what it was
    turn_1 = everything[2]
    assert turn_1["clock_offset_ns"] == 4_999_000_000
    assert turn_1["time"] == iso_utc(FIRST_NS + TURN_NS - 1_000_000)  # the brokers' clock
    # From turn 1 on, by the brokers' clock: turn 2's host said 5 s before turn 1.
    from_turn_1 = LogFilter(run_id=RUN, start_ns=FIRST_NS + TURN_NS - TURN_NS // 2)
    chosen = select_records(con, from_turn_1, partitioned=True)
    assert turns([r["message"] for r in chosen]) == list(range(1, TURNS))
    summary = summarize(chosen)
    assert summary.first_ns == FIRST_NS + TURN_NS - 1_000_000
    assert summary.last_ns == FIRST_NS + 5 * TURN_NS - 1_000_000


def test_show_and_the_step_panel_list_the_step_in_the_real_order(tmp_path: Path) -> None:
    skewed_host_archive(tmp_path)
    con = open_archive(str(tmp_path), TOPICS)
    context = step_context(con, RUN, STEP, margin_s=1.0)
    assert turns([row["message"] for row in context.logs.dicts()]) == list(range(TURNS))
    assert context.window_ns == (FIRST_NS, FIRST_NS + 5 * TURN_NS - 1_000_000)
    metrics = context.metrics.dicts()
    epoch = datetime.datetime(1970, 1, 1)
    for row in metrics:  # shown on the brokers' clock, the host's timestamps kept beside
        assert row["time"] == epoch + datetime.timedelta(microseconds=row["corrected_ns"] // 1000)
    assert {row["timestamp_ns"] - row["corrected_ns"] for row in metrics} == {
        -120_000, -4_999_000_000
    }  # fmt: skip
    assert context.host_offsets() == {"clock-a": 120_000, "clock-b": 4_999_000_000}

    shown = CliRunner().invoke(
        app,
        ["show", RUN, "--step", str(STEP), "--margin", "1", "--archive", str(tmp_path),
         "--prefix", TOPICS.prefix],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert shown.exit_code == 0, shown.output
    assert turns(shown.output.splitlines()) == list(range(TURNS))
    said = " ".join(shown.output.split())  # lines wrap at the console's width
    assert "host clocks behind it: clock-a 0.1 ms, clock-b 4999.0 ms" in said

    settings = Settings(prefix=TOPICS.prefix, archive=ArchiveSettings(root=str(tmp_path)))
    data = RunData(settings)
    try:
        panel = data.step(RUN, STEP, margin_s=1.0)
    finally:
        data.close()
    assert turns([row["message"] for row in panel["logs"]]) == list(range(TURNS))
    assert panel["clocks"] == {"clock-a": 120_000, "clock-b": 4_999_000_000}


def test_the_audit_takes_each_host_s_best_estimate_and_no_other(tmp_path: Path) -> None:
    skewed_host_archive(tmp_path)
    store = ArchiveStore(str(tmp_path))
    event: dict[str, Any] = {
        **SAMPLES["TrainerEvent"], "run_id": RUN, "hostname": "clock-b", "rank": 1,
        "producer_id": "p-b-2", "step": STEP + 1, "seq": 0,
    }  # fmt: skip
    worse = [(CLOCK_HEADER, b"5100000000/900000")]
    flush(store, buffered(tables()["events"], 3, [(0, event, NOW_MS)], worse))
    (audit,) = audit_runs(open_archive(str(tmp_path), TOPICS), RUN)
    assert audit.report["clocks"] == [
        {"hostname": "clock-a", "offset_ms": 0.12, "records": 6},
        {"hostname": "clock-b", "offset_ms": 4999.0, "records": 7},
    ]  # clock-c sent no estimate: none, rather than one from the Kafka timestamps
    assert [(c.hostname, c.error_ms) for c in audit.clocks] == [
        ("clock-a", 0.05),
        ("clock-b", 0.04),
    ]
    assert "Host clocks behind the brokers' clock by 0.1..4999.0 ms" in audit.report["summary"]
    printed = CliRunner().invoke(
        app,
        ["audit", "--run", RUN, "--archive", str(tmp_path), "--prefix", TOPICS.prefix],
        env={"COLUMNS": "200"},
    )
    assert printed.exit_code == 0, printed.output
    clocks = printed.output.split("host clocks")[1]
    row = next(line for line in clocks.splitlines() if "clock-b" in line)
    assert [cell.strip() for cell in row.split("│")][2:6] == ["clock-b", "4999", "0.04", "7"], (
        printed.output
    )
