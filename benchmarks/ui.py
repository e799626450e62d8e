"""Run page benchmark: load time and payload of a 10,000-step, 256-rank run's page.

Writes an archive the way the archiver does (the archive's own table schemas and file
layout, :meth:`ArchiveStore.stage`/``commit``) for one run of ``--steps`` steps x ``--ranks``
ranks, two stages of ``--metrics`` metrics each (every rank's metrics events and one
StepSummary per stage and step, a command and its ack every 500 steps), then serves it with
``rlpulse ui``'s server (archive only) and opens the run's page in headless Chromium
(Playwright, Debian's ``/usr/bin/chromium``). Prints one JSON object per line:

- ``archive``: rows and bytes written, and how long that took;
- ``page``: for ``--loads`` loads of the run's page in a fresh browser page each, the time
  from navigation until every chart is drawn (``window.rlpulseReady``), first (cold: plotly.js
  not cached, DuckDB's first scans) and the rest; bytes of JSON the page fetched and of
  everything it fetched; the heatmap's grid and cell size;
- ``baseline``: the same for a small run (100 steps x 8 ranks) in the same archive and server,
  so what the size costs shows apart from the browser's and plotly.js's fixed cost;
- ``api``: each JSON answer's server time and size for the large run;
- ``target``: the issue's target (< 2 s) and whether this run met it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from figures import printer
from playwright.sync_api import sync_playwright

from rlpulse.archive.layout import FileName, relative_path
from rlpulse.archive.store import ArchiveStore
from rlpulse.archive.tables import Table, day_of, run_partition, tables_of
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.settings import ArchiveSettings, Settings
from rlpulse.ui.data import run_data
from rlpulse.ui.server import UiServer

PREFIX = "bench-ui"
STEP_S = 2.0
STAGES = ("rollout", "actor")
CHUNK_STEPS = 500


def _table(table: Table, columns: dict[str, pa.Array], rows: int) -> pa.Table:
    arrays = []
    for field in table.schema:
        if field.name in columns:
            arrays.append(columns[field.name].cast(field.type))
        else:
            arrays.append(pa.nulls(rows, type=field.type))
    return pa.Table.from_arrays(arrays, schema=table.schema)


def _metric_names(stage: str, count: int) -> list[str]:
    first = {"rollout": "reward_mean", "actor": "kl_divergence"}[stage]
    return [first, *(f"{stage}_metric_{i}" for i in range(1, count))]


class ArchiveWriter:
    """Writes one synthetic run into an archive, chunk by chunk, as the archiver lays it out."""

    def __init__(self, root: Path, run_id: str, ranks: int, metrics: int) -> None:
        self.store = ArchiveStore(str(root))
        self.tables = tables_of(Topics(PREFIX), default_codec())
        self.run_id, self.ranks, self.metrics = run_id, ranks, metrics
        self.start_ns = time.time_ns() - 10**9 * 3600
        self.offsets: dict[str, int] = {}
        self.rows = 0
        self.rng = np.random.default_rng(7)

    def _write(self, name: str, table: pa.Table, newest_ns: int) -> None:
        first = self.offsets.get(name, 0)
        last = first + table.num_rows - 1
        self.offsets[name] = last + 1
        topic = self.tables[name].topic
        file = FileName(0, first, last, 0, 1, newest_ns // 10**6)
        day = day_of(newest_ns // 10**6)
        staged = self.store.stage(
            relative_path(topic, day, run_partition(self.run_id), file), table, "zstd"
        )
        self.store.commit([staged])
        self.rows += table.num_rows

    def _stamp(self, steps: np.ndarray) -> np.ndarray:
        return self.start_ns + (steps * STEP_S * 1e9).astype(np.int64)

    def chunk(self, first_step: int, steps: int) -> None:
        """Events and summaries of steps ``first_step`` .. ``first_step + steps - 1``."""
        step = np.repeat(np.arange(first_step, first_step + steps), self.ranks)
        rank = np.tile(np.arange(self.ranks), steps)
        n = len(step)
        for stage in STAGES:
            names = _metric_names(stage, self.metrics)
            base = 0.05 + 0.00003 * step if stage == "actor" else 1.0 + 0.0001 * step
            values = base[:, None] + self.rng.normal(0.0, 0.02, (n, len(names)))
            stamps = self._stamp(step) + rank * 1_000_000
            keys = pa.array(np.tile(np.array(names, dtype=object), n), pa.string())
            offsets = pa.array(np.arange(0, n * len(names) + 1, len(names), dtype=np.int32))
            metrics = pa.MapArray.from_arrays(offsets, keys, pa.array(values.ravel()))
            events = {
                "kind": pa.array(["metrics"] * n),
                "run_id": pa.array([self.run_id] * n),
                "attempt": pa.array(np.zeros(n, dtype=np.int32)),
                "step": pa.array(step),
                "stage": pa.array([stage] * n),
                "rank": pa.array(rank.astype(np.int32)),
                "world_size": pa.array(np.full(n, self.ranks, dtype=np.int32)),
                "metrics": metrics,
                "timestamp_ns": pa.array(stamps),
                "hostname": pa.array([f"node-{r // 8}" for r in rank]),
                "pid": pa.array((1000 + rank).astype(np.int32)),
                "producer_id": pa.array([f"p{r}" for r in rank]),
                "seq": pa.array(step),
                "kafka_partition": pa.array(np.zeros(n, dtype=np.int32)),
                "kafka_offset": pa.array(np.arange(n, dtype=np.int64)),
            }
            self._write("events", _table(self.tables["events"], events, n), int(stamps.max()))
            per_step = values.reshape(steps, self.ranks, len(names))
            summaries = self._summaries(stage, names, first_step, per_step)
            self._write("steps", summaries, int(stamps.max()))

    def _summaries(
        self, stage: str, names: list[str], first_step: int, values: np.ndarray
    ) -> pa.Table:
        steps = values.shape[0]
        step = np.arange(first_step, first_step + steps)
        mean, std = values.mean(axis=1), values.std(axis=1)
        low, high = values.min(axis=1), values.max(axis=1)
        stats = pa.StructArray.from_arrays(
            [
                pa.array(np.full(steps * len(names), self.ranks, dtype=np.int32)),
                pa.array((mean * self.ranks).ravel()),
                pa.array(mean.ravel()),
                pa.array(std.ravel()),
                pa.array(low.ravel()),
                pa.array(high.ravel()),
                pa.array(values.argmin(axis=1).ravel().astype(np.int32)),
                pa.array(values.argmax(axis=1).ravel().astype(np.int32)),
                pa.array(np.zeros(steps * len(names), dtype=np.int32)),
            ],
            names=["count", "sum", "mean", "std", "min", "max", "min_rank", "max_rank",
                   "non_finite"],
        )  # fmt: skip
        keys = pa.array(np.tile(np.array(names, dtype=object), steps), pa.string())
        offsets = pa.array(np.arange(0, steps * len(names) + 1, len(names), dtype=np.int32))
        first_ns = self._stamp(step)
        last_ns = first_ns + self.ranks * 1_000_000
        reported = pa.array([list(range(self.ranks))] * steps, pa.list_(pa.int32()))
        columns = {
            "summary_id": pa.array([f"{self.run_id}/{stage}/{s}/1" for s in step]),
            "run_id": pa.array([self.run_id] * steps),
            "attempt": pa.array(np.zeros(steps, dtype=np.int32)),
            "stage": pa.array([stage] * steps),
            "step": pa.array(step),
            "revision": pa.array(np.ones(steps, dtype=np.int32)),
            "world_size": pa.array(np.full(steps, self.ranks, dtype=np.int32)),
            "ranks_reported": reported,
            "missing_ranks": pa.array([[]] * steps, pa.list_(pa.int32())),
            "metrics": pa.MapArray.from_arrays(offsets, keys, stats),
            "last_rank": pa.array(np.full(steps, self.ranks - 1, dtype=np.int32)),
            "last_rank_lag_ns": pa.array(np.full(steps, 1_000_000, dtype=np.int64)),
            "closed_by": pa.array(["complete"] * steps),
            "first_event_ns": pa.array(first_ns),
            "last_event_ns": pa.array(last_ns),
            "emitted_ns": pa.array(last_ns + 1_000_000),
            "kafka_partition": pa.array(np.zeros(steps, dtype=np.int32)),
            "kafka_offset": pa.array(np.arange(steps, dtype=np.int64)),
        }
        return _table(self.tables["steps"], columns, steps)

    def commands(self, steps: int, every: int) -> None:
        """A rule's command and its ack every ``every`` steps."""
        at = np.arange(every, steps + 1, every)
        n = len(at)
        if not n:
            return
        ids = [f"{self.run_id}-cmd-{s}" for s in at]
        action = pa.array(
            [[{"type": "scale_rollout_batch", "params": [("factor", "2")]}]] * n,
            self.tables["commands"].schema.field("actions").type,
        )
        issued = self._stamp(at)
        commands = {
            "command_id": pa.array(ids),
            "run_id": pa.array([self.run_id] * n),
            "attempt": pa.array(np.zeros(n, dtype=np.int32)),
            "stage": pa.array(["rollout"] * n),
            "step": pa.array(at),
            "origin": pa.array(["rule"] * n),
            "rule_id": pa.array(["unstable-reward"] * n),
            "dry_run": pa.array([False] * n),
            "actions": action,
            "reason": pa.array([f"var of reward_mean over 5 steps at {s} > 0.5" for s in at]),
            "issued_ns": pa.array(issued),
            "kafka_partition": pa.array(np.zeros(n, dtype=np.int32)),
            "kafka_offset": pa.array(np.arange(n, dtype=np.int64)),
        }
        self._write("commands", _table(self.tables["commands"], commands, n), int(issued[-1]))
        acks = {
            "command_id": pa.array(ids),
            "run_id": pa.array([self.run_id] * n),
            "attempt": pa.array(np.zeros(n, dtype=np.int32)),
            "status": pa.array(["applied"] * n),
            "applied_at_step": pa.array(at),
            "acked_ns": pa.array(issued + 10**8),
            "kafka_partition": pa.array(np.zeros(n, dtype=np.int32)),
            "kafka_offset": pa.array(np.arange(n, dtype=np.int64)),
        }
        self._write("acks", _table(self.tables["acks"], acks, n), int(issued[-1]) + 10**8)


