"""diagnose's pure parts: times and zones, levels, folding, filters, summary, the JSONL reader."""

from __future__ import annotations

import csv
import datetime
import json
from pathlib import Path

import pytest

from rlpulse.archive.exceptions import QueryError
from rlpulse.archive.tables import tables_of
from rlpulse.offline.diagnose import (
    LogFilter,
    directory_connection,
    fold_message,
    level_number,
    parse_instant,
    select_records,
    summarize,
    time_zone,
    write_csv,
)
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.settings import load_settings
from tests.unit.test_codec import SAMPLES

EIGHT_UTC = int(datetime.datetime(2025, 10, 1, 8, tzinfo=datetime.UTC).timestamp()) * 10**9


def test_times_are_exact_instants_naive_ones_in_the_zone_given() -> None:
    assert parse_instant("2025-10-01 08:00:00", datetime.UTC) == EIGHT_UTC
    assert parse_instant("2025-10-01T08:00:00Z", time_zone("Europe/Berlin")) == EIGHT_UTC
    assert parse_instant("2025-10-01 10:00:00", time_zone("Europe/Berlin")) == EIGHT_UTC  # CEST
    assert parse_instant("2025-10-01T09:00:00+01:00", datetime.UTC) == EIGHT_UTC
    assert parse_instant("2025-10-01 08:00:00.000250", datetime.UTC) == EIGHT_UTC + 250_000
    with pytest.raises(QueryError, match="is not a time"):
        parse_instant("yesterday", datetime.UTC)
    with pytest.raises(QueryError, match="unknown time zone"):
        time_zone("Mars/Olympus")


def test_levels_and_level_aliases() -> None:
    names = ("debug", "INFO", "WARN", "warning", "ERROR", "fatal", "25")
    assert [level_number(n) for n in names] == [10, 20, 30, 30, 40, 50, 25]
    with pytest.raises(QueryError, match="unknown level"):
        level_number("LOUD")
    assert load_settings({"logging.level": "warn"}).logging.level == "WARNING"
    assert (
        load_settings({"logging.retention": "7d", "logging.rotation": "1GB"}).logging.retention
        == 7 * 86400
    )


def test_numbers_and_ids_fold_together() -> None:
    assert fold_message("step 12 took 3.5 s on rank 7") == "step <n> took <n> s on rank <n>"
    assert fold_message("request 4bf92f3577b34da6 failed") == "request <id> failed"
    assert fold_message("id 123e4567-e89b-12d3-a456-426614174000 at 0x7f3a") == "id <id> at <id>"
    assert fold_message("CUDA out of memory") == "CUDA out of memory"


def log_line(**fields: object) -> dict[str, object]:
    return {"kind": "log", **SAMPLES["LogRecord"], **fields}


def test_a_log_dir_with_rotated_files_reads_like_the_archive(tmp_path: Path) -> None:
    live = tmp_path / "verl_rollout_rank0.jsonl"
    rotated = tmp_path / "verl_rollout_rank0.jsonl.20251001T090000.000000Z"
    levels = [("INFO", 20), ("ERROR", 40), ("ERROR", 40), ("CRITICAL", 50)]
    lines = [
        log_line(timestamp_ns=EIGHT_UTC + n * 10**9, seq=n, level=lvl, levelno=no,
                 message=f"step {n} {lvl}", hostname="node-1" if n % 2 else "node-2")
        for n, (lvl, no) in enumerate(levels)
    ]  # fmt: skip
    rotated.write_text("".join(json.dumps(line) + "\n" for line in lines[:2]))
    live.write_text(
        json.dumps({"stage": "rollout", "step": 1, "reward_mean": 1.0})
        + "\n"  # a metrics line
        + "".join(json.dumps(line) + "\n" for line in lines[2:])
        + "not json\n"
    )
    logs = tables_of(Topics("x"), default_codec())["logs"]
    con, malformed = directory_connection(tmp_path, logs)
    assert [m.line for m in malformed] == [4]
    chosen = LogFilter(start_ns=EIGHT_UTC + 10**9, min_level=40, hosts=("node-1",))
    records = select_records(con, chosen, partitioned=False)
    assert [r["seq"] for r in records] == [1, 3]
    assert records[0]["time"] == "2025-10-01T08:00:01.000000Z"
    everything = select_records(con, LogFilter(grep="ERR|CRIT"), partitioned=False)
    summary = summarize(everything)
    assert summary.by_level == {"ERROR": 2, "CRITICAL": 1}
    assert summary.by_host == {"node-1 (10.0.0.7)": 2, "node-2 (10.0.0.7)": 1}
    assert (summary.first_ns, summary.last_ns) == (EIGHT_UTC + 10**9, EIGHT_UTC + 3 * 10**9)
    assert [(p.text, p.count) for p in summary.patterns] == [
        ("step <n> ERROR", 2), ("step <n> CRITICAL", 1)
    ]  # fmt: skip
    output = tmp_path / "out" / "errors.csv"
    assert write_csv(output, everything) == 3
    with output.open(newline="") as handle:
        assert [row["seq"] for row in csv.DictReader(handle)] == ["1", "2", "3"]


def test_a_bad_grep_is_refused() -> None:
    with pytest.raises(QueryError, match="not a regular expression"):
        LogFilter(grep="(").where(partitioned=True)
