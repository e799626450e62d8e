"""Silence rules: a run, or a stage, that has started no step for too long.

A hung run sends no summaries, so no metric rule fires on it. A ``silent`` rule fires on the
clock instead (docs/design.md, "Silence"):

- **activity** is a step started: the first ``metrics`` event of a step above the newest one
  the stage (or the run, for a rule without a stage) has started, at the time the pipeline
  took it (``now_ns``: the worker's clock, the backtest's event time). Samples (stage
  ``system``) and text records are not activity: a hung run still sends both. A step that
  closes by grace does not reset the clock either: its start already did.
- **the bound** is ``max(factor x the median time per step over the last 20 starts,
  floor_s)``, ``floor_s`` alone until two steps have started.
- **once per silence**: the command's id comes from the rule and the newest step started, and
  the state remembers that step, so the rule fires again only after a new step started and
  that one went quiet too; a worker that restarts and re-fires issues the same id.
- a run attempt that was stopped or has ended is never silent.

The pace is kept in the run attempt's :class:`~rlpulse.rules.state.RunState` (``pace``,
``silences``), so it survives a restart with the rest of the rule state.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping
from typing import Final

from rlpulse.rules.ids import command_id
from rlpulse.rules.model import Rule, format_number
from rlpulse.rules.state import Pace, RunState
from rlpulse.schemas.records import Action, ControlCommand

__all__ = ["RUN_WIDE", "SILENCE_WORDS", "due_ns", "note_start", "silences"]

RUN_WIDE: Final = "*"
"""The pace key of the whole run: the newest step any stage started."""
STARTS_KEPT: Final = 21
"""Step starts kept per stage: 20 intervals give the median step time."""
_SECOND_NS: Final = 1_000_000_000
SILENCE_WORDS: Final = "started no step for"
"""In the reason of every silence command (the run page finds them by it)."""


def note_start(
    state: RunState, stage: str, step: int, now_ns: int, tags: Mapping[str, str]
) -> bool:
    """Record that ``stage`` has an event of ``step`` at ``now_ns``; True if it is a new start."""
    paces = state.setdefault("pace", {})
    changed = False
    for key in (stage, RUN_WIDE):
        pace = paces.get(key)
        if pace is not None and step <= pace["step"]:
            continue
        starts = [*(pace["starts"] if pace is not None else []), [step, now_ns]]
        paces[key] = {
            "stage": stage,
            "step": step,
            "started_ns": now_ns,
            "starts": starts[-STARTS_KEPT:],
        }
        changed = True
    if changed and tags and not state.get("tags"):
        state["tags"] = dict(tags)
    return changed


def median_step_s(pace: Pace) -> float | None:
    """The median time per step between the recent starts (None: fewer than two)."""
    starts = pace["starts"]
    per_step = [
        (later_ns - earlier_ns) / (later - earlier) / _SECOND_NS
        for (earlier, earlier_ns), (later, later_ns) in itertools.pairwise(starts)
        if later > earlier
    ]
    return statistics.median(per_step) if per_step else None


def bound_s(rule: Rule, pace: Pace) -> float:
    """How long ``rule`` lets the run (or stage) go without a new step."""
    assert rule.silent is not None
    median = median_step_s(pace)
    floor = rule.silent.floor_s
    return floor if median is None else max(rule.silent.factor * median, floor)


def _watched(rules: Iterable[Rule], state: RunState) -> Iterable[tuple[Rule, Pace]]:
    """The silence rules that watch this run attempt, each with the pace it watches."""
    if state["stopped_by"] is not None or state.get("ended"):
        return
    tags = state.get("tags") or {}
    paces = state.get("pace") or {}
    for rule in rules:
        if rule.match is not None and any(tags.get(k) != v for k, v in rule.match.tags.items()):
            continue
        pace = paces.get(rule.stage or RUN_WIDE)
        if pace is None:
            continue
        fired = (state.get("silences") or {}).get(rule.id)
        if fired is not None and (rule.once or fired["step"] == pace["step"]):
            continue
        yield rule, pace


def _due_ns(rule: Rule, pace: Pace) -> int:
    """The first time at which ``rule`` finds this pace silent."""
    return pace["started_ns"] + round(bound_s(rule, pace) * _SECOND_NS) + 1


def due_ns(rules: Iterable[Rule], state: RunState) -> int | None:
    """When the first of ``rules`` becomes due for this run attempt (None: none watches it)."""
    return min((_due_ns(rule, pace) for rule, pace in _watched(rules, state)), default=None)


def silences(rules: Iterable[Rule], state: RunState, now_ns: int) -> list[ControlCommand]:
    """The commands of the silence rules that are due at ``now_ns``; records them in ``state``."""
    commands: list[ControlCommand] = []
    for rule, pace in list(_watched(rules, state)):
        if now_ns < _due_ns(rule, pace):
            continue
        bound = bound_s(rule, pace)
        quiet_s = (now_ns - pace["started_ns"]) / _SECOND_NS
        state.setdefault("silences", {})[rule.id] = {"step": pace["step"], "issued_ns": now_ns}
        actions: list[Action] = [
            {"type": action.type, "params": action.params.wire_params()} for action in rule.actions
        ]
        median = median_step_s(pace)
        evidence = {"value": quiet_s, "threshold": bound, "last_step": float(pace["step"])}
        if median is not None:
            evidence["median_step_s"] = median
        commands.append(
            {
                "command_id": command_id(
                    state["run_id"], state["attempt"], pace["stage"], rule, pace["step"]
                ),
                "run_id": state["run_id"],
                "attempt": state["attempt"],
                "stage": pace["stage"],
                "step": pace["step"],
                "origin": "rule",
                "rule_id": rule.id,
                "rule_version": rule.version,
                "dry_run": rule.mode == "dry_run",
                "actions": actions,
                "reason": _reason(rule, pace, quiet_s, bound, median),
                "evidence": evidence,
                "issued_ns": now_ns,
            }
        )
    return commands


def _reason(rule: Rule, pace: Pace, quiet_s: float, bound: float, median: float | None) -> str:
    """One sentence: what went quiet, for how long, and the bound it passed.

    ``the run started no step for 312 s since step 41; more than max(5 x median step time
    12.3 s, 120 s) = 120 s``
    """
    assert rule.silent is not None
    what = "the run" if rule.stage is None else f"stage {rule.stage}"
    floor = format_number(rule.silent.floor_s)
    if median is None:
        limit = f"more than {floor} s (fewer than two steps to time)"
    else:
        factor = format_number(rule.silent.factor)
        limit = (
            f"more than max({factor} x median step time {median:.3g} s, {floor} s) = {bound:.4g} s"
        )
    return f"{what} {SILENCE_WORDS} {quiet_s:.0f} s since step {pace['step']}; {limit}"
