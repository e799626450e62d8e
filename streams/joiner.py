"""Pure step joiner: the events of all ranks of one step, joined into one ``StepSummary``.

A plain object driven by the faust joiner agent, the backtest CLI and the tests; it imports
neither Kafka clients nor faust. All state lives in three mappings passed in by the caller
(faust Tables in the worker, dicts in tests), with JSON-compatible values only (int keys
would come back as strings, so keys are strings)::

    stages[f"{run}|{attempt}|{stage}"] -> StageState
        everything of a stage that is still changing: its unreleased groups (open, or
        closed and waiting for an earlier open step) with their merged events, the
        released steps still retained for late events, the emitted frontier (highest
        released step) and the last ranks of recent steps (straggler tracking).
    groups[f"{run}|{attempt}|{stage}|{step}"] -> GroupState
        a released group: per rank the winning value and seq of each metric, the
        (producer_id, seq) pairs seen, tags, timestamps, revision and when it was
        emitted, so late events recompute it and its summary can be rebuilt.
    runs[f"{run}|{attempt}"] -> list[str]
        the stage names of a run attempt, so ``run_end`` finds everything to close.

faust persists a change only on ``table[key] = value`` or ``del table[key]``; a value mutated
in place is lost on restart. Every change here is therefore read, modify, write back.

Life of a group: open (inside its stage) -> closed (``complete``: all ``world_size`` ranks
reported; ``grace``: ``grace_s`` after its first event arrived; ``run_end``) -> released
(revision 1 emitted once every earlier open step of its stage has closed; moved to
``groups``) -> revisions for late events -> deleted ``late_window_s`` after its release. A
stage entry without any group is kept for one more late window, so late events still meet
its frontier and are refused as too late. Keys are split from the right, so ``stage`` must
not contain ``|`` (``run_id`` may).

Crash consistency. A caller that persists the mappings in batches (the worker) must make
``groups`` and ``runs`` durable before ``stages`` and the summaries before ``groups``. Then
any persisted state is one from which replaying the not-yet-committed events gives the same
summaries with the same ids: a stage that is behind replays its unreleased groups from their
events (a released group it had not yet recorded is adopted from ``groups``, whose summary is
already out), and everything a persisted record says was emitted has been published.
"""

from __future__ import annotations

import bisect
import math
import uuid
from collections import Counter
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
    "stage_key",
    "summary_id",
]

SUMMARY_NAMESPACE = uuid.UUID("8df55b85-6d5e-4297-8b62-70b55184a79d")
"""uuid5 namespace of ``summary_id``; changing it changes every id."""

_KINDS = frozenset({"metrics", "log", "run_start", "run_end"})
_INT_FIELDS = ("step", "rank", "world_size", "timestamp_ns", "seq")
_SECOND_NS = 1_000_000_000


class GroupState(TypedDict):
    """One (run, attempt, stage, step): inside its stage while unreleased, then in ``groups``."""

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
    emitted_ns: int  # now_ns of the last summary, 0 before the first
    stragglers: list[int]  # fixed at release from the stage's recent last ranks


class StageState(TypedDict):
    """Value of ``stages``: one (run, attempt, stage)."""

    groups: dict[str, GroupState]  # str(step) -> unreleased group
    retained: list[list[int]]  # [first, last] runs of consecutive released steps still kept
    frontier: int  # highest released step, -1 before the first
    drained_ns: int | None  # when its last group was deleted
    last_ranks: list[int]  # last rank of each recent complete step, oldest first


@dataclass(frozen=True)
class JoinerConfig:
    """Timing, straggler tracking and input limits of the joiner.

    A rank is a straggler of a step when it arrived last in at least ``straggler_min`` of
    the last ``straggler_window`` complete steps of that stage (up to and including it).
    Events beyond the limits are refused: they would make every summary of the run huge.
    """

    grace_s: float = 30.0
    late_window_s: float = 600.0
    straggler_window: int = 10
    straggler_min: int = 5
    max_world_size: int = 65_536
    max_metrics: int = 1_024
    max_tags: int = 64
    max_name_chars: int = 256

    def __post_init__(self) -> None:
        if self.grace_s < 0 or self.late_window_s < 0:
            raise ValueError(
                f"grace_s and late_window_s must be >= 0, got {self.grace_s}, {self.late_window_s}"
            )
        if not 1 <= self.straggler_min <= self.straggler_window:
            raise ValueError(
                f"need 1 <= straggler_min <= straggler_window, got {self.straggler_min}, "
                f"{self.straggler_window}"
            )
        limits = (self.max_world_size, self.max_metrics, self.max_tags, self.max_name_chars)
        if min(limits) < 1:
            raise ValueError(f"input limits must be >= 1, got {limits}")


