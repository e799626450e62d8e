"""A deliberately naive reference of the rule evaluator, written from docs/design.md, "Rules".

It shares no code with :mod:`rlpulse.rules.evaluator` or :mod:`rlpulse.rules.arith`: plain
loops over the summaries, the whole history of reduced values of every (run, attempt, stage,
rule) kept as a list, and every window statistic, streak, cooldown and block recomputed from
that history at each evaluation. ``tests/unit/test_rules_property.py`` holds the evaluator
against it.

Where docs/design.md leaves something open, the reference follows the evaluator's documented
decision; each such place is marked ``DECISION``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

NAN = float("nan")
INF = float("inf")

ParamValue = bool | int | float | str | None
When = (
    tuple[Literal["cmp"], str, float]  # ("cmp", op, threshold)
    | tuple[Literal["outside"], float, float]  # ("outside", low, high)
    | tuple[Literal["non_finite"]]
)


# -- arithmetic: "exact to the bit" --------------------------------------------------------------


def fsum(terms: Sequence[float]) -> float:
    """``math.fsum``, with the IEEE answer where it raises instead.

    NaN in, NaN out; ``inf + -inf`` is NaN; a sum of finite values whose exact value does not
    fit a double is the correctly rounded exact sum, ``+-inf`` if it overflows.
    """
    has_nan = has_inf = has_minus_inf = False
    for term in terms:
        if math.isnan(term):
            has_nan = True
        elif term == INF:
            has_inf = True
        elif term == -INF:
            has_minus_inf = True
    if has_nan or (has_inf and has_minus_inf):
        return NAN
    if has_inf:
        return INF
    if has_minus_inf:
        return -INF
    try:
        return math.fsum(terms)
    except OverflowError:  # CPython's fsum gives up when a partial sum overflows
        exact = Fraction(0)
        for term in terms:
            exact += Fraction(term)
        try:
            return exact.numerator / exact.denominator  # correctly rounded
        except OverflowError:
            return INF if exact > 0 else -INF


def square(x: float) -> float:
    """``x^2`` as the IEEE product: correctly rounded everywhere (``x ** 2`` goes to libm)."""
    return x * x


def mean(xs: Sequence[float]) -> float:
    """DESIGN: mean = fsum(x)/n.

    DECISION (the evaluator's; DESIGN is silent on overflow): where a partial sum of finite
    values leaves the double range, the exact mean, rounded once (it is representable).
    """
    total = fsum(xs)
    if math.isfinite(total) or math.isnan(total) or not all_finite(xs):
        return total / len(xs)
    exact = Fraction(0)
    for x in xs:
        exact += Fraction(x)
    exact /= len(xs)
    return exact.numerator / exact.denominator


def all_finite(xs: Sequence[float]) -> bool:
    """Whether no value is NaN or infinite."""
    return all(math.isfinite(x) for x in xs)


def any_nan(xs: Sequence[float]) -> bool:
    """Whether a value is NaN."""
    return any(math.isnan(x) for x in xs)


def var(xs: Sequence[float]) -> float:
    """DESIGN: var = fsum((x-mean)^2)/n, population; NaN for any NaN or infinite input."""
    if not all_finite(xs):
        return NAN
    m = mean(xs)
    return fsum([square(x - m) for x in xs]) / len(xs)


def std(xs: Sequence[float]) -> float:
    """DESIGN: std = sqrt(var)."""
    return math.sqrt(var(xs))


def window_stat(stat: str, steps: Sequence[int], values: Sequence[float]) -> float:
    """The ``over_steps`` statistic of a full window (DESIGN formulas)."""
    n = len(values)
    if stat == "mean":
        return mean(values)
    if stat == "var":
        return var(values)
    if stat == "std":
        return std(values)
    if stat in ("min", "max"):
        if any_nan(values):
            return NAN
        best = values[0]
        for x in values[1:]:
            if (x < best) if stat == "min" else (x > best):
                best = x
        return best
    if stat == "delta":  # any NaN among the inputs gives NaN; infinities follow IEEE
        return NAN if any_nan(values) else values[-1] - values[0]
    if stat == "slope":  # least squares against the step number
        # DECISION (DESIGN names no formula): centred sums, sxy / sxx, each an fsum.
        if not all_finite(values):
            return NAN
        xs = [float(step) for step in steps]
        mx, my = mean(xs), mean(values)
        sxx = fsum([square(x - mx) for x in xs])
        if sxx == 0:
            return NAN
        sxy = fsum([(xs[i] - mx) * (values[i] - my) for i in range(n)])
        return sxy / sxx
    if stat == "zscore":  # (last - mean(previous w-1)) / std(previous w-1); NaN if that std is 0
        if not all_finite(values):
            return NAN
        previous = values[:-1]
        spread = std(previous)
        if spread == 0:
            return NAN
        return (values[-1] - mean(previous)) / spread
    raise AssertionError(stat)


def holds(when: When, value: float) -> bool:
    """The ``when`` test; comparisons with NaN are false, ``non_finite`` catches NaN and inf."""
    if when[0] == "non_finite":
        return math.isnan(value) or math.isinf(value)
    if math.isnan(value):
        return False
    if when[0] == "outside":
        return value < when[1] or value > when[2]
    op, threshold = when[1], when[2]
    return {
        ">": value > threshold,
        ">=": value >= threshold,
        "<": value < threshold,
        "<=": value <= threshold,
        "==": value == threshold,
        "!=": value != threshold,
    }[op]


# -- rules ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleSpec:
    """One rule, as the tests generate it; :meth:`as_rule` is its rules-file form."""

    id: str
    metric: str | tuple[str, ...]
    when: When
    stage: str | None = None
    across_ranks: str = "mean"
    over_steps: tuple[str, int] | None = None  # (stat, window)
    for_steps: int = 1
    cooldown_steps: int = 0
    once: bool = False
    dry_run: bool = False
    match_tags: tuple[tuple[str, str], ...] | None = None
    actions: tuple[tuple[str, tuple[tuple[str, ParamValue], ...]], ...] = (("stop", ()),)

    @property
    def names(self) -> tuple[str, ...]:
        """The metric, or the aliases in order of preference."""
        return (self.metric,) if isinstance(self.metric, str) else self.metric

    @property
    def stops(self) -> bool:
        """Whether an action is ``stop``."""
        return any(name == "stop" for name, _ in self.actions)

    @property
    def wire_actions(self) -> list[dict[str, Any]]:
        """``ControlCommand.actions``: ordered ``{type, params}``."""
        return [{"type": name, "params": dict(params)} for name, params in self.actions]

    def as_rule(self) -> dict[str, Any]:
        """The rule as a rules file writes it (defaults left out)."""
        if self.when[0] == "non_finite":
            when = "non_finite"
        elif self.when[0] == "outside":
            when = f"outside [{self.when[1]!r}, {self.when[2]!r}]"
        else:
            when = f"{self.when[1]} {self.when[2]!r}"
        rule: dict[str, Any] = {
            "id": self.id,
            "metric": self.metric if isinstance(self.metric, str) else list(self.metric),
            "when": when,
            "actions": [{name: dict(params)} for name, params in self.actions],
        }
        if self.stage is not None:
            rule["stage"] = self.stage
        if self.across_ranks != "mean":
            rule["across_ranks"] = self.across_ranks
        if self.over_steps is not None:
            rule["over_steps"] = {"stat": self.over_steps[0], "window": self.over_steps[1]}
        if self.for_steps != 1:
            rule["for_steps"] = self.for_steps
        if self.cooldown_steps != 0:
            rule["cooldown_steps"] = self.cooldown_steps
        if self.once:
            rule["once"] = True
        if self.dry_run:
            rule["mode"] = "dry_run"
        if self.match_tags is not None:
            rule["match"] = {"tags": dict(self.match_tags)}
        return rule


def reduced(rule: RuleSpec, stats: Mapping[str, Any]) -> float:
    """The value at a step: the ``across_ranks`` field the joiner computed.

    ``worst`` is ``max`` for ``>``/``>=`` and ``min`` for ``<``/``<=``.
    """
    how = rule.across_ranks
    if how == "worst":
        how = "max" if rule.when[:2] in (("cmp", ">"), ("cmp", ">=")) else "min"
    return float(stats[how])


@dataclass(frozen=True)
class Fired:
    """What the evaluator must say about one firing."""

    rule_id: str
    stage: str
    step: int
    actions: list[dict[str, Any]]
    dry_run: bool
    value: float  # the value compared: the reduction, or the window statistic


@dataclass
class Reference:
    """The naive evaluator: feed it every summary, in order, of every run and attempt."""

    rules: Sequence[RuleSpec]
    # (run, attempt, stage) -> steps evaluated so far
    evaluated: dict[tuple[str, int, str], list[int]] = field(default_factory=dict)
    # (run, attempt, stage, rule) -> bound metric name
    bound: dict[tuple[str, int, str, str], str] = field(default_factory=dict)
    # (run, attempt, stage, rule) -> every evaluation: (step, reduced value)
    history: dict[tuple[str, int, str, str], list[tuple[int, float]]] = field(default_factory=dict)
    # (run, attempt, stage, rule) -> whether the condition held, per evaluation
    held: dict[tuple[str, int, str, str], list[bool]] = field(default_factory=dict)
    # (run, attempt, stage, rule) -> indexes of the evaluations that fired
    fired: dict[tuple[str, int, str, str], list[int]] = field(default_factory=dict)
    # run attempts that got an enforced stop
    stopped: list[tuple[str, int]] = field(default_factory=list)

    def feed(self, summary: Mapping[str, Any]) -> list[Fired]:
        """The firings for one summary, in file order."""
        if summary["revision"] != 1:  # revisions never touch rule state
            return []
        run, attempt, stage, step = (
            summary["run_id"],
            summary["attempt"],
            summary["stage"],
            summary["step"],
        )
        tags = summary.get("tags") or {}
        applicable = []
        for rule in self.rules:
            if rule.stage is not None and rule.stage != stage:
                continue
            if rule.match_tags is not None and not all(
                tags.get(key) == value for key, value in rule.match_tags
            ):
                continue
            applicable.append(rule)
        if not applicable:
            return []
        # Each (run, attempt, stage, step) once. DECISION (the evaluator's docstring): a step
        # at or below the last evaluated step of the stage is a re-emission and is ignored;
        # a summary no rule applies to evaluates nothing, so it does not count.
        seen = self.evaluated.setdefault((run, attempt, stage), [])
        for earlier in seen:
            if step <= earlier:
                return []
        seen.append(step)

        metrics = summary["metrics"]
        out: list[Fired] = []
        for rule in applicable:
            key = (run, attempt, stage, rule.id)
            if key not in self.bound:  # binds to the first name present in the first carrier
                for name in rule.names:
                    if name in metrics:
                        self.bound[key] = name
                        break
                else:
                    continue
            name = self.bound[key]
            if name not in metrics:  # not an evaluation
                continue
            history = self.history.setdefault(key, [])
            history.append((step, reduced(rule, metrics[name])))
            held = self.held.setdefault(key, [])
            fired = self.fired.setdefault(key, [])
            this = len(history) - 1  # index of this evaluation

            if rule.over_steps is None:
                value, full = history[-1][1], True
            else:
                stat, window = rule.over_steps
                full = len(history) >= window
                last = history[-window:]
                value = (
                    window_stat(stat, [s for s, _ in last], [v for _, v in last]) if full else NAN
                )
            held.append(full and holds(rule.when, value))

            since = fired[-1] + 1 if fired else 0  # firing resets the count
            streak = 0
            for index in range(this, since - 1, -1):
                if not held[index]:
                    break
                streak += 1
            if streak < rule.for_steps:
                continue
            blocked = (
                (bool(fired) and this - fired[-1] <= rule.cooldown_steps)
                or (rule.once and bool(fired))
                or (run, attempt) in self.stopped
            )
            if blocked:  # keeps counting: the streak is recomputed from `held`
                continue
            fired.append(this)
            out.append(Fired(rule.id, stage, step, rule.wire_actions, rule.dry_run, value))
            # DECISION (evaluator, test_dry_run_stop_is_marked_and_suppresses_nothing): a
            # dry-run stop is never applied, so it does not stop the run attempt.
            if rule.stops and not rule.dry_run:
                self.stopped.append((run, attempt))
        return out
