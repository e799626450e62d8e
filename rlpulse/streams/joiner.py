"""Pure step joiner: the events of all ranks of one step, joined into one ``StepSummary``.

A plain object driven by the faust joiner agent, the backtest CLI and the tests; it imports
neither Kafka clients nor faust. All state lives in three mappings passed in by the caller
(faust Tables in the worker, dicts in tests), with JSON-compatible values only (int keys
would come back as strings, so keys are strings)::

    stages[f"{run}|{attempt}|{stage}"] -> JoinerStage
        everything of a stage that is still changing: its unreleased groups (open, or
        closed and waiting for an earlier open step) with their merged events, the
        released steps still retained for late events, the released steps with a revision
        pending, the emitted frontier (highest released step) and the last ranks of recent
        steps (straggler tracking).
    groups[f"{run}|{attempt}|{stage}|{step}"] -> GroupState
        a released group: per rank the winning value and seq of each metric, the
        (producer_id, seq) pairs seen, tags, timestamps, revision, when it was emitted and
        whether late events wait for a revision, so late events recompute it and its
        summary can be rebuilt.
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

Revisions are coalesced. A late event is merged into its released group at once, but only
marks a revision as pending (``pending_ns``: when the first late event since the last
summary arrived; the stage lists the step in ``pending``). The revision is emitted when a
late event makes the group complete (at once), by ``expire`` ``revision_linger_s`` after the
mark, at the run's ``run_end``, or by ``expire`` when the group leaves at the end of its late
window; each emission carries everything merged so far and clears the mark. So a burst of
late ranks costs one revision; apart from the one completing the step and those at
``run_end`` and at the window's end, a step gets at most one revision per linger. The fields
``pending_ns`` and ``pending`` are read with defaults, so state written before them loads.

Crash consistency. A caller that persists the mappings in batches must make ``groups`` and
``runs`` durable before ``stages`` and the summaries before ``groups`` (the worker's
``WorkerApp.commit_order`` does). Then
any persisted state is one from which replaying the not-yet-committed events gives the same
summaries with the same ids: a stage that is behind replays its unreleased groups from their
events (a released group it had not yet recorded is adopted from ``groups``, whose summary is
already out), and everything a persisted record says was emitted has been published. A
pending revision is durable with its group's events (the mark is written with them); a
stage record that missed the mark gets it back when the replayed late event meets the group
as a duplicate, and a listed step whose group is no longer pending is dropped from the list.

Keys come from :mod:`rlpulse.streams.keys`; input is judged by
:func:`rlpulse.schemas.validation.event_problem`, the same check the trainer makes.
"""

from __future__ import annotations

import bisect
import math
import uuid
from collections import Counter
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from rlpulse.rules.arith import exact_mean, exact_std, exact_sum, nan_max, nan_min
from rlpulse.schemas.records import ClosedBy, MetricStats, StepSummary, TrainerEvent
from rlpulse.schemas.validation import event_problem
from rlpulse.settings import EventLimits, JoinerSettings
from rlpulse.streams.keys import (
    event_stage_key,
    group_key,
    run_key,
    split_group_key,
    split_stage_key,
    stage_key_of,
)

__all__ = [
    "SUMMARY_NAMESPACE",
    "GroupState",
    "JoinOutcome",
    "JoinerStage",
    "StepJoiner",
    "summary_id",
]

SUMMARY_NAMESPACE = uuid.UUID("8df55b85-6d5e-4297-8b62-70b55184a79d")
"""uuid5 namespace of ``summary_id``; changing it changes every id."""

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
    pending_ns: NotRequired[int | None]  # now_ns of the first late event not yet emitted


class JoinerStage(TypedDict):
    """Value of ``stages``: one (run, attempt, stage)."""

    groups: dict[str, GroupState]  # str(step) -> unreleased group
    retained: list[list[int]]  # [first, last] runs of consecutive released steps still kept
    frontier: int  # highest released step, -1 before the first
    drained_ns: int | None  # when its last group was deleted
    last_ranks: list[int]  # last rank of each recent complete step, oldest first
    pending: NotRequired[list[int]]  # released steps with a revision pending, ascending


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