@dataclass(frozen=True)
class JoinOutcome:
    """What one event did: summaries to publish now (in order), or why it goes to the DLQ."""

    summaries: list[StepSummary] = field(default_factory=list)
    rejected: str | None = None
    duplicate: bool = False


_NOTHING = JoinOutcome()
_DUPLICATE = JoinOutcome(duplicate=True)


def summary_id(run_id: str, attempt: int, stage: str, step: int, revision: int) -> str:
    """Deterministic id of one revision of one step's summary."""
    name = "\x1f".join((run_id, str(attempt), stage, str(step), str(revision)))
    return str(uuid.uuid5(SUMMARY_NAMESPACE, name))


def stage_key(event: TrainerEvent) -> str:
    """The key in ``stages`` of the (run, attempt, stage) of an event."""
    return f"{event['run_id']}|{event['attempt']}|{event['stage']}"


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
        self._config = config
        self._grace_ns = round(config.grace_s * _SECOND_NS)
        self._late_ns = round(config.late_window_s * _SECOND_NS)

    def add(self, event: TrainerEvent, now_ns: int) -> JoinOutcome:
        """Merge one event; ``now_ns`` is the wall clock. Never raises for bad input."""
        problem = _invalid(event, self._config)
        if problem is not None:
            return JoinOutcome(rejected=problem)
        if event["kind"] == "run_start":
            return _NOTHING
        if event["kind"] == "run_end":
            return JoinOutcome(self._close_run(f"{event['run_id']}|{event['attempt']}", now_ns))

        skey = stage_key(event)
        step = event["step"]
        stage = self._stages.get(skey)
        group = None if stage is None else stage["groups"].get(str(step))
        if stage is not None and group is not None:
            return self._add_unreleased(skey, stage, group, event, now_ns)
        released = self._groups.get(f"{skey}|{step}")
        if released is not None:
            return self._add_late(skey, stage, released, event, now_ns)
        if stage is not None and step <= stage["frontier"]:
            return JoinOutcome(
                rejected=f"too_late: {skey}|{step} is at or below the emitted step "
                f"{stage['frontier']} and its group is no longer retained"
            )
        stage = stage if stage is not None else self._new_stage(skey)
        stage["drained_ns"] = None
        group = stage["groups"][str(step)] = _new_group(event, now_ns)
        return self._add_unreleased(skey, stage, group, event, now_ns)

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
            due = False
            for group in stage["groups"].values():
                if group["closed_by"] is None and now_ns - group["arrived_ns"] >= self._grace_ns:
                    group["closed_by"] = "grace"
                    due = True
            if due:
                summaries += self._settle(skey, stage, now_ns)
            pruned = self._prune(skey, stage, now_ns)
            drained = stage["drained_ns"]
            if drained is not None and now_ns - drained >= self._late_ns:
                self._drop_stage(skey)
            elif due or pruned:
                self._stages[skey] = stage
        return summaries

    def restart_grace(self, stage_keys: Iterable[str], now_ns: int) -> int:
        """Give every open group of these stages a fresh grace period from ``now_ns``.

        A worker taking over a partition calls this: the grace clock measures how long a
        watching worker waited for missing ranks, not how long no worker was watching (their
        events may be in the backlog it is about to read). Returns how many groups it reset.
        """
        reset = 0
        for skey in stage_keys:
            stage = self._stages.get(skey)
            if stage is None:
                continue
            open_groups = [g for g in stage["groups"].values() if g["closed_by"] is None]
            for group in open_groups:
                group["arrived_ns"] = max(group["arrived_ns"], now_ns)
            if open_groups:
                self._stages[skey] = stage
                reset += len(open_groups)
        return reset

    def open_stage_keys(self) -> list[str]:
        """Stage keys with at least one unreleased group (the ones ``expire`` may close), sorted."""
        return sorted(key for key in list(self._stages) if self._stages[key]["groups"])

    def _add_unreleased(
        self, skey: str, stage: StageState, group: GroupState, event: TrainerEvent, now_ns: int
    ) -> JoinOutcome:
        if event["world_size"] != group["world_size"]:
            return _world_size_differs(f"{skey}|{event['step']}", event, group)
        if _seen(group, event):
            return _DUPLICATE
        _merge(group, event)
        summaries: list[StepSummary] = []
        if group["closed_by"] is None and len(group["ranks"]) == group["world_size"]:
            group["closed_by"] = "complete"
            summaries = self._settle(skey, stage, now_ns)
        self._stages[skey] = stage
        return JoinOutcome(summaries) if summaries else _NOTHING

    def _add_late(
        self,
        skey: str,
        stage: StageState | None,
        group: GroupState,
        event: TrainerEvent,
        now_ns: int,
    ) -> JoinOutcome:
        """An event for a released group: a new revision, unless too late or a duplicate."""
        step = event["step"]
        gkey = f"{skey}|{step}"
        released = group["released_ns"]
        if released is not None and now_ns - released >= self._late_ns:
            return JoinOutcome(
                rejected=f"too_late: {gkey} was emitted {(now_ns - released) / _SECOND_NS:.0f}"
                f" s ago, beyond the late window of {self._late_ns / _SECOND_NS:g} s"
            )
        if event["world_size"] != group["world_size"]:
            return _world_size_differs(gkey, event, group)
        if stage is None or step > stage["frontier"]:
            # The stage was persisted before this group's release: adopt it (its summary is out).
            stage = stage if stage is not None else self._new_stage(skey)
            _retain(stage["retained"], step)
            stage["frontier"] = max(stage["frontier"], step)
            stage["drained_ns"] = None
            self._stages[skey] = stage
        if _seen(group, event):
            return _DUPLICATE
        _merge(group, event)
        return JoinOutcome([self._emit(gkey, group, now_ns)])

    def _new_stage(self, skey: str) -> StageState:
        rkey, name = skey.rsplit("|", 1)
        self._runs[rkey] = [*self._runs.get(rkey, []), name]
        return {"groups": {}, "retained": [], "frontier": -1, "drained_ns": None, "last_ranks": []}

    def _settle(self, skey: str, stage: StageState, now_ns: int) -> list[StepSummary]:
        """Release closed groups in step order up to the first open one.

        The caller writes ``stage`` back.
        """
        released: list[StepSummary] = []
        unreleased = stage["groups"]
        for key in sorted(unreleased, key=int):
            group = unreleased[key]
            if group["closed_by"] is None:
                break
            del unreleased[key]
            step = int(key)
            if group["closed_by"] == "complete" and group["world_size"] > 1:
                window = stage["last_ranks"]
                window.append(group["last_rank"])
                del window[: -self._config.straggler_window]
                counts = Counter(window)
                group["stragglers"] = sorted(
                    rank for rank, n in counts.items() if n >= self._config.straggler_min
                )
            group["released_ns"] = now_ns
            _retain(stage["retained"], step)
            stage["frontier"] = max(stage["frontier"], step)
            released.append(self._emit(f"{skey}|{step}", group, now_ns))
        return released

    def _emit(self, gkey: str, group: GroupState, now_ns: int) -> StepSummary:
        """Compute the group's next revision and write the group to ``groups``."""
        group["revision"] += 1
        group["emitted_ns"] = now_ns
        self._groups[gkey] = group
        return _summarize(gkey, group)

    def _prune(self, skey: str, stage: StageState, now_ns: int) -> bool:
        """Delete retained groups past the late window; True if any was deleted."""
        retained = stage["retained"]
        pruned = False
        while retained:  # released in step order, so the oldest come first
            span = retained[0]
            gkey = f"{skey}|{span[0]}"
            group = self._groups.get(gkey)
            released = None if group is None else group["released_ns"]
            if released is not None and now_ns - released < self._late_ns:
                break
            if group is not None:
                del self._groups[gkey]
            pruned = True
            span[0] += 1
            if span[0] > span[1]:
                del retained[0]
        if pruned and not (retained or stage["groups"]):
            stage["drained_ns"] = now_ns
        return pruned

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
            if stage is None or not stage["groups"]:
                continue
            for group in stage["groups"].values():
                if group["closed_by"] is None:
                    group["closed_by"] = "run_end"
            summaries += self._settle(skey, stage, now_ns)
            self._stages[skey] = stage
        return summaries


