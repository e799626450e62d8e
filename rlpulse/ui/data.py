"""What the run page shows, as plain values: the queries behind every chart and panel.

:class:`RunData` answers over one DuckDB connection that sees the archive
(:func:`~rlpulse.archive.catalog.open_archive`, reopened every ``refresh_s`` so new rolls show)
and the live tail's rows (:class:`~rlpulse.ui.live.LiveTail`) as one set of views, in the
schema ``ui`` ahead of the archive's on the search path: ``steps`` there is the archive's
``steps`` plus the live rows. A record in both is read twice, so every query is written to
be indifferent to duplicates: the latest revision of a step, one row per command id, one per
rank and time of a step's events and log records, means in the heatmap.

Every method returns JSON-ready values (non-finite floats become ``None``, times ISO text)
and raises :class:`~rlpulse.ui.exceptions.NotFoundError` for a run or step the data does
not have.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import math
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any, Final

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from rlpulse.archive.catalog import open_archive, run_sql, table_dataset
from rlpulse.archive.exceptions import ArchiveError, QueryError
from rlpulse.archive.store import ArchiveStore
from rlpulse.archive.tables import run_partition, tables_of
from rlpulse.offline.drilldown import step_context
from rlpulse.offline.stacks import (
    CAPTURE_QUERY,
    SILENCE_WORDS,
    capture_parameters,
    describe_groups,
    group_ranks,
    newest_capture,
)
from rlpulse.offline.step_samples import step_samples
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.ui.exceptions import NotFoundError
from rlpulse.ui.live import LIVE_TABLES, LiveTail

__all__ = ["MetricGrid", "RunData", "jsonable", "run_data"]

log = logging.getLogger(__name__)

_LEVEL_ORDER: Final = {"CRITICAL": 0, "FATAL": 0, "ERROR": 1, "WARNING": 2, "WARN": 2}
_RUN: Final = "run = ? AND run_id = ?"
_MAP_KEYS: Final = "metrics.key_value.key"
_HEATMAPS_KEPT: Final = 32


def jsonable(value: Any) -> Any:
    """``value`` with NaN and infinities as None, times as ISO text, maps as dicts."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def _finite(values: Iterable[float | None]) -> list[float | None]:
    """The values to 6 significant digits (half the bytes), None where not finite."""
    return [
        float(f"{value:.6g}") if value is not None and math.isfinite(value) else None
        for value in values
    ]


class MetricGrid:
    """Sums and counts of one metric's values on a ranks x steps grid (the heatmap's cells)."""

    def __init__(self, ranks: int, steps: int) -> None:
        self.ranks, self.steps = ranks, steps
        self.sums = np.zeros(ranks * steps)
        self.counts = np.zeros(ranks * steps, dtype=np.int64)

    def add(
        self, batch: pa.RecordBatch, metric: str, rank_bin: int, first_step: int, step_bin: int
    ) -> None:
        """Add the ``metric`` values of a batch of events (columns rank, step, metrics)."""
        if not batch.num_rows:
            return
        metrics = batch.column("metrics")
        keys = metrics.keys
        if pa.types.is_dictionary(keys.type):
            code = keys.dictionary.index(metric).as_py()
            if code < 0:
                return
            mask = pc.equal(keys.indices, code)
        else:
            mask = pc.equal(keys, metric)
        mask_np = mask.to_numpy(zero_copy_only=False)
        sizes = np.diff(metrics.offsets.to_numpy())
        rows = np.repeat(np.arange(len(metrics)), sizes)[mask_np]
        values = metrics.items.to_numpy(zero_copy_only=False)[mask_np]
        ranks = batch.column("rank").to_numpy(zero_copy_only=False)[rows] // rank_bin
        steps = (batch.column("step").to_numpy(zero_copy_only=False)[rows] - first_step) // step_bin
        keep = np.isfinite(values) & (ranks >= 0) & (ranks < self.ranks)
        keep &= (steps >= 0) & (steps < self.steps)
        cells = ranks[keep] * self.steps + steps[keep]
        size = self.ranks * self.steps
        self.sums += np.bincount(cells, weights=values[keep], minlength=size)
        self.counts += np.bincount(cells, minlength=size)

    def means(self) -> list[list[float | None]]:
        """Each cell's mean (4 significant digits: a colour needs no more), None if empty."""
        with np.errstate(invalid="ignore", divide="ignore"):
            means = self.sums / self.counts
        return [
            [float(f"{v:.4g}") if c else None for v, c in zip(row, counts, strict=True)]
            for row, counts in zip(
                means.reshape(self.ranks, self.steps).tolist(),
                self.counts.reshape(self.ranks, self.steps).tolist(),
                strict=True,
            )
        ]


