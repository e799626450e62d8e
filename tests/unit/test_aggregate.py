"""``rlpulse aggregate``: per-rank JSON Lines merged into one line per merge key."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rlpulse.cli import app
from rlpulse.offline.aggregate import Aggregator, aggregate, parse_fields
from rlpulse.schemas.jsonl import RankLogWriter, RankRecord, read_rank_logs

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"


def write_two_components(directory: Path) -> None:
    """rollout logs steps 0-2, actor steps 1-3; two ranks each; both log step_time."""
    for rank in (0, 1):
        with RankLogWriter(directory, "rollout", rank, hostname=f"h{rank}") as rollout:
            for step in (0, 1, 2):
                metrics = {"reward": step + rank / 10, "step_time": 1.0}
                rollout.write(step, "rollout", metrics, timestamp_ns=step * 100 + rank)
        with RankLogWriter(directory, "actor", rank, hostname=f"h{rank}") as actor:
            for step in (1, 2, 3):
                metrics = {"kl": step / 100 + rank, "step_time": 2.0}
                actor.write(step, "actor", metrics, timestamp_ns=step * 100 + 50 + rank)


def read(directory: Path) -> list[RankRecord]:
    return [item for item in read_rank_logs(directory) if isinstance(item, RankRecord)]


def test_two_components_merge_with_nulls_for_missing_values(tmp_path: Path) -> None:
    write_two_components(tmp_path)
    rows = aggregate(read(tmp_path), merge_on=["step", "rank"], sort_by=["step", "rank"])
    assert [(row["step"], row["rank"]) for row in rows] == [
        (step, rank) for step in range(4) for rank in (0, 1)
    ]
    assert list(rows[0]) == [
        "step",
        "rank",
        "rollout/stage",
        "reward",
        "rollout/step_time",
        "rollout/timestamp_ns",
        "rollout/hostname",
        "rollout/pid",
        "actor/stage",
        "kl",
        "actor/step_time",
        "actor/timestamp_ns",
        "actor/hostname",
        "actor/pid",
    ]
    first, step1_rank1, last = rows[0], rows[3], rows[-1]
    assert first["reward"] == 0.0 and first["rollout/step_time"] == 1.0
    assert first["kl"] is None and first["actor/stage"] is None  # actor has no step 0
    assert step1_rank1["reward"] == 1.1 and step1_rank1["kl"] == 1.01
    assert step1_rank1["rollout/hostname"] == step1_rank1["actor/hostname"] == "h1"
    assert last["reward"] is None and last["rollout/timestamp_ns"] is None  # no rollout step 3
    assert last["kl"] == 1.03 and last["actor/step_time"] == 2.0


def test_sorting_by_several_fields_and_by_default_in_order_of_appearance(tmp_path: Path) -> None:
    write_two_components(tmp_path)
    records = read(tmp_path)
    by_rank = aggregate(records, merge_on=["step", "rank"], sort_by=["rank", "step"])
    assert [(row["rank"], row["step"]) for row in by_rank] == [
        (rank, step) for rank in (0, 1) for step in range(4)
    ]
    unsorted = aggregate(records, merge_on=["step", "rank"])  # timestamp order of first lines
    assert [(row["step"], row["rank"]) for row in unsorted][:3] == [(0, 0), (0, 1), (1, 0)]
    by_kl = aggregate(records, merge_on=["step", "rank"], sort_by=["kl"])
    assert [row["kl"] for row in by_kl][-2:] == [None, None]  # nulls last


def test_sort_order_of_mixed_values() -> None:
    path = Path("x_rank0.jsonl")
    values: list[Any] = [None, "b", 2, math.nan, "a", [1], -1.5]
    records = [
        RankRecord(path, i, "x", 0, "x", i, {}, None, {"step": i, "rank": 0, "v": value})
        for i, value in enumerate(values)
    ]
    rows = aggregate(records, merge_on=["step"], sort_by=["v"])
    got = [row["v"] for row in rows]
    assert got[:2] == [-1.5, 2] and math.isnan(got[2])
    assert got[3:] == ["a", "b", [1], None]


def test_a_later_line_of_the_same_key_wins_and_is_counted(tmp_path: Path) -> None:
    with RankLogWriter(tmp_path, "actor", 0) as writer:
        writer.write(1, "actor", {"kl": 0.1}, timestamp_ns=1)
        writer.write(2, "actor", {"kl": 0.2}, timestamp_ns=2)
        writer.write(1, "actor", {"kl": 0.3}, timestamp_ns=3)  # resumed: step 1 again
    aggregator = Aggregator(["step", "rank"])
    for record in read(tmp_path):
        aggregator.add(record)
    rows = aggregator.rows(["step"])
    assert [(row["step"], row["kl"]) for row in rows] == [(1, 0.3), (2, 0.2)]
    assert aggregator.overwritten == 2  # kl and timestamp_ns of step 1


def test_one_component_keeps_plain_names(tmp_path: Path) -> None:
    with RankLogWriter(tmp_path, "actor", 0) as writer:
        writer.write(1, "actor", {"kl": 0.1}, timestamp_ns=1)
    (row,) = aggregate(read(tmp_path), merge_on=["step"], sort_by=[])
    assert list(row) == ["step", "stage", "rank", "kl", "timestamp_ns", "hostname", "pid"]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="distinct fields"):
        Aggregator([])
    with pytest.raises(ValueError, match="distinct fields"):
        Aggregator(["step", "step"])
    with pytest.raises(ValueError, match=r"cannot sort by \['loss'\]"):
        aggregate([], merge_on=["step"], sort_by=["loss"])
    assert parse_fields(" step, rank ,,") == ["step", "rank"]


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, ["aggregate", *args])


def test_command_writes_the_merged_file_and_reports_bad_lines(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_two_components(logs)
    with (logs / "actor_rank1.jsonl").open("a") as handle:
        handle.write('{"stage":"actor","step":4,\n')
    output = tmp_path / "out" / "merged.jsonl"
    outcome = cli("--input-dir", str(logs), "--output-file", str(output))
    assert outcome.exit_code == 0, outcome.output
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [(row["step"], row["rank"]) for row in rows] == [
        (step, rank) for step in range(4) for rank in (0, 1)
    ]
    # The seed's fields: every line says its global step and when it was aggregated.
    assert all(row.pop("global_step") == row["step"] for row in rows)
    stamps = {row.pop("aggregated_at") for row in rows}
    assert len(stamps) == 1 and stamps.pop().endswith("+00:00")
    assert rows == aggregate(read(logs), ["step", "rank"], ["step", "rank"])
    assert f"{logs / 'actor_rank1.jsonl'}:4: not JSON" in outcome.stderr
    assert "8 rows, 16 columns" in outcome.stderr and "1 malformed lines skipped" in outcome.stderr


def test_command_to_stdout_with_other_merge_fields(tmp_path: Path) -> None:
    write_two_components(tmp_path)
    outcome = cli(
        "--input-dir", str(tmp_path), "--output-file", "-", "--merge-on", "step", "--sort-by", "kl"
    )
    assert outcome.exit_code == 0, outcome.output
    rows = [json.loads(line) for line in outcome.stdout.splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 0]  # by kl (the later rank's), nulls last
    assert "rollout/rank" in rows[0]  # rank is not a merge field: one column per component
    assert "values overwritten by a later line" in outcome.stderr


def test_command_refuses_an_unknown_sort_field(tmp_path: Path) -> None:
    write_two_components(tmp_path)
    outcome = cli("--input-dir", str(tmp_path), "--output-file", "-", "--sort-by", "loss")
    assert outcome.exit_code == 1 and "cannot sort by ['loss']" in outcome.stderr


def test_the_recorded_run_merges_into_one_line_per_step_and_rank() -> None:
    aggregator = Aggregator(["step", "rank"])
    for record in read(RUNS / "per_rank"):
        aggregator.add(record)
    rows = aggregator.rows(["step", "rank"])
    assert len(rows) == 60 * 8
    missing = next(row for row in rows if (row["step"], row["rank"]) == (33, 5))
    assert missing["reward_mean"] is None and missing["kl_divergence"] is not None
    assert aggregator.overwritten > 0  # steps 36..40 ran twice (the resumed attempt)


def test_system_samples_keep_rows_of_their_own(tmp_path: Path) -> None:
    """A rank's system samples (stage system, step = sample index) share its file."""
    with RankLogWriter(tmp_path, "trainer", 0, hostname="h0") as writer:
        for step in range(3):
            writer.write(step, "actor", {"kl": step / 10}, timestamp_ns=step * 100)
            writer.write(step, "system", {"process_cpu_seconds_total": step + 0.5},
                         timestamp_ns=step * 100 + 7)  # fmt: skip
    outcome = CliRunner().invoke(
        app, ["aggregate", "--input-dir", str(tmp_path), "--output-file", "-"]
    )
    assert outcome.exit_code == 0, outcome.output
    assert ", 0 values overwritten" in outcome.stderr
    rows = [json.loads(line) for line in outcome.stdout.splitlines()]
    assert [(r["step"], r["stage"], r["kl"], r["process_cpu_seconds_total"]) for r in rows] == [
        (0, "actor", 0.0, None),
        (0, "system", None, 0.5),
        (1, "actor", 0.1, None),
        (1, "system", None, 1.5),
        (2, "actor", 0.2, None),
        (2, "system", None, 2.5),
    ]
    assert [r["timestamp_ns"] for r in rows] == [0, 7, 100, 107, 200, 207]


def test_runs_sharing_a_log_dir_keep_rows_of_their_own(tmp_path: Path) -> None:
    """EventLogger's lines carry run_id; two runs appending to one file are not merged."""
    with RankLogWriter(tmp_path, "trainer", 0) as writer:
        for step in range(2):
            for run, kl in (("calm", 0.1), ("hot", 0.5)):
                writer.write(step, "actor", {"kl": kl}, run_id=run, attempt=0,
                             timestamp_ns=step * 10)  # fmt: skip
    aggregator = Aggregator(["step", "rank"])
    for record in read(tmp_path):
        aggregator.add(record)
    rows = aggregator.rows(["step"])
    assert [(r["step"], r["run_id"], r["kl"]) for r in rows] == [
        (0, "calm", 0.1),
        (0, "hot", 0.5),
        (1, "calm", 0.1),
        (1, "hot", 0.5),
    ]
    assert aggregator.overwritten == 0
