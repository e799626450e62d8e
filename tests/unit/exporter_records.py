"""Records as the exporter's state receives them (decoded TrainerEvents, summaries, commands)."""

from __future__ import annotations

import uuid
from typing import Any

from rlpulse.schemas.records import (
    AckStatus,
    Action,
    CommandAck,
    ControlCommand,
    EventKind,
    MetricStats,
    StepSummary,
    TrainerEvent,
)

T0 = 1_800_000_000 * 10**9
"""A fixed wall-clock time (ns) the records are written at, so expiry is computed by hand."""
S = 10**9


def event(
    rank: int,
    step: int,
    metrics: dict[str, float],
    *,
    run: str = "r1",
    stage: str = "rollout",
    kind: EventKind = "metrics",
    attempt: int = 0,
    world_size: int = 8,
    at_ns: int = T0,
    host: str = "node-a",
) -> TrainerEvent:
    return {
        "kind": kind,
        "run_id": run,
        "attempt": attempt,
        "step": step,
        "stage": stage,
        "rank": rank,
        "world_size": world_size,
        "metrics": metrics,
        "level": None,
        "message": None,
        "tags": {},
        "timestamp_ns": at_ns,
        "hostname": host,
        "pid": 1000 + rank,
        "producer_id": f"{run}-{rank}",
        "seq": step,
        "policy_version": None,
        "trace_id": None,
    }


def stats(values: list[float]) -> MetricStats:
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    return {
        "count": len(values),
        "sum": sum(values),
        "mean": mean,
        "std": std,
        "min": min(values),
        "max": max(values),
        "min_rank": values.index(min(values)),
        "max_rank": values.index(max(values)),
        "non_finite": 0,
    }


def summary(
    step: int,
    metrics: dict[str, MetricStats],
    *,
    run: str = "r1",
    stage: str = "rollout",
    attempt: int = 0,
    revision: int = 1,
    missing: list[int] | None = None,
    stragglers: list[int] | None = None,
    at_ns: int = T0,
) -> StepSummary:
    missing = missing or []
    return {
        "summary_id": uuid.uuid4().hex,
        "run_id": run,
        "attempt": attempt,
        "stage": stage,
        "step": step,
        "revision": revision,
        "world_size": 8,
        "ranks_reported": [r for r in range(8) if r not in missing],
        "missing_ranks": missing,
        "metrics": metrics,
        "tags": {},
        "last_rank": 7,
        "last_rank_lag_ns": 250_000_000,
        "stragglers": stragglers or [],
        "closed_by": "grace" if missing else "complete",
        "first_event_ns": at_ns,
        "last_event_ns": at_ns,
        "emitted_ns": at_ns,
    }


def command(
    actions: list[tuple[str, dict[str, Any]]],
    *,
    run: str = "r1",
    rule: str | None = "kl-guard",
    step: int = 42,
    attempt: int = 0,
    dry_run: bool = False,
    reason: str = "kl_divergence 0.38 > 0.3 for 3 consecutive steps (40, 41, 42)",
    at_ns: int = T0,
) -> ControlCommand:
    typed: list[Action] = [{"type": kind, "params": params} for kind, params in actions]
    return {
        "command_id": uuid.uuid4().hex,
        "run_id": run,
        "attempt": attempt,
        "stage": "actor",
        "step": step,
        "origin": "rule" if rule is not None else "operator",
        "rule_id": rule,
        "rule_version": "v1" if rule is not None else None,
        "dry_run": dry_run,
        "actions": typed,
        "reason": reason,
        "evidence": {},
        "issued_ns": at_ns,
    }


def ack(of: ControlCommand, status: AckStatus = "applied", at_ns: int = T0) -> CommandAck:
    return {
        "command_id": of["command_id"],
        "run_id": of["run_id"],
        "attempt": of["attempt"],
        "status": status,
        "applied_at_step": of["step"],
        "detail": {},
        "acked_ns": at_ns,
    }
