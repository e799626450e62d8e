"""The pure rule evaluator: (rules, state, summary) -> (state, commands).

:class:`RuleEngine` holds only the rules. The state of a run attempt is a plain dict (see
:mod:`rlpulse.rules.state`) that the caller keeps -- a faust Table in the worker, a dict in
the backtest -- and hands back with the next summary of that run attempt. The semantics are
those of docs/design.md, "Rules"; :meth:`_RuleEvaluator.evaluate` holds the per-rule part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from rlpulse.rules import silence
from rlpulse.rules.arith import WINDOW_STATS
from rlpulse.rules.ids import COMMAND_NAMESPACE, command_id
from rlpulse.rules.model import (
    Comparison,
    Condition,
    NonFinite,
    Outside,
    Rule,
    RuleSet,
    reduction_of,
)
from rlpulse.rules.model import format_number as _exact
from rlpulse.rules.state import (
    Point,
    RuleState,
    RunState,
    StageState,
    Status,
    check_run_state,
    new_run_state,
)
from rlpulse.rules.verdicts import open_check

__all__ = ["COMMAND_NAMESPACE", "MISSING_RANKS", "Firing", "RuleEngine", "command_id"]
from rlpulse.schemas.records import (
    READING_STAGES,
    Action,
    ControlCommand,
    MetricStats,
    StepSummary,
)

MISSING_RANKS: Final = "(missing ranks)"
"""What a ``missing_ranks`` rule's state binds to instead of a metric."""


@dataclass(frozen=True)
class Firing:
    """What a rule saw when it fired: the input of the command it issues."""

    rule: Rule
    metric: str
    step: int
    value: float  # the value compared: the reduction, the window statistic, the ranks missing
    stats: MetricStats | None  # the metric at this step (None: a missing_ranks rule)
    window: tuple[Point, ...]  # the reduced values the window statistic was computed over
    streak: tuple[Point, ...]  # the last for_steps evaluations whose value held
    ranks: tuple[int, ...] = ()  # a missing_ranks rule: the ranks missing from every step


