"""Pure step joiner: the events of all ranks of one step, joined into one ``StepSummary``.

A plain object driven by the faust joiner agent, the backtest CLI and the tests; it imports
neither Kafka clients nor faust. All state lives in three mappings passed in by the caller
(faust Tables in the worker, dicts in tests), with JSON-compatible values only (int keys
would come back as strings, so keys are strings)::

    groups[f"{run}|{attempt}|{stage}|{step}"] -> GroupState
        the merged events of one step: per rank the winning value and seq of each metric,
        the (producer_id, seq) pairs seen, tags, timestamps, how it closed, the revision and
        the last summary emitted.
    stages[f"{run}|{attempt}|{stage}"] -> StageState
        ordering state: open steps with the arrival time of their first event, closed steps
        waiting for an earlier open one, emitted steps still retained for late events, and
        the emitted frontier (highest emitted step).
    runs[f"{run}|{attempt}"] -> list[str]
        the stage names of a run attempt, so ``run_end`` finds everything to close.

faust persists a change only on ``table[key] = value`` or ``del table[key]``; a value mutated
in place is lost on restart. Every change here is therefore read, modify, write back.

Life of a group: open -> closed (``complete``: all ``world_size`` ranks reported;
``grace``: ``grace_s`` after its first event arrived; ``run_end``) -> released (revision 1
emitted once every earlier open step of its stage has closed) -> revisions for late events
-> deleted ``late_window_s`` after its release. A stage entry without any group is kept for
one more late window, so late events still meet its frontier and are refused as too late.
Keys are split from the right, so ``stage`` must not contain ``|`` (``run_id`` may).
"""

from __future__ import annotations

import bisect
import math
import uuid
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import TypedDict

from rlpulse.rules.arith import exact_mean, exact_std, exact_sum, nan_max, nan_min
from rlpulse.schemas.records import ClosedBy, MetricStats, StepSummary, TrainerEvent

__all__ = [
    "SUMMARY_NAMESPACE",
    "GroupState",
    "JoinOutcome",
    "JoinerConfig",
    "StageState",
    "StepJoiner",
    "summary_id",
]

SUMMARY_NAMESPACE = uuid.UUID("8df55b85-6d5e-4297-8b62-70b55184a79d")
"""uuid5 namespace of ``summary_id``; changing it changes every id."""

_KINDS = frozenset({"metrics", "log", "run_start", "run_end"})
_INT_FIELDS = ("step", "rank", "world_size", "timestamp_ns", "seq")
_SECOND_NS = 1_000_000_000


class GroupState(TypedDict):
    """Value of ``groups``: one (run, attempt, stage, step)."""

    world_size: int
    arrived_ns: int  # now_ns of the first add: the grace clock
    first_ts: int
    last_ts: int
    ranks: dict[str, dict[str, list[float]]]  # str(rank) -> metric -> [value, seq]
    last_rank: int  # the rank whose first event arrived last
    last_rank_ts: int  # timestamp_ns of that event
    seen: dict[str, list[int]]  # producer_id -> seqs merged
    tags: dict[str, str]
    closed_by: ClosedBy | None
    revision: int  # summaries emitted so far
    released_ns: int | None  # now_ns of revision 1: the late window
    summary: StepSummary | None  # the last one emitted


class StageState(TypedDict):
    """Value of ``stages``: step ordering of one (run, attempt, stage)."""

    open: dict[str, int]  # str(step) -> arrived_ns of its group
    pending: list[int]  # closed steps waiting for an earlier open step, ascending
    retained: list[int]  # emitted steps still kept, ascending (= release order)
    frontier: int  # highest emitted step, -1 before the first
    drained_ns: int | None  # when its last retained group was deleted


@dataclass(frozen=True)
class JoinerConfig:
    """Timing of the joiner: grace period of an open group, late window of a closed one."""

    grace_s: float = 30.0
    late_window_s: float = 600.0

    def __post_init__(self) -> None:
        if self.grace_s < 0 or self.late_window_s < 0:
            raise ValueError(
                f"grace_s and late_window_s must be >= 0, got {self.grace_s}, {self.late_window_s}"
            )


@dataclass(frozen=True)
class JoinOutcome:
    """What one event did: summaries to publish now (in order), or why it goes to the DLQ."""

    summaries: list[StepSummary] = field(default_factory=list)
    rejected: str | None = None
    duplicate: bool = False


def summary_id(run_id: str, attempt: int, stage: str, step: int, revision: int) -> str:
    """Deterministic id of one revision of one step's summary."""
    name = "\x1f".join((run_id, str(attempt), stage, str(step), str(revision)))
    return str(uuid.uuid5(SUMMARY_NAMESPACE, name))