def write_run(root: Path, run_id: str, steps: int, ranks: int, metrics: int) -> int:
    """Write the run; returns the rows written."""
    writer = ArchiveWriter(root, run_id, ranks, metrics)
    for first in range(1, steps + 1, CHUNK_STEPS):
        writer.chunk(first, min(CHUNK_STEPS, steps - first + 1))
    writer.commands(steps, 500 if steps >= 1000 else 25)
    return writer.rows


def measure_page(browser: Any, url: str, loads: int) -> dict[str, Any]:
    """Load ``url`` ``loads`` times (one browser context, so plotly.js is cached after the
    first); the times until every chart is drawn, and the bytes fetched."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    times, json_bytes, all_bytes = [], [], []
    heat: dict[str, Any] = {}
    for _ in range(loads):
        page = context.new_page()
        sizes: dict[str, int] = {}

        def count(response: Any, sizes: dict[str, int] = sizes) -> None:
            try:
                sizes[response.url] = len(response.body())
            except Exception:  # a redirect or an aborted response has no body
                sizes[response.url] = 0

        page.on("response", count)
        started = time.perf_counter()
        page.goto(url)
        page.wait_for_function("window.rlpulseReady === true", timeout=120_000)
        times.append(time.perf_counter() - started)
        page.wait_for_load_state("networkidle")
        json_bytes.append(sum(v for k, v in sizes.items() if "/api/" in k))
        all_bytes.append(sum(sizes.values()))
        heat = page.evaluate(
            "(() => { const h = window.rlpulse.heatmap; return {ranks: h.z.length, "
            "steps: h.steps.length, rank_bin: h.rank_bin, step_bin: h.step_bin}; })()"
        )
        points = page.evaluate("window.rlpulse.series.a.steps.length")
        page.close()
    context.close()
    return {
        "load_s_first": round(times[0], 3),
        "load_s_rest": [round(t, 3) for t in times[1:]],
        "load_s_median_rest": round(statistics.median(times[1:]), 3) if loads > 1 else None,
        "json_bytes": json_bytes[-1],
        "all_bytes_first": all_bytes[0],
        "heatmap": heat,
        "reward_points": points,
    }


def api_times(server: UiServer, run_id: str, step: int) -> list[dict[str, Any]]:
    """Each JSON answer of the run's page: server time and size."""
    calls = [
        f"run?id={run_id}",
        f"series?id={run_id}&stage=rollout&metric=reward_mean",
        f"series?id={run_id}&stage=actor&metric=kl_divergence",
        f"heatmap?id={run_id}&stage=actor&metric=kl_divergence&max_ranks=256&max_steps=700",
        f"timing?id={run_id}",
        f"commands?id={run_id}",
        f"step?id={run_id}&step={step}",
    ]
    answers = []
    for call in calls:
        started = time.perf_counter()
        with urllib.request.urlopen(f"{server.url}api/{call}", timeout=120) as response:
            body = response.read()
        answers.append(
            {
                "call": call.split("?")[0],
                "ms": round((time.perf_counter() - started) * 1000, 1),
                "bytes": len(body),
            }
        )
    return answers