class RunData:
    """The run page's queries over the archive and the live tail (see the module docstring)."""

    def __init__(
        self, settings: Settings, live: LiveTail | None = None, refresh_s: float = 10.0
    ) -> None:
        self.settings = settings
        self.root = settings.archive_root
        self.topics = Topics(settings.prefix)
        self.live = live
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._opened = 0.0
        self._tables = tables_of(self.topics, default_codec())
        self._events: ds.Dataset | pa.Table = pa.table({})
        self._live_events: pa.Table | None = None
        self._archived: tuple[int, str] = (0, "")
        self._events_version: tuple[int, str, int] = (0, "", 0)
        self._heatmaps: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._live_seen = -1
        """The live tail's message count when its rows were last registered."""
        self._nothing = tempfile.mkdtemp(prefix="rlpulse-ui-no-archive-")
        """An empty directory: the archive's views with no rows, while the archive is down."""

    # -- the connection ----------------------------------------------------------------

    def archive_problem(self) -> str | None:
        """Why the archive shows nothing, in one sentence; None when it is there."""
        instead = (
            "only the live topics' last minutes are shown"
            if self.live is not None
            else "the live topics are not read either (--no-live): nothing to show"
        )
        try:
            if not ArchiveStore(self.root, self.settings.archive).exists():
                return (
                    f"no archive at {self.root} yet (`rlpulse archive` writes it once it "
                    f"has records): {instead}"
                )
        except (ArchiveError, OSError) as exc:
            return f"{exc}: {instead}"
        return None

    def live_problem(self) -> str | None:
        """Why the live topics show nothing, in one sentence; None while they are read."""
        if self.live is None:
            return "live topics not read (--no-live): the archive only"
        return self.live.error

    def _connection(self) -> duckdb.DuckDBPyConnection:
        now = time.monotonic()
        if self._con is None or now - self._opened > self.refresh_s:
            if self._con is not None:
                self._con.close()
            try:
                self._con = open_archive(self.root, self.topics, options=self.settings.archive)
                store = ArchiveStore(self.root, self.settings.archive)
                self._events = table_dataset(store, self._tables["events"], (_MAP_KEYS,))
            except (ArchiveError, OSError) as exc:
                # The live topics still answer; archive_problem() tells the page why the
                # history is missing, and the archive is tried again at the next refresh.
                log.warning("ui: %s; showing the live topics only", exc)
                self._con = open_archive(self._nothing, self.topics)
                self._events = pa.table({})
            self._con.execute("CREATE SCHEMA ui")
            self._opened = now
            files = self._events.files if isinstance(self._events, ds.FileSystemDataset) else []
            self._archived = (len(files), files[-1] if files else "")
            self._live_seen = -1  # the new connection has no views yet
        con = self._con
        seen = self.live.messages if self.live is not None else 0
        if seen == self._live_seen:  # nothing new on the topics: the views stand as they are
            return con
        self._live_seen = seen
        live = self.live.snapshot() if self.live is not None else {}
        self._live_events = live.get("events")
        live_rows = self._live_events.num_rows if self._live_events is not None else 0
        self._events_version = (*self._archived, live_rows)
        for name in LIVE_TABLES:
            if name in live:
                con.register(f"_live_{name}", live[name])
                stamp = self._tables[name].time_field
                con.execute(
                    f"CREATE OR REPLACE VIEW ui.{name} AS SELECT * FROM main.{name} "
                    f"UNION ALL BY NAME SELECT * EXCLUDE (decode_error, raw_value), "
                    f"make_timestamp({stamp} // 1000) AS time FROM _live_{name}"
                )
            else:
                con.execute(f"CREATE OR REPLACE VIEW ui.{name} AS SELECT * FROM main.{name}")
        con.execute("SET search_path = 'ui,main'")
        return con

    def _query(self, sql: str, parameters: Sequence[Any]) -> list[dict[str, Any]]:
        with self._lock:
            columns, rows = run_sql(self._connection(), sql, list(parameters))
        return [dict(zip(columns, row, strict=True)) for row in rows]

    def close(self) -> None:
        """Stop the live tail (if any) and close the connection."""
        if self.live is not None:
            self.live.close()
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None
            shutil.rmtree(self._nothing, ignore_errors=True)

    # -- the run list ------------------------------------------------------------------

    def runs(self) -> list[dict[str, Any]]:
        """Every run with a step summary: its status, last step, world size and times.

        Status: ``stopped`` (a stop command was applied: by which rule or operator, at which
        step), ``ended`` (its ``run_end`` arrived), else ``running``.
        """
        rows = self._query(
            "WITH s AS (SELECT run_id, max(step) AS last_step, count(DISTINCT step) AS steps, "
            "max(world_size) AS world_size, min(first_event_ns) AS first_ns, "
            "max(emitted_ns) AS last_ns FROM steps GROUP BY run_id), "
            "e AS (SELECT DISTINCT run_id FROM events WHERE kind = 'run_end'), "
            "st AS (SELECT c.run_id, arg_min(coalesce(c.rule_id, c.origin), a.applied_at_step) "
            "AS stopped_by, min(a.applied_at_step) AS stopped_at FROM commands c JOIN acks a "
            "ON a.command_id = c.command_id AND a.run_id = c.run_id WHERE a.status = 'applied' "
            "AND list_contains(list_transform(c.actions, lambda x: x.type), 'stop') "
            "GROUP BY c.run_id) "
            "SELECT s.*, e.run_id IS NOT NULL AS ended, st.stopped_by, st.stopped_at "
            "FROM s LEFT JOIN e USING (run_id) LEFT JOIN st USING (run_id) "
            "ORDER BY s.last_ns DESC",
            [],
        )
        runs = []
        for row in rows:
            status = "stopped" if row["stopped_by"] else "ended" if row["ended"] else "running"
            runs.append(
                {
                    "run_id": row["run_id"],
                    "status": status,
                    "stopped_by": row["stopped_by"],
                    "stopped_at": row["stopped_at"],
                    "last_step": row["last_step"],
                    "steps": row["steps"],
                    "world_size": row["world_size"],
                    "first": _iso(row["first_ns"]),
                    "last": _iso(row["last_ns"]),
                }
            )
        return runs

    # -- one run -----------------------------------------------------------------------

    def _run(self, run_id: str) -> list[Any]:
        return [run_partition(run_id), run_id]

    def overview(self, run_id: str) -> dict[str, Any]:
        """The run's stages and metric names, world size and step range."""
        rows = self._query(
            f"SELECT stage, list_sort(list_distinct(flatten(list(map_keys(metrics))))) AS names, "
            f"min(step) AS first_step, max(step) AS last_step, max(world_size) AS world_size "
            f"FROM steps WHERE {_RUN} GROUP BY stage ORDER BY stage",
            self._run(run_id),
        )
        if not rows:
            raise NotFoundError(f"no run {run_id!r}: no step summary of it in the archive "
                                "or on the live topics")  # fmt: skip
        return {
            "run_id": run_id,
            "stages": {row["stage"]: row["names"] for row in rows},
            "first_step": min(row["first_step"] for row in rows),
            "last_step": max(row["last_step"] for row in rows),
            "world_size": max(row["world_size"] for row in rows),
        }

    def series(self, run_id: str, stage: str, metric: str) -> dict[str, Any]:
        """One metric across ranks, step by step (latest revision): its mean and std."""
        rows = self._query(
            "SELECT step, m.mean AS mean, m.std AS std FROM (SELECT step, "
            f"arg_max(metrics[?], revision) AS m FROM steps WHERE {_RUN} AND stage = ? "
            "GROUP BY step) WHERE m IS NOT NULL ORDER BY step",
            [metric, *self._run(run_id), stage],
        )
        return {
            "stage": stage,
            "metric": metric,
            "steps": [row["step"] for row in rows],
            "mean": _finite(row["mean"] for row in rows),
            "std": _finite(row["std"] for row in rows),
        }

    def timing(self, run_id: str) -> dict[str, Any]:
        """Per step: time since the previous step, the last rank's lag, ranks reported.

        Seconds since the previous step's last event; the fewest ranks over stages (latest
        revisions).
        """
        rows = self._query(
            "SELECT step, max(last) AS last_ns, max(lag) AS lag_ns, min(ranks) AS ranks, "
            "max(world) AS world FROM (SELECT stage, step, arg_max(last_event_ns, revision) "
            "AS last, arg_max(last_rank_lag_ns, revision) AS lag, "
            "arg_max(len(ranks_reported), revision) AS ranks, max(world_size) AS world "
            f"FROM steps WHERE {_RUN} GROUP BY stage, step) GROUP BY step ORDER BY step",
            self._run(run_id),
        )
        lasts = [row["last_ns"] for row in rows]
        step_s = [None] + [
            (b - a) / 1e9 if a and b and b >= a else None for a, b in itertools.pairwise(lasts)
        ]
        return {
            "steps": [row["step"] for row in rows],
            "step_s": step_s,
            "last_rank_lag_s": [row["lag_ns"] / 1e9 for row in rows],
            "ranks": [row["ranks"] for row in rows],
            "world_size": [row["world"] for row in rows],
        }

    def heatmap(
        self, run_id: str, stage: str, metric: str, max_ranks: int, max_steps: int
    ) -> dict[str, Any]:
        """Every rank's value of ``metric`` per step, binned to a bounded grid.

        At most ``max_ranks`` x ``max_steps`` cells; a cell is the mean over its ranks and
        steps, None where nothing arrived (a missing rank or step). Computed with pyarrow and
        numpy over the events' files (the map of metrics read with dictionary-encoded keys),
        not in SQL: a 256-rank, 10,000-step stage is 2.5 million rows. Answers are kept while
        the archive's files and the live rows stay the same (a finished run's is computed once).
        """
        span = self._query(
            f"SELECT min(step) AS lo, max(step) AS hi, max(world_size) AS world FROM steps "
            f"WHERE {_RUN} AND stage = ?",
            [*self._run(run_id), stage],
        )[0]
        if span["lo"] is None:
            raise NotFoundError(f"run {run_id!r} has no stage {stage!r}")
        lo, hi, world = span["lo"], span["hi"], max(1, span["world"] or 1)
        rank_bin = max(1, math.ceil(world / max_ranks))
        step_bin = max(1, math.ceil((hi - lo + 1) / max_steps))
        n_ranks, n_steps = math.ceil(world / rank_bin), (hi - lo) // step_bin + 1
        with self._lock:
            self._connection()
            sources = [
                ds.dataset(source) if isinstance(source, pa.Table) else source
                for source in (self._events, self._live_events)
                if source is not None
            ]
            key = (run_id, stage, metric, rank_bin, step_bin, lo, hi, self._events_version)
            answer = self._heatmaps.get(key)
        if answer is not None:
            return answer
        wanted = (
            (pc.field("run") == run_partition(run_id))
            & (pc.field("run_id") == run_id)
            & (pc.field("kind") == "metrics")
            & (pc.field("stage") == stage)
            & (pc.field("step") >= lo)
            & (pc.field("step") <= hi)
        )
        grid = MetricGrid(n_ranks, n_steps)
        for source in sources:
            for batch in source.to_batches(columns=["rank", "step", "metrics"], filter=wanted):
                grid.add(batch, metric, rank_bin, lo, step_bin)
        answer = {
            "stage": stage,
            "metric": metric,
            "ranks": [r * rank_bin for r in range(n_ranks)],
            "steps": [lo + s * step_bin for s in range(n_steps)],
            "z": grid.means(),
            "rank_bin": rank_bin,
            "step_bin": step_bin,
            "world_size": world,
        }
        with self._lock:
            if len(self._heatmaps) >= _HEATMAPS_KEPT:
                self._heatmaps.pop(next(iter(self._heatmaps)))
            self._heatmaps[key] = answer
        return answer

    def commands(self, run_id: str) -> list[dict[str, Any]]:
        """Every command of the run with its ack and verdict, if any.

        Rule, reason, actions, the applied step, and whether it worked.
        """
        rows = self._query(
            "SELECT c.command_id, c.stage, c.step, c.origin, c.rule_id, c.dry_run, c.reason, "
            "list_transform(c.actions, lambda x: x.type) AS actions, c.issued_ns, a.status, "
            "a.applied_at_step, a.detail, v.verdict, v.decided_at_step, "
            "v.reason AS verdict_reason FROM (SELECT * FROM commands WHERE "
            f"{_RUN} QUALIFY row_number() OVER (PARTITION BY command_id ORDER BY attempt DESC) "
            f"= 1) c LEFT JOIN (SELECT * FROM acks WHERE {_RUN} QUALIFY row_number() OVER "
            "(PARTITION BY command_id ORDER BY acked_ns DESC) = 1) a USING (command_id) "
            f"LEFT JOIN (SELECT * FROM verdicts WHERE {_RUN} QUALIFY row_number() OVER "
            "(PARTITION BY command_id ORDER BY emitted_ns) = 1) v USING (command_id) "
            "ORDER BY c.issued_ns",
            [*self._run(run_id), *self._run(run_id), *self._run(run_id)],
        )
        for row in rows:
            row["issued"] = _iso(row.pop("issued_ns"))
        return jsonable(rows)  # type: ignore[no-any-return]

    def quiet(self, run_id: str) -> dict[str, Any]:
        """Whether the run is silent, and the ranks of its newest stack capture, grouped.

        Silent: a silence rule fired for the newest step the run started (its command's
        reason says "started no step"). ``every_s``: the median time per step over the last
        20 steps before it.
        """
        starts = self._query(
            "SELECT step, min(first_event_ns) AS started_ns FROM steps WHERE "
            f"{_RUN} AND stage <> 'system' GROUP BY step ORDER BY step DESC LIMIT 21",
            self._run(run_id),
        )
        fired = self._query(
            f"SELECT step, issued_ns, reason FROM commands WHERE {_RUN} AND reason LIKE ? "
            "ORDER BY issued_ns DESC LIMIT 1",
            [*self._run(run_id), f"% {SILENCE_WORDS} %"],
        )
        silence = None
        if starts and fired and fired[0]["step"] >= starts[0]["step"]:
            ordered = sorted(starts, key=lambda row: row["step"])
            per_step = [
                (b["started_ns"] - a["started_ns"]) / (b["step"] - a["step"]) / 1e9
                for a, b in itertools.pairwise(ordered)
                if b["step"] > a["step"] and a["started_ns"] and b["started_ns"]
            ]
            silence = {
                "step": starts[0]["step"],
                "since": _iso(starts[0]["started_ns"]),
                "every_s": statistics.median(per_step) if per_step else None,
                "reason": fired[0]["reason"],
            }
        capture = newest_capture(self._query(CAPTURE_QUERY, capture_parameters(run_id)))
        groups = None
        if capture is not None:
            command_id, ranks = capture
            groups = {
                "command_id": command_id,
                "ranks": len(ranks),
                "groups": describe_groups(group_ranks(ranks)),
            }
        return jsonable({"silence": silence, "stacks": groups})  # type: ignore[no-any-return]

    def step(self, run_id: str, step: int, margin_s: float = 2.0) -> dict[str, Any]:
        """Everything about one step: summaries, metrics, logs, commands, samples.

        That is its summaries, every rank's metrics, the log records, commands, acks and
        verdicts, and its rollout samples (the reward histogram, the chosen texts, per split).

        Times of events and log records are on the brokers' clock (``timestamp_ns`` and
        ``clock_offset_ns`` keep the host's; ``clocks``: each host's offset in ns, None where
        unknown). Log records come most severe first, then in that time's order.
        """
        with self._lock:
            try:
                context = step_context(self._connection(), run_id, step, margin_s)
                samples = step_samples(self._connection(), run_id, step)
            except QueryError as exc:
                if "has nothing of step" in str(exc):
                    raise NotFoundError(str(exc)) from None
                raise
        metrics = _distinct(context.metrics.dicts(), ("stage", "rank", "timestamp_ns"))
        logs = _distinct(context.logs.dicts(), ("time", "pid", "rank", "message"))
        logs.sort(key=lambda row: _LEVEL_ORDER.get(str(row["level"]).upper(), 9))
        summaries = _distinct(context.summaries.dicts(), ("stage", "revision"))
        answer: dict[str, Any] = jsonable(
            {
                "run_id": run_id,
                "step": step,
                "summaries": summaries,
                "metrics": metrics,
                "logs": logs,
                "commands": _distinct(context.commands.dicts(), ("command_id",)),
                "acks": _distinct(context.acks.dicts(), ("command_id", "status")),
                "verdicts": _distinct(context.verdicts.dicts(), ("command_id",)),
                "clocks": context.host_offsets(),
                "samples": [asdict(part) for part in samples],
            }
        )
        return answer


def run_data(settings: Settings, live: bool = True) -> RunData:
    """The run page's data for ``settings``: the archive, and the live topics.

    ``live`` False: the archive only. The live tail starts reading in the background.
    """
    tail = None
    if live:
        codec = default_codec()
        tail = LiveTail(
            settings,
            tables_of(Topics(settings.prefix), codec),
            settings.ui.lookback_s,
            settings.ui.live_max_rows,
            codec,
        )
        tail.start()
    return RunData(settings, tail, settings.ui.refresh_s)


def _distinct(rows: list[dict[str, Any]], key: Sequence[str]) -> list[dict[str, Any]]:
    seen: set[tuple[Any, ...]] = set()
    kept = []
    for row in rows:
        identity = tuple(str(row.get(name)) for name in key)
        if identity not in seen:
            seen.add(identity)
            kept.append(row)
    return kept


def _iso(ns: int | None) -> str | None:
    if ns is None:
        return None
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.UTC).isoformat()