class StepJoiner:
    """Joins ``TrainerEvent``s per (run, attempt, stage, step); see the module docstring."""

    def __init__(
        self,
        groups: MutableMapping[str, GroupState],
        stages: MutableMapping[str, StageState],
        runs: MutableMapping[str, list[str]],
        config: JoinerConfig = JoinerConfig(),
    ) -> None:
        self._groups = groups
        self._stages = stages
        self._runs = runs
        self._grace_ns = round(config.grace_s * _SECOND_NS)
        self._late_ns = round(config.late_window_s * _SECOND_NS)

    def add(self, event: TrainerEvent, now_ns: int) -> JoinOutcome:
        """Merge one event; ``now_ns`` is the wall clock. Never raises for bad input."""
        problem = _invalid(event)
        if problem is not None:
            return JoinOutcome(rejected=problem)
        if event["kind"] == "run_start":
            return JoinOutcome()
        if event["kind"] == "run_end":
            return JoinOutcome(self._close_run(f"{event['run_id']}|{event['attempt']}", now_ns))

        skey = f"{event['run_id']}|{event['attempt']}|{event['stage']}"
        step = event["step"]
        gkey = f"{skey}|{step}"
        group = self._groups.get(gkey)
        if group is None:
            stage = self._stages.get(skey)
            if stage is not None and step <= stage["frontier"]:
                return JoinOutcome(
                    rejected=f"too_late: {gkey} is at or below the emitted step "
                    f"{stage['frontier']} and its group is no longer retained"
                )
            self._open(skey, stage, step, now_ns)
            group = _new_group(event, now_ns)
        else:
            released = group["released_ns"]
            if released is not None and now_ns - released >= self._late_ns:
                return JoinOutcome(
                    rejected=f"too_late: {gkey} was emitted {(now_ns - released) / _SECOND_NS:.0f}"
                    f" s ago, beyond the late window of {self._late_ns / _SECOND_NS:g} s"
                )
            if event["world_size"] != group["world_size"]:
                return JoinOutcome(
                    rejected=f"invalid: world_size {event['world_size']} differs from the "
                    f"{group['world_size']} of {gkey}"
                )
            if event["seq"] in group["seen"].get(event["producer_id"], ()):
                return JoinOutcome(duplicate=True)

        _merge(group, event)
        if group["closed_by"] is None and len(group["ranks"]) == group["world_size"]:
            group["closed_by"] = "complete"
            self._groups[gkey] = group
            stage = self._stages[skey]
            summaries = self._settle(skey, stage, [step], now_ns)
            self._stages[skey] = stage
            return JoinOutcome(summaries)
        if group["revision"] == 0:  # open, or closed and waiting for an earlier step
            self._groups[gkey] = group
            return JoinOutcome()
        return JoinOutcome([self._emit(gkey, group, now_ns)])

    def expire(self, now_ns: int, stage_keys: Iterable[str] | None = None) -> list[StepSummary]:
        """Close groups whose grace ran out and delete those past the late window.

        Only the given stage keys if any, else every stage. Returns the summaries released.
        """
        keys = list(self._stages) if stage_keys is None else list(stage_keys)
        summaries: list[StepSummary] = []
        for skey in keys:
            stage = self._stages.get(skey)
            if stage is None:
                continue
            due = sorted(
                int(step)
                for step, arrived in stage["open"].items()
                if now_ns - arrived >= self._grace_ns
            )
            for step in due:
                self._mark_closed(f"{skey}|{step}", "grace")
            if due:
                summaries += self._settle(skey, stage, due, now_ns)
            pruned = self._prune(skey, stage, now_ns)
            drained = stage["drained_ns"]
            if drained is not None and now_ns - drained >= self._late_ns:
                self._drop_stage(skey)
            elif due or pruned:
                self._stages[skey] = stage
        return summaries

    def recent_summaries(self, stage_keys: Iterable[str], since_ns: int) -> list[StepSummary]:
        """Last summaries of retained groups emitted at or after ``since_ns``, oldest first."""
        found: list[StepSummary] = []
        for skey in stage_keys:
            stage = self._stages.get(skey)
            if stage is None:
                continue
            for step in stage["retained"]:
                group = self._groups.get(f"{skey}|{step}")
                summary = None if group is None else group["summary"]
                if summary is not None and summary["emitted_ns"] >= since_ns:
                    found.append(summary)
        found.sort(key=lambda summary: summary["emitted_ns"])  # stable: step order stays
        return found

    def open_stage_keys(self) -> list[str]:
        """Stage keys with at least one open group (the ones ``expire`` may close), sorted."""
        return sorted(key for key in list(self._stages) if self._stages[key]["open"])

    def _open(self, skey: str, stage: StageState | None, step: int, now_ns: int) -> None:
        """Register a new open step with its stage, creating the stage if needed."""
        if stage is None:
            stage = {"open": {}, "pending": [], "retained": [], "frontier": -1, "drained_ns": None}
            rkey, name = skey.rsplit("|", 1)
            self._runs[rkey] = [*self._runs.get(rkey, []), name]
        stage["open"][str(step)] = now_ns
        stage["drained_ns"] = None
        self._stages[skey] = stage

    def _mark_closed(self, gkey: str, closed_by: ClosedBy) -> None:
        group = self._groups[gkey]
        group["closed_by"] = closed_by
        self._groups[gkey] = group

    def _settle(
        self, skey: str, stage: StageState, closed: list[int], now_ns: int
    ) -> list[StepSummary]:
        """Move ``closed`` steps from open to pending, then release what no open step blocks.

        The caller writes ``stage`` back.
        """
        for step in closed:
            del stage["open"][str(step)]
            bisect.insort(stage["pending"], step)
        first_open = min((int(step) for step in stage["open"]), default=None)
        released: list[StepSummary] = []
        pending = stage["pending"]
        while pending and (first_open is None or pending[0] < first_open):
            step = pending.pop(0)
            gkey = f"{skey}|{step}"
            released.append(self._emit(gkey, self._groups[gkey], now_ns))
            stage["retained"].append(step)
            stage["frontier"] = step
        return released

    def _emit(self, gkey: str, group: GroupState, now_ns: int) -> StepSummary:
        """Compute the group's next revision, store it in the group and write the group."""
        group["revision"] += 1
        if group["released_ns"] is None:
            group["released_ns"] = now_ns
        summary = _summarize(gkey, group, now_ns)
        group["summary"] = summary
        self._groups[gkey] = group
        return summary

    def _prune(self, skey: str, stage: StageState, now_ns: int) -> bool:
        """Delete retained groups past the late window; True if any was deleted."""
        retained = stage["retained"]
        count = 0
        for step in retained:  # released in this order, so the oldest come first
            gkey = f"{skey}|{step}"
            released = self._groups[gkey]["released_ns"]
            if released is not None and now_ns - released < self._late_ns:
                break
            del self._groups[gkey]
            count += 1
        del retained[:count]
        if count and not (retained or stage["open"] or stage["pending"]):
            stage["drained_ns"] = now_ns
        return count > 0

    def _drop_stage(self, skey: str) -> None:
        del self._stages[skey]
        rkey, name = skey.rsplit("|", 1)
        names = [other for other in self._runs.get(rkey, []) if other != name]
        if names:
            self._runs[rkey] = names
        elif rkey in self._runs:
            del self._runs[rkey]

    def _close_run(self, rkey: str, now_ns: int) -> list[StepSummary]:
        """Close every open group of a run attempt (``run_end``); release them per stage."""
        summaries: list[StepSummary] = []
        for name in self._runs.get(rkey, []):
            skey = f"{rkey}|{name}"
            stage = self._stages.get(skey)
            if stage is None or not stage["open"]:
                continue
            steps = sorted(int(step) for step in stage["open"])
            for step in steps:
                self._mark_closed(f"{skey}|{step}", "run_end")
            summaries += self._settle(skey, stage, steps, now_ns)
            self._stages[skey] = stage
        return summaries


