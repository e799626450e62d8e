"""``rlpulse show RUN --step N``: everything the archive knows about one step of one run.

The step's StepSummaries (every stage, every revision), every rank's metrics events, every
log record of the run between the step's first and last event (widened by a margin, since
what explains a step is often logged just before or after it), the commands issued for the
step or applied at it, their acks, and the verdicts on commands issued, applied or decided
at it (one row per verdict id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from rlpulse.archive.catalog import run_sql
from rlpulse.archive.exceptions import QueryError
from rlpulse.archive.tables import day_of, run_partition

__all__ = ["Rows", "StepContext", "step_context"]

_MS_PER_HOUR = 3_600_000


@dataclass
class Rows:
    """Column names and rows of one part of the context."""

    columns: list[str] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)

    def dicts(self) -> list[dict[str, Any]]:
        """The rows as dicts."""
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


@dataclass
class StepContext:
    """One step of one run, as the archive has it."""

    run_id: str
    step: int
    summaries: Rows
    metrics: Rows
    logs: Rows
    commands: Rows
    acks: Rows
    verdicts: Rows
    window_ns: tuple[int, int] | None
    """The first and last event of the step (before the margin), if any arrived."""


def _rows(con: duckdb.DuckDBPyConnection, sql: str, parameters: list[Any]) -> Rows:
    columns, rows = run_sql(con, sql, parameters)
    return Rows(columns, rows)


def step_context(
    con: duckdb.DuckDBPyConnection, run_id: str, step: int, margin_s: float = 2.0
) -> StepContext:
    """The context of ``step`` of ``run_id``; :class:`QueryError` when the archive has none."""
    run = [run_partition(run_id), run_id]
    where = "run = ? AND run_id = ? AND step = ?"
    summaries = _rows(
        con,
        "SELECT stage, revision, world_size, ranks_reported, missing_ranks, closed_by, "
        "last_rank, last_rank_lag_ns / 1e6 AS last_rank_lag_ms, stragglers, metrics, "
        f"first_event_ns, last_event_ns FROM steps WHERE {where} ORDER BY stage, revision",
        [*run, step],
    )
    metrics = _rows(
        con,
        "SELECT stage, rank, hostname, pid, time, metrics, timestamp_ns FROM events "
        f"WHERE {where} AND kind = 'metrics' ORDER BY stage, rank, timestamp_ns",
        [*run, step],
    )
    stamps = [row[-1] for row in metrics.rows]
    for summary in summaries.dicts():
        stamps += [summary["first_event_ns"], summary["last_event_ns"]]
    window = (min(stamps), max(stamps)) if stamps else None
    logs = Rows()
    if window is not None:
        margin = round(margin_s * 1e9)
        low, high = window[0] - margin, window[1] + margin
        logs = _rows(
            con,
            "SELECT time, level, hostname, rank, pid, step, logger, message, exception, "
            "trace_id FROM logs WHERE run = ? AND run_id = ? AND timestamp_ns BETWEEN ? AND ? "
            "AND date BETWEEN ? AND ? ORDER BY timestamp_ns, producer_id, seq",
            [
                *run,
                low,
                high,
                day_of(low // 1_000_000 - _MS_PER_HOUR),
                day_of(high // 1_000_000 + _MS_PER_HOUR),
            ],
        )
    # A command issued for another step (a rule's, seen late; an operator's, step -1) and
    # applied at this one belongs here too: its ack is shown, so is what it acknowledges.
    commands = _rows(
        con,
        "SELECT command_id, stage, origin, rule_id, dry_run, actions, reason, time "
        "FROM commands WHERE run = ? AND run_id = ? AND (step = ? OR command_id IN ("
        "SELECT command_id FROM acks WHERE run = ? AND run_id = ? AND applied_at_step = ?)) "
        "ORDER BY issued_ns",
        [*run, step, *run, step],
    )
    acks = _rows(
        con,
        "SELECT command_id, status, applied_at_step, detail, time FROM acks "
        "WHERE run = ? AND run_id = ? AND (applied_at_step = ? OR command_id IN ("
        f"SELECT command_id FROM commands WHERE {where})) ORDER BY acked_ns",
        [*run, step, *run, step],
    )
    verdicts = _rows(
        con,
        "SELECT command_id, rule_id, verdict, issued_step, applied_at_step, decided_at_step, "
        "reason, time FROM verdicts WHERE run = ? AND run_id = ? AND "
        "(issued_step = ? OR applied_at_step = ? OR decided_at_step = ?) "
        "QUALIFY row_number() OVER (PARTITION BY verdict_id ORDER BY emitted_ns) = 1 "
        "ORDER BY emitted_ns",
        [*run, step, step, step],
    )
    if not (summaries.rows or metrics.rows or commands.rows or acks.rows or verdicts.rows):
        raise QueryError(f"the archive has nothing of step {step} of run {run_id!r}")
    return StepContext(run_id, step, summaries, metrics, logs, commands, acks, verdicts, window)