def main() -> None:
    """Write the archive, serve it, load the pages, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--metrics", type=int, default=8, help="metrics per stage (2 stages)")
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    emit = printer("ui")
    with tempfile.TemporaryDirectory(prefix="rlpulse-bench-ui-") as work:
        root = Path(work) / "archive"
        started = time.perf_counter()
        rows = write_run(root, "big-run", args.steps, args.ranks, args.metrics)
        rows += write_run(root, "small-run", 100, 8, args.metrics)
        size = sum(p.stat().st_size for p in root.rglob("*.parquet"))
        emit("archive", rows=rows, bytes=size, seconds=round(time.perf_counter() - started, 1),
             steps=args.steps, ranks=args.ranks, metrics=2 * args.metrics)  # fmt: skip
        settings = Settings(prefix=PREFIX, archive=ArchiveSettings(root=str(root)))
        server = UiServer(run_data(settings, live=False), port=0)
        server.start()
        try:
            emit("api", run="big-run", answers=api_times(server, "big-run", args.steps // 2))
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=args.chromium, args=["--no-sandbox"]
                )
                small = measure_page(browser, f"{server.url}run?id=small-run", args.loads)
                emit("baseline", run="small-run", steps=100, ranks=8, **small)
                big = measure_page(browser, f"{server.url}run?id=big-run", args.loads)
                emit("page", run="big-run", steps=args.steps, ranks=args.ranks, **big)
                browser.close()
        finally:
            server.stop()
        worst = max([big["load_s_first"], *big["load_s_rest"]])
        extra = (big["load_s_median_rest"] or 0) - (small["load_s_median_rest"] or 0)
        emit(
            "target",
            load_under_s=2.0,
            worst_load_s=worst,
            met=worst < 2.0,
            over_baseline_s=round(extra, 3),
        )


if __name__ == "__main__":
    main()