class StepJoiner:
    """Joins ``TrainerEvent``s per (run, attempt, stage, step); see the module docstring."""

    def __init__(
        self,
        groups: MutableMapping[str, GroupState],
        stages: MutableMapping[str, JoinerStage],
        runs: MutableMapping[str, list[str]],
        settings: JoinerSettings | None = None,
        limits: EventLimits | None = None,
    ) -> None:
        self._groups = groups
        self._stages = stages
        self._runs = runs
        self._settings = settings if settings is not None else JoinerSettings()
        self._limits = limits if limits is not None else EventLimits()
        self._grace_ns = round(self._settings.grace_s * _SECOND_NS)
        self._late_ns = round(self._settings.late_window_s * _SECOND_NS)
        self._linger_ns = round(self._settings.revision_linger_s * _SECOND_NS)

    def add(self, event: TrainerEvent, now_ns: int) -> JoinOutcome:
        """Merge one event; ``now_ns`` is the wall clock. Never raises for bad input."""
        problem = event_problem(event, self._limits)
        if problem is not None:
            return JoinOutcome(rejected=str(problem))
        if event["kind"] == "run_start":
            return _NOTHING
        if event["kind"] == "run_end":
            return JoinOutcome(self._close_run(run_key(event["run_id"], event["attempt"]), now_ns))

        skey = event_stage_key(event)
        step = event["step"]
        stage = self._stages.get(skey)
        group = None if stage is None else stage["groups"].get(str(step))
        if stage is not None and group is not None:
            return self._add_unreleased(skey, stage, group, event, now_ns)
        released = self._groups.get(group_key(skey, step))
        if released is not None:
            return self._add_late(skey, stage, released, event, now_ns)
        if stage is not None and step <= stage["frontier"]:
            return JoinOutcome(
                rejected=f"too_late: {group_key(skey, step)} is at or below the emitted step "
                f"{stage['frontier']} and its group is no longer retained"
            )
        stage = stage if stage is not None else self._new_stage(skey)
        stage["drained_ns"] = None
        group = stage["groups"][str(step)] = _new_group(event, now_ns)
        return self._add_unreleased(skey, stage, group, event, now_ns)

    def expire(self, now_ns: int, stage_keys: Iterable[str] | None = None) -> list[StepSummary]:
        """Emit due revisions, close groups whose grace ran out, delete those past the window.

        Only the given stage keys if any, else every stage. A revision is due
        ``revision_linger_s`` after its pending mark; a group leaving at the end of its late
        window emits its pending revision first. Only the groups of steps the stage lists as
        pending are read for this, not every retained group. Returns the summaries released:
        per stage the due revisions, then the steps released, then the revisions of the
        groups deleted.
        """
        keys = list(self._stages) if stage_keys is None else list(stage_keys)
        summaries: list[StepSummary] = []
        for skey in keys:
            stage = self._stages.get(skey)
            if stage is None:
                continue
            revised, relisted = self._revise(skey, stage, now_ns, due_only=True)
            summaries += revised
            due = False
            for group in stage["groups"].values():
                if group["closed_by"] is None and now_ns - group["arrived_ns"] >= self._grace_ns:
                    group["closed_by"] = "grace"
                    due = True
            if due:
                summaries += self._settle(skey, stage, now_ns)
            pruned, last = self._prune(skey, stage, now_ns)
            summaries += last
            drained = stage["drained_ns"]
            if drained is not None and now_ns - drained >= self._late_ns:
                self._drop_stage(skey)
            elif due or pruned or relisted:
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

    def _add_unreleased(
        self, skey: str, stage: JoinerStage, group: GroupState, event: TrainerEvent, now_ns: int
    ) -> JoinOutcome:
        if event["world_size"] != group["world_size"]:
            return _world_size_differs(group_key(skey, event["step"]), event, group)
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
        stage: JoinerStage | None,
        group: GroupState,
        event: TrainerEvent,
        now_ns: int,
    ) -> JoinOutcome:
        """An event for a released group: merged, and a revision pending or emitted at once.

        At once when the event completes the group; else the group is marked pending and
        ``expire`` (or ``run_end``) emits it. Refused when too late; nothing for a duplicate.
        """
        step = event["step"]
        gkey = group_key(skey, step)
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
            if group.get("pending_ns") is not None and _list(stage, step):
                # A replay after a crash: the group's mark was persisted, the stage's was not.
                self._stages[skey] = stage
            return _DUPLICATE
        was_complete = len(group["ranks"]) == group["world_size"]
        _merge(group, event)
        if not was_complete and len(group["ranks"]) == group["world_size"]:
            summary = self._emit(gkey, group, now_ns)
            if _unlist(stage, step):
                self._stages[skey] = stage
            return JoinOutcome([summary])
        if group.get("pending_ns") is None:
            group["pending_ns"] = now_ns
        self._groups[gkey] = group
        if _list(stage, step):
            self._stages[skey] = stage
        return _NOTHING

    def _new_stage(self, skey: str) -> JoinerStage:
        rkey, name = split_stage_key(skey)
        self._runs[rkey] = [*self._runs.get(rkey, []), name]
        return {"groups": {}, "retained": [], "frontier": -1, "drained_ns": None, "last_ranks": []}

    def _settle(self, skey: str, stage: JoinerStage, now_ns: int) -> list[StepSummary]:
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
                del window[: -self._settings.straggler_window]
                counts = Counter(window)
                group["stragglers"] = sorted(
                    rank for rank, n in counts.items() if n >= self._settings.straggler_min
                )
            group["released_ns"] = now_ns
            _retain(stage["retained"], step)
            stage["frontier"] = max(stage["frontier"], step)
            released.append(self._emit(group_key(skey, step), group, now_ns))
        return released

    def _emit(self, gkey: str, group: GroupState, now_ns: int) -> StepSummary:
        """Compute the group's next revision and write the group to ``groups``."""
        summary = _revised(gkey, group, now_ns)
        self._groups[gkey] = group
        return summary

    def _revise(
        self, skey: str, stage: JoinerStage, now_ns: int, *, due_only: bool
    ) -> tuple[list[StepSummary], bool]:
        """Emit the stage's pending revisions: those whose linger ran out, or all of them.

        Returns them in step order, and whether ``stage["pending"]`` changed (then the
        caller writes ``stage`` back). A listed step whose group is gone or not pending (the
        stage record was persisted before the group's last emission) is dropped.
        """
        pending = stage.get("pending")
        if not pending:
            return [], False
        summaries: list[StepSummary] = []
        kept: list[int] = []
        for step in pending:
            gkey = group_key(skey, step)
            group = self._groups.get(gkey)
            since = None if group is None else group.get("pending_ns")
            if group is None or since is None:
                continue
            if due_only and now_ns - since < self._linger_ns:
                kept.append(step)
                continue
            summaries.append(self._emit(gkey, group, now_ns))
        if len(kept) == len(pending):
            return summaries, False
        stage["pending"] = kept
        return summaries, True

    def _prune(self, skey: str, stage: JoinerStage, now_ns: int) -> tuple[bool, list[StepSummary]]:
        """Delete retained groups past the late window.

        Returns whether any was deleted, and the revisions the deleted groups still had
        pending (emitted now, before they go).
        """
        retained = stage["retained"]
        pruned = False
        summaries: list[StepSummary] = []
        while retained:  # released in step order, so the oldest come first
            span = retained[0]
            step = span[0]
            gkey = group_key(skey, step)
            group = self._groups.get(gkey)
            released = None if group is None else group["released_ns"]
            if released is not None and now_ns - released < self._late_ns:
                break
            if group is not None:
                if group.get("pending_ns") is not None:
                    summaries.append(_revised(gkey, group, now_ns))
                del self._groups[gkey]
            _unlist(stage, step)
            pruned = True
            span[0] += 1
            if span[0] > span[1]:
                del retained[0]
        if pruned and not (retained or stage["groups"]):
            stage["drained_ns"] = now_ns
        return pruned, summaries

    def _drop_stage(self, skey: str) -> None:
        del self._stages[skey]
        rkey, name = split_stage_key(skey)
        names = [other for other in self._runs.get(rkey, []) if other != name]
        if names:
            self._runs[rkey] = names
        elif rkey in self._runs:
            del self._runs[rkey]

    def _close_run(self, rkey: str, now_ns: int) -> list[StepSummary]:
        """End a run attempt (``run_end``).

        Per stage: emit its pending revisions, then close every open group and release them.
        """
        summaries: list[StepSummary] = []
        for name in self._runs.get(rkey, []):
            skey = stage_key_of(rkey, name)
            stage = self._stages.get(skey)
            if stage is None:
                continue
            revised, relisted = self._revise(skey, stage, now_ns, due_only=False)
            summaries += revised
            unreleased = bool(stage["groups"])
            for group in stage["groups"].values():
                if group["closed_by"] is None:
                    group["closed_by"] = "run_end"
            if unreleased:
                summaries += self._settle(skey, stage, now_ns)
            if relisted or unreleased:
                self._stages[skey] = stage
        return summaries


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