MAX_WORLD_SIZE = 65_536
"""Largest world size accepted; a summary lists missing ranks, so this bounds its size."""
MAX_METRICS = 4_096
"""Most metrics one event may carry."""
MAX_NAME_LENGTH = 512
"""Longest run id, stage, metric or tag name accepted."""


def _too_large(event: TrainerEvent) -> str | None:
    """Why the event is too large to hold in worker state, or None."""
    if event["world_size"] > MAX_WORLD_SIZE:
        return f"too large: world_size {event['world_size']} > {MAX_WORLD_SIZE}"
    if len(event["metrics"]) > MAX_METRICS:
        return f"too large: {len(event['metrics'])} metrics > {MAX_METRICS}"
    if len(event["tags"]) > MAX_METRICS:
        return f"too large: {len(event['tags'])} tags > {MAX_METRICS}"
    names = [event["run_id"], event["stage"], *event["metrics"], *event["tags"]]
    longest = max(len(name) for name in names)
    if longest > MAX_NAME_LENGTH:
        return f"too large: a name of {longest} characters > {MAX_NAME_LENGTH}"
    return None


def _invalid(event: TrainerEvent) -> str | None:
    """Why the event cannot be joined, or None."""
    try:
        kind = event["kind"]
        if kind not in _KINDS:
            return f"invalid: unknown kind {kind!r}, expected one of {sorted(_KINDS)}"
        if not event["run_id"] or not isinstance(event["run_id"], str):
            return f"invalid: run_id {event['run_id']!r} is not a non-empty string"
        if not isinstance(event["attempt"], int):
            return f"invalid: attempt {event['attempt']!r} is not an integer"
        if kind in ("run_start", "run_end"):
            return None
        stage, step, rank, world_size = (
            event["stage"],
            event["step"],
            event["rank"],
            event["world_size"],
        )
        fields: Mapping[str, object] = event
        not_int = [name for name in _INT_FIELDS if not isinstance(fields[name], int)]
        if not_int:
            return f"invalid: {', '.join(not_int)} must be integers"
        if not stage or not isinstance(stage, str):
            return f"invalid: stage {stage!r} is not a non-empty string"
        if "|" in stage:
            return f"invalid: stage {stage!r} contains '|'"
        if step < 0:
            return f"invalid: negative step {step}"
        if world_size < 1:
            return f"invalid: world_size {world_size} < 1"
        if not 0 <= rank < world_size:
            return f"invalid: rank {rank} outside [0, {world_size})"
        not_number = [k for k, v in event["metrics"].items() if not isinstance(v, int | float)]
        if not_number:
            return f"invalid: metrics {not_number} are not numbers"
        if not isinstance(event["tags"], dict) or not isinstance(event["producer_id"], str):
            return "invalid: tags must be a map and producer_id a string"
        too_large = _too_large(event)
        if too_large is not None:
            return f"invalid: {too_large}"
    except KeyError as exc:
        return f"invalid: missing field {exc}"
    except (TypeError, AttributeError) as exc:
        return f"invalid: malformed event ({exc})"
    return None


