"""``rlpulse show RUN --step N``: everything the archive knows about one step of one run.

The step's StepSummaries (every stage, every revision), every rank's metrics events, every
log record of the run between the step's first and last event (widened by a margin, since
what explains a step is often logged just before or after it), the commands issued for the
step or applied at it, their acks, and the verdicts on commands issued, applied or decided
at it (one row per verdict id).

Events and log records come from several hosts: their ``time`` is on the brokers' clock (the
host's ``timestamp_ns`` corrected by the offset its agent sent,
:data:`~rlpulse.archive.catalog.CORRECTED_NS`), the log records are in that order, and the
step's window is taken in it; ``timestamp_ns`` and ``clock_offset_ns`` keep what the host said.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from rlpulse.archive.catalog import CORRECTED_NS, CORRECTED_TIME, corrected_window, run_sql
from rlpulse.archive.exceptions import QueryError
from rlpulse.archive.tables import run_partition

__all__ = ["Rows", "StepContext", "step_context"]


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
    """The first and last event of the step (before the margin), if any arrived: its metrics
    and log events on the brokers' clock, else (none archived) what its summaries say, which
    is the hosts' own times."""

    def host_offsets(self) -> dict[str, int | None]:
        """Each host of the step's events and log records, and its clock offset in ns.

        The offset is one its records carried (added to its times); None where none did.
        """
        offsets: dict[str, int | None] = {}
        for part in (self.metrics, self.logs):
            for row in part.dicts():
                offset = row["clock_offset_ns"]
                if offset is not None or row["hostname"] not in offsets:
                    offsets[row["hostname"]] = offset
        return dict(sorted(offsets.items()))


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
        f"SELECT stage, rank, hostname, pid, {CORRECTED_TIME} AS time, metrics, timestamp_ns, "
        f"clock_offset_ns, {CORRECTED_NS} AS corrected_ns FROM events "
        f"WHERE {where} AND kind = 'metrics' ORDER BY stage, rank, corrected_ns",
        [*run, step],
    )
    _, ((first, last),) = run_sql(
        con,
        f"SELECT min({CORRECTED_NS}), max({CORRECTED_NS}) FROM events "
        f"WHERE {where} AND kind IN ('metrics', 'log')",  # what the step joiner joins
        [*run, step],
    )
    if first is not None:
        window: tuple[int, int] | None = (first, last)
    else:  # no event archived (retention, another archive): what the summaries say
        stamps = [
            s[name] for s in summaries.dicts() for name in ("first_event_ns", "last_event_ns")
        ]
        window = (min(stamps), max(stamps)) if stamps else None
    logs = Rows()
    if window is not None:
        margin = round(margin_s * 1e9)
        terms, bounds = corrected_window(window[0] - margin, window[1] + margin)
        logs = _rows(
            con,
            f"SELECT {CORRECTED_TIME} AS time, level, hostname, rank, pid, step, logger, "
            "message, exception, trace_id, timestamp_ns, clock_offset_ns FROM logs "
            f"WHERE run = ? AND run_id = ? AND {' AND '.join(terms)} "
            f"ORDER BY {CORRECTED_NS}, producer_id, seq",
            [*run, *bounds],
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