def _invalid(event: TrainerEvent, config: JoinerConfig) -> str | None:
    """Why the event cannot be joined, or None."""
    try:
        kind = event["kind"]
        if kind not in _KINDS:
            return f"invalid: unknown kind {kind!r}, expected one of {sorted(_KINDS)}"
        run_id = event["run_id"]
        if not run_id or not isinstance(run_id, str):
            return f"invalid: run_id {run_id!r} is not a non-empty string"
        if len(run_id) > config.max_name_chars:
            return f"too_large: run_id of {len(run_id)} chars > {config.max_name_chars}"
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
        if world_size > config.max_world_size:
            return f"too_large: world_size {world_size} > {config.max_world_size}"
        if not 0 <= rank < world_size:
            return f"invalid: rank {rank} outside [0, {world_size})"
        metrics, tags, producer_id = event["metrics"], event["tags"], event["producer_id"]
        not_number = [k for k, v in metrics.items() if not isinstance(v, int | float)]
        if not_number:
            return f"invalid: metrics {not_number} are not numbers"
        if not isinstance(tags, dict) or not isinstance(producer_id, str):
            return "invalid: tags must be a map and producer_id a string"
        if len(metrics) > config.max_metrics or len(tags) > config.max_tags:
            return (
                f"too_large: {len(metrics)} metrics and {len(tags)} tags, at most "
                f"{config.max_metrics} and {config.max_tags}"
            )
        longest = max(
            (len(s) for s in (stage, producer_id, *metrics, *tags, *tags.values())), default=0
        )
        if longest > config.max_name_chars:
            return f"too_large: a name or tag of {longest} chars > {config.max_name_chars}"
    except KeyError as exc:
        return f"invalid: missing field {exc}"
    except (TypeError, AttributeError) as exc:
        return f"invalid: malformed event ({exc})"
    return None