def _new_group(event: TrainerEvent, now_ns: int) -> GroupState:
    ts = event["timestamp_ns"]
    return {
        "world_size": event["world_size"],
        "arrived_ns": now_ns,
        "first_ts": ts,
        "last_ts": ts,
        "ranks": {},
        "last_rank": event["rank"],
        "last_rank_ts": ts,
        "seen": {},
        "tags": {},
        "closed_by": None,
        "revision": 0,
        "released_ns": None,
        "summary": None,
    }


def _merge(group: GroupState, event: TrainerEvent) -> None:
    """Fold one (non-duplicate) event into the group, in place."""
    rank, seq, ts = event["rank"], event["seq"], event["timestamp_ns"]
    group["seen"].setdefault(event["producer_id"], []).append(seq)
    group["first_ts"] = min(group["first_ts"], ts)
    group["last_ts"] = max(group["last_ts"], ts)
    group["tags"].update(event["tags"])  # a later arrival wins a conflicting tag
    state = group["ranks"].get(str(rank))
    if state is None:
        state = group["ranks"][str(rank)] = {}
        group["last_rank"], group["last_rank_ts"] = rank, ts
    for name, value in event["metrics"].items():
        held = state.get(name)
        if held is None or seq >= held[1]:  # equal seq: the later arrival wins
            state[name] = [float(value), seq]


def _summarize(gkey: str, group: GroupState, now_ns: int) -> StepSummary:
    run_id, attempt, stage, step = gkey.rsplit("|", 3)
    reported = sorted(int(rank) for rank in group["ranks"])
    columns: dict[str, tuple[list[int], list[float]]] = {}
    for rank in reported:  # ascending, so the lowest rank comes first on ties
        for name, (value, _) in group["ranks"][str(rank)].items():
            ranks, values = columns.setdefault(name, ([], []))
            ranks.append(rank)
            values.append(value)
    assert group["closed_by"] is not None
    return {
        "summary_id": summary_id(run_id, int(attempt), stage, int(step), group["revision"]),
        "run_id": run_id,
        "attempt": int(attempt),
        "stage": stage,
        "step": int(step),
        "revision": group["revision"],
        "world_size": group["world_size"],
        "ranks_reported": reported,
        "missing_ranks": sorted(set(range(group["world_size"])).difference(reported)),
        "metrics": {name: _stats(*columns[name]) for name in sorted(columns)},
        "tags": dict(group["tags"]),
        "last_rank": group["last_rank"],
        "last_rank_lag_ns": group["last_rank_ts"] - group["first_ts"],
        "closed_by": group["closed_by"],
        "first_event_ns": group["first_ts"],
        "last_event_ns": group["last_ts"],
        "emitted_ns": now_ns,
    }


def _stats(ranks: list[int], values: list[float]) -> MetricStats:
    """Reduce one metric across ranks; ``ranks`` ascending, aligned with ``values``."""
    low, high = nan_min(values), nan_max(values)
    if math.isnan(low):
        min_rank = max_rank = ranks[next(i for i, v in enumerate(values) if math.isnan(v))]
    else:
        min_rank, max_rank = ranks[values.index(low)], ranks[values.index(high)]
    return {
        "count": len(values),
        "sum": exact_sum(values),
        "mean": exact_mean(values),
        "std": exact_std(values),
        "min": low,
        "max": high,
        "min_rank": min_rank,
        "max_rank": max_rank,
        "non_finite": sum(1 for v in values if not math.isfinite(v)),
    }
