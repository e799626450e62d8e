"""The run page's pure parts: the heatmap's grid, JSON-ready values, the live tail's tables."""

from __future__ import annotations

import datetime
import math
import time
from pathlib import Path

import pyarrow as pa
from typer.testing import CliRunner

from rlpulse.archive.tables import BatchRows, tables_of
from rlpulse.cli import app
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.ui.data import MetricGrid, jsonable
from rlpulse.ui.live import _LiveTable


def _events(rows: list[tuple[int, int, dict[str, float]]], dictionary: bool) -> pa.RecordBatch:
    key_type = pa.dictionary(pa.int32(), pa.string()) if dictionary else pa.string()
    metrics = pa.array([list(m.items()) for _, _, m in rows], pa.map_(pa.string(), pa.float64()))
    if dictionary:
        keys = pa.array(metrics.keys.to_pylist()).dictionary_encode()
        metrics = pa.MapArray.from_arrays(metrics.offsets, keys.cast(key_type), metrics.items)
    return pa.RecordBatch.from_arrays(
        [pa.array([r for r, _, _ in rows], pa.int32()), pa.array([s for _, s, _ in rows]), metrics],
        names=["rank", "step", "metrics"],
    )


def test_the_grid_averages_each_cell_and_leaves_missing_cells_empty() -> None:
    for dictionary in (False, True):
        grid = MetricGrid(ranks=2, steps=2)  # 4 ranks in bins of 2, steps 10..13 in bins of 2
        rows = [
            (0, 10, {"kl": 1.0, "loss": 9.0}),
            (1, 10, {"kl": 3.0}),
            (0, 11, {"kl": math.nan}),  # not finite: left out, not averaged in
            (2, 12, {"loss": 5.0}),  # no kl: the cell stays empty
            (3, 13, {"kl": 0.5}),
            (7, 13, {"kl": 100.0}),  # a rank beyond the world: ignored
        ]
        grid.add(_events(rows, dictionary), "kl", rank_bin=2, first_step=10, step_bin=2)
        assert grid.means() == [[2.0, None], [None, 0.5]], dictionary


def test_a_metric_no_event_has_leaves_the_grid_empty() -> None:
    grid = MetricGrid(ranks=1, steps=1)
    grid.add(_events([(0, 0, {"a": 1.0})], dictionary=True), "b", 1, 0, 1)
    assert grid.means() == [[None]]


def test_values_become_json() -> None:
    when = datetime.datetime(2026, 12, 5, 9, 30, tzinfo=datetime.UTC)
    value = {"x": [1.5, math.nan, math.inf], "t": when, "b": b"ok", 3: (1, None)}
    assert jsonable(value) == {
        "x": [1.5, None, None],
        "t": "2026-12-05T09:30:00+00:00",
        "b": "ok",
        "3": [1, None],
    }


def test_the_live_table_keeps_rows_of_both_kinds_and_forgets_old_ones() -> None:
    tables = tables_of(Topics("t"), default_codec())
    steps = _LiveTable(tables["steps"])
    now_ms = int(time.time() * 1000)
    steps.add([{"run_id": "r", "step": 1, "stage": "actor"}], "r", now_ms - 60_000)
    steps.add([{"run_id": "r", "step": 2, "stage": "actor"}], "r", now_ms)
    steps.convert()
    steps.add([{"run_id": "r", "step": 3, "stage": "actor"}], "r", now_ms)
    steps.convert()
    table = steps.snapshot()
    assert table.column("step").to_pylist() == [1, 2, 3]
    assert set(table.column("run").to_pylist()) == {"r"}
    assert table.column("date").to_pylist()[0] == time.strftime("%Y-%m-%d", time.gmtime())
    steps.prune(oldest_ms=now_ms + 1, max_rows=10)  # every chunk older: all go
    assert steps.snapshot().num_rows == 0

    logs = _LiveTable(tables["logs"])
    entries = [{"message": "a", "seq": 1}, {"message": "b", "seq": 2}]
    logs.add(BatchRows({"run_id": "r", "hostname": "h"}, entries), "r", now_ms)
    logs.convert()
    logs.add(BatchRows({"run_id": "r", "hostname": "h"}, [{"message": "c", "seq": 3}]), "r", now_ms)
    logs.convert()
    logged = logs.snapshot()
    assert logged.column("message").to_pylist() == ["a", "b", "c"]
    assert logged.column("hostname").to_pylist() == ["h", "h", "h"]
    logs.prune(oldest_ms=0, max_rows=2)  # too many rows: the oldest chunk goes, whole
    assert logs.snapshot().column("message").to_pylist() == ["c"]


def test_ui_with_no_archive_and_no_live_topics_refuses_to_start(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["ui", "--archive", str(tmp_path / "none"), "--no-live"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert f"no archive at {tmp_path / 'none'} yet" in text and "nothing to show" in text