def _retain(spans: list[list[int]], step: int) -> None:
    """Add ``step`` to sorted, disjoint [first, last] runs of steps, merging neighbours."""
    if not spans or step > spans[-1][1] + 1:
        spans.append([step, step])
        return
    if step == spans[-1][1] + 1:
        spans[-1][1] = step
        return
    index = bisect.bisect_left(spans, [step + 1])  # first span starting after step
    if index and spans[index - 1][1] >= step:
        return
    joins_left = bool(index) and spans[index - 1][1] == step - 1
    joins_right = index < len(spans) and spans[index][0] == step + 1
    if joins_left and joins_right:
        spans[index - 1][1] = spans[index][1]
        del spans[index]
    elif joins_left:
        spans[index - 1][1] = step
    elif joins_right:
        spans[index][0] = step
    else:
        spans.insert(index, [step, step])


def _world_size_differs(gkey: str, event: TrainerEvent, group: GroupState) -> JoinOutcome:
    return JoinOutcome(
        rejected=f"invalid: world_size {event['world_size']} differs from the "
        f"{group['world_size']} of {gkey}"
    )


def _seen(group: GroupState, event: TrainerEvent) -> bool:
    return event["seq"] in group["seen"].get(event["producer_id"], ())


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
        "emitted_ns": 0,
        "stragglers": [],
    }


def _merge(group: GroupState, event: TrainerEvent) -> None:
    """Fold one (non-duplicate) event into the group, in place."""
    rank, seq, ts = event["rank"], event["seq"], event["timestamp_ns"]
    group["seen"].setdefault(event["producer_id"], []).append(seq)
    group["first_ts"] = min(group["first_ts"], ts)
    group["last_ts"] = max(group["last_ts"], ts)
    if event["tags"]:
        group["tags"].update(event["tags"])  # a later arrival wins a conflicting tag
    state = group["ranks"].get(str(rank))
    if state is None:
        state = group["ranks"][str(rank)] = {}
        group["last_rank"], group["last_rank_ts"] = rank, ts
    for name, value in event["metrics"].items():
        held = state.get(name)
        if held is None or seq >= held[1]:  # equal seq: the later arrival wins
            state[name] = [float(value), seq]


def _summarize(gkey: str, group: GroupState) -> StepSummary:
    """The group's summary as of its last emission: the same bytes whenever rebuilt."""
    run_id, attempt, stage, step = gkey.rsplit("|", 3)
    reported = sorted(int(rank) for rank in group["ranks"])
    columns: dict[str, tuple[list[int], list[float]]] = {}
    for rank in reported:  # ascending, so the lowest rank comes first on ties
        for name, (value, _) in group["ranks"][str(rank)].items():
            ranks, values = columns.setdefault(name, ([], []))
            ranks.append(rank)
            values.append(value)
    assert group["closed_by"] is not None
    world_size = group["world_size"]
    return {
        "summary_id": summary_id(run_id, int(attempt), stage, int(step), group["revision"]),
        "run_id": run_id,
        "attempt": int(attempt),
        "stage": stage,
        "step": int(step),
        "revision": group["revision"],
        "world_size": world_size,
        "ranks_reported": reported,
        "missing_ranks": (
            [] if len(reported) == world_size else sorted(set(range(world_size)) - set(reported))
        ),
        "metrics": {name: _stats(*columns[name]) for name in sorted(columns)},
        "tags": dict(group["tags"]),
        "last_rank": group["last_rank"],
        "last_rank_lag_ns": group["last_rank_ts"] - group["first_ts"],
        "stragglers": list(group["stragglers"]),
        "closed_by": group["closed_by"],
        "first_event_ns": group["first_ts"],
        "last_event_ns": group["last_ts"],
        "emitted_ns": group["emitted_ns"],
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