def _list(stage: JoinerStage, step: int) -> bool:
    """Add ``step`` to the stage's pending steps; False if it was listed already."""
    pending = stage.get("pending", [])
    index = bisect.bisect_left(pending, step)
    if index < len(pending) and pending[index] == step:
        return False
    pending.insert(index, step)
    stage["pending"] = pending
    return True


def _unlist(stage: JoinerStage, step: int) -> bool:
    """Remove ``step`` from the stage's pending steps; False if it was not listed."""
    pending = stage.get("pending", [])
    index = bisect.bisect_left(pending, step)
    if index == len(pending) or pending[index] != step:
        return False
    del pending[index]
    return True


def _revised(gkey: str, group: GroupState, now_ns: int) -> StepSummary:
    """Count the group's next revision, clear its pending mark, and summarize it."""
    group["revision"] += 1
    group["emitted_ns"] = now_ns
    group["pending_ns"] = None
    return _summarize(gkey, group)


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
        "pending_ns": None,
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
    run_id, attempt, stage, step = split_group_key(gkey)
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
        "summary_id": summary_id(run_id, attempt, stage, step, group["revision"]),
        "run_id": run_id,
        "attempt": attempt,
        "stage": stage,
        "step": step,
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
    """Reduce one metric across ranks; ``ranks`` ascending, aligned with ``values``.

    Where every value is finite (a finite ``fsum`` without an exception says so: a NaN or
    an infinity would make it NaN, infinite or raise) one sum serves the sum, the mean and
    the variance; the figures are the bits :func:`_stats_by_arith` (which handles NaN,
    infinities and overflow) gives.
    """
    try:
        total = math.fsum(values)
    except (ValueError, OverflowError):
        total = math.nan
    if math.isfinite(total):
        count = len(values)
        low, high = min(values), max(values)
        mean = total / count
        return {
            "count": count,
            "sum": total,
            "mean": mean,
            "std": math.sqrt(exact_sum([(v - mean) * (v - mean) for v in values]) / count),
            "min": low,
            "max": high,
            "min_rank": ranks[values.index(low)],
            "max_rank": ranks[values.index(high)],
            "non_finite": 0,
        }
    return _stats_by_arith(ranks, values)


def _stats_by_arith(ranks: list[int], values: list[float]) -> MetricStats:
    """:func:`_stats` by :mod:`rlpulse.rules.arith`'s reductions, whatever the values."""
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