class _RuleEvaluator:
    """One rule, ready to evaluate; it keeps no state of its own."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.version = rule.version
        when = rule.when
        self._reduction = reduction_of(rule.across_ranks, when) if when is not None else "mean"
        over = rule.over_steps
        self._window_size = over.window if over is not None else 0
        self._window_stat = WINDOW_STATS[over.stat] if over is not None else None

    def applies_to(self, summary: StepSummary) -> bool:
        """Whether the rule watches this stage and the run has the tags of ``match``."""
        if self.rule.stage is not None and self.rule.stage != summary["stage"]:
            return False
        if (
            self.rule.stage is None
            and self.rule.missing_ranks
            and summary["stage"] in READING_STAGES
        ):
            return False  # each rank samples at its own pace: a sample's "missing" says nothing
        if self.rule.match is None:
            return True
        tags = summary.get("tags") or {}
        return all(tags.get(key) == value for key, value in self.rule.match.tags.items())

    def load(self, stored: dict[str, object] | None) -> RuleState:
        """Return the stored state, or a fresh one if there is none or the rule changed since."""
        if stored is None or stored.get("version") != self.version:
            return RuleState(version=self.version)
        return RuleState.from_dict(stored)

    def evaluate(self, state: RuleState, summary: StepSummary, *, stopped: bool) -> Firing | None:
        """Evaluate the rule on one new summary; update ``state``; return the firing, if any.

        Not an evaluation (state untouched) unless the summary carries the bound metric.
        Otherwise: reduce across ranks, push into the window, test the condition (a window
        that is not full counts as not holding), count consecutive holds, and fire when
        for_steps held and nothing blocks: cooldown, once, or the run attempt's stop
        (``stopped``). A blocked rule keeps counting. Firing resets the count.
        """
        rule, step = self.rule, summary["step"]
        stats: MetricStats | None = None
        if rule.missing_ranks is not None:
            state.metric = MISSING_RANKS
            state.evaluations += 1
            value: float | None = self._missing(state, summary["missing_ranks"])
            holds = value is not None
        else:
            metrics = summary["metrics"]
            if state.metric is None:  # an alias list binds to the first name of the first carrier
                state.metric = next((name for name in rule.metrics if name in metrics), None)
            if state.metric is None or state.metric not in metrics:
                return None
            stats = metrics[state.metric]
            state.evaluations += 1
            value = self._observe(state, step, float(stats[self._reduction]))
            holds = value is not None and rule.when is not None and rule.when.holds(value)

        if value is None or not holds:
            state.status = Status.INACTIVE
            state.streak, state.streak_length, state.active_since_step = [], 0, None
            return None
        if state.streak_length == 0:
            state.active_since_step = step
        state.streak_length += 1
        state.streak = [*state.streak, (step, value)][-rule.for_steps :]
        if state.streak_length < rule.for_steps:
            state.status = Status.PENDING
            return None
        cooling = (
            state.last_fired_evaluation is not None
            and state.evaluations - state.last_fired_evaluation <= rule.cooldown_steps
        )
        if stopped or cooling or (rule.once and state.fired_count > 0):
            state.status = Status.BLOCKED
            return None

        firing = Firing(
            rule,
            state.metric,
            step,
            value,
            stats,
            tuple(state.window),
            tuple(state.streak),
            tuple(state.ranks),
        )
        state.status = Status.FIRED
        state.fired_count += 1
        state.last_fired_evaluation, state.last_fired_step = state.evaluations, step
        state.streak, state.streak_length, state.active_since_step = [], 0, None
        return firing

    def _missing(self, state: RuleState, missing: list[int]) -> float | None:
        """How many ranks were missing from every step of the streak, with this one.

        None if fewer than ``at_least`` (then the streak starts again here, if this step alone
        has enough).
        """
        assert self.rule.missing_ranks is not None
        at_least = self.rule.missing_ranks.at_least
        still = sorted(set(state.ranks) & set(missing)) if state.streak_length else []
        if len(still) < at_least:
            state.streak, state.streak_length, state.active_since_step = [], 0, None
            still = sorted(missing)
        state.ranks = still if len(still) >= at_least else []
        return float(len(still)) if state.ranks else None

    def _observe(self, state: RuleState, step: int, value: float) -> float | None:
        """Return the value to compare: ``value``, or the window statistic once it is full."""
        if self._window_stat is None:
            return value
        state.window = [*state.window, (step, value)][-self._window_size :]
        if len(state.window) < self._window_size:
            return None
        steps = [float(point[0]) for point in state.window]
        return self._window_stat(steps, [point[1] for point in state.window])


class RuleEngine:
    """Evaluates a :class:`RuleSet` over step summaries; the caller keeps the state."""

    def __init__(self, ruleset: RuleSet) -> None:
        self._ruleset = ruleset
        self._evaluators = tuple(
            _RuleEvaluator(rule) for rule in ruleset.rules if rule.silent is None
        )
        self._silent = tuple(rule for rule in ruleset.rules if rule.silent is not None)

    @property
    def ruleset(self) -> RuleSet:
        """The rules this engine evaluates."""
        return self._ruleset

    @property
    def rules(self) -> tuple[Rule, ...]:
        """The rules, in file order (the order they are evaluated in)."""
        return tuple(self._ruleset.rules)

    @property
    def watches_silence(self) -> bool:
        """Whether a rule fires on silence (then :meth:`silences` has work to do)."""
        return bool(self._silent)

    def silences(self, state: RunState, now_ns: int) -> list[ControlCommand]:
        """The commands of the silence rules due for this run attempt at ``now_ns``.

        The firings are recorded in ``state`` (once per silence; :mod:`rlpulse.rules.silence`).
        """
        return silence.silences(self._silent, state, now_ns)

    def silence_due_ns(self, state: RunState) -> int | None:
        """When a silence rule is next due for this run attempt (None: none watches it)."""
        return silence.due_ns(self._silent, state)

    def new_state(self, run_id: str, attempt: int) -> RunState:
        """Return an empty state for a run attempt (``evaluate`` makes one from ``None``)."""
        return new_run_state(run_id, attempt)

    def evaluate(
        self, state: RunState | None, summary: StepSummary, now_ns: int
    ) -> tuple[RunState, list[ControlCommand]]:
        """Evaluate the rules on one summary of a run attempt.

        ``state`` is that run attempt's state (``None`` for the first summary); it is
        updated in place and returned, with the commands to publish in file order. Only
        revision 1 of a step is evaluated, and each (stage, step) only once: revisions and
        re-emitted summaries (step at or below the stage's last evaluated step) change
        nothing. Raises :class:`~rlpulse.rules.exceptions.RuleStateError` for a state of
        another run attempt.
        """
        run_id, attempt = summary["run_id"], summary["attempt"]
        run = new_run_state(run_id, attempt) if state is None else state
        run = check_run_state(run, run_id, attempt)
        if summary["revision"] != 1:
            return run, []
        evaluators = [e for e in self._evaluators if e.applies_to(summary)]
        stage_name, step = summary["stage"], summary["step"]
        stage = run["stages"].get(stage_name)
        if not evaluators or (stage is not None and step <= stage["last_step"]):
            return run, []
        if stage is None:
            stage = run["stages"][stage_name] = StageState(last_step=step, rules={})
        stage["last_step"] = step

        commands: list[ControlCommand] = []
        for evaluator in evaluators:
            rule_state = evaluator.load(stage["rules"].get(evaluator.rule.id))
            firing = evaluator.evaluate(rule_state, summary, stopped=run["stopped_by"] is not None)
            if rule_state.metric is not None:
                stage["rules"][evaluator.rule.id] = rule_state.to_dict()
            if firing is None:
                continue
            command = _command(firing, summary, now_ns)
            commands.append(command)
            open_check(run, firing.rule, firing.metric, command)
            if firing.rule.stops and not command["dry_run"]:
                run["stopped_by"] = {
                    "command_id": command["command_id"],
                    "rule_id": firing.rule.id,
                    "stage": stage_name,
                    "step": step,
                }
        return run, commands


# -- commands --------------------------------------------------------------------------------


def _command(firing: Firing, summary: StepSummary, now_ns: int) -> ControlCommand:
    rule = firing.rule
    actions: list[Action] = [
        {"type": action.type, "params": action.params.wire_params()} for action in rule.actions
    ]
    return {
        "command_id": command_id(
            summary["run_id"], summary["attempt"], summary["stage"], rule, firing.step
        ),
        "run_id": summary["run_id"],
        "attempt": summary["attempt"],
        "stage": summary["stage"],
        "step": firing.step,
        "origin": "rule",
        "rule_id": rule.id,
        "rule_version": rule.version,
        "dry_run": rule.mode == "dry_run",
        "actions": actions,
        "reason": _reason(firing, summary["world_size"]),
        "evidence": _evidence(firing),
        "issued_ns": now_ns,
    }


def _evidence(firing: Firing) -> dict[str, float]:
    """``value``, the threshold(s), and the values behind the decision as ``step_<n>``."""
    when = firing.rule.when
    evidence = {"value": firing.value}
    if firing.rule.missing_ranks is not None:
        evidence["threshold"] = firing.rule.missing_ranks.at_least
        evidence.update((f"rank_{rank}", 1.0) for rank in firing.ranks)
        evidence.update((f"step_{step}", value) for step, value in firing.streak)
        return evidence
    if isinstance(when, Comparison):
        evidence["threshold"] = when.threshold
    elif isinstance(when, Outside):
        evidence["low"], evidence["high"] = when.low, when.high
    over = firing.rule.over_steps
    if over is None:
        evidence.update((f"step_{step}", value) for step, value in firing.streak)
        return evidence
    evidence.update((f"step_{step}", value) for step, value in firing.window)
    if firing.rule.for_steps > 1:
        evidence.update((f"{over.stat}_step_{step}", value) for step, value in firing.streak)
    return evidence


def _reason(firing: Firing, world_size: int) -> str:
    """One sentence with the evidence, readable without the rules file.

    ``kl_divergence 0.412 > 0.3 for 3 consecutive steps (38, 39, 40); mean over 8 ranks,
    worst rank 5`` or ``var of reward_mean over the last 5 steps (16..20) = 0.73 > 0.5;
    mean over 8 ranks``.
    """
    rule, when = firing.rule, firing.rule.when
    if rule.missing_ranks is not None or when is None:
        return _missing_reason(firing, world_size)
    shown = _show(firing.value, when)
    test = f"is {shown}" if isinstance(when, NonFinite) else f"{shown} {when}"
    if rule.over_steps is None:
        text = f"{firing.metric} {test}"
    else:
        first, last = firing.window[0][0], firing.window[-1][0]
        text = (
            f"{rule.over_steps.stat} of {firing.metric} over the last {len(firing.window)} "
            f"steps ({first}..{last}) = {shown}"
        )
        text = f"{text} {when}" if not isinstance(when, NonFinite) else f"{text}, non-finite"
    if rule.for_steps > 1:
        steps = ", ".join(str(step) for step, _ in firing.streak)
        text += f" for {rule.for_steps} consecutive steps ({steps})"
    elif rule.over_steps is None:
        text += f" at step {firing.step}"
    return f"{text}; {_ranks(firing, world_size)}"


def _missing_reason(firing: Firing, world_size: int) -> str:
    """``ranks 2, 5 of 8 missing from 3 consecutive steps (38, 39, 40)``."""
    ranks = ", ".join(str(rank) for rank in firing.ranks)
    noun = "rank" if len(firing.ranks) == 1 else "ranks"
    steps = [step for step, _ in firing.streak]
    if len(steps) == 1:
        return f"{noun} {ranks} of {world_size} missing from step {steps[0]}"
    shown = ", ".join(str(step) for step in steps)
    return f"{noun} {ranks} of {world_size} missing from {len(steps)} consecutive steps ({shown})"


def _ranks(firing: Firing, world_size: int) -> str:
    """How the ranks were reduced: ``mean over 8 ranks, worst rank 5``."""
    stats, rule = firing.stats, firing.rule
    assert stats is not None
    count = stats["count"]
    if count == 1:
        return f"reported by rank {stats['min_rank']} only"
    ranks = f"{count} ranks" if count >= world_size else f"{count} of {world_size} ranks"
    how = rule.across_ranks
    text = f"worst of {ranks}" if how == "worst" else f"{how} over {ranks}"
    if rule.over_steps is not None:
        return text
    rank = _rank_behind(firing)
    if rank is not None:
        text += f" (rank {rank})" if how in ("min", "max", "worst") else f", worst rank {rank}"
    if stats["non_finite"]:
        text += f", {stats['non_finite']} non-finite"
    return text


def _rank_behind(firing: Firing) -> int | None:
    """Return the rank whose value drove the decision, when the stats name it."""
    stats, rule, when = firing.stats, firing.rule, firing.rule.when
    assert stats is not None
    if rule.across_ranks in ("min", "max"):
        return stats["min_rank"] if rule.across_ranks == "min" else stats["max_rank"]
    if isinstance(when, Comparison) and when.op in (">", ">=", "<", "<="):
        return stats["max_rank"] if when.op.startswith(">") else stats["min_rank"]
    if isinstance(when, Outside) and not math.isnan(firing.value):
        return stats["max_rank"] if firing.value > when.high else stats["min_rank"]
    return None


def _show(value: float, when: Condition) -> str:
    """``value`` with 6 significant digits, or more if needed to keep the test true."""
    if not math.isfinite(value):
        return _exact(value)
    for digits in range(6, 18):
        text = f"{value:.{digits}g}"
        if when.holds(float(text)) == when.holds(value):
            return text
    return _exact(value)
