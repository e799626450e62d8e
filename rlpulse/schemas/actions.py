"""The action contract: every action a command can carry, declared once.

An :class:`ActionContract` names an action, its parameters (name, kind, whether required,
static bounds, the ``commands.*`` limits a trainer holds it to), the checks that relate
its parameters, and how an operator is told about it (its Alertmanager alert). Everything
that makes, checks or shows an action reads :data:`ACTIONS`: the rules language
(:mod:`rlpulse.rules.model` builds each action's parameter model from it), the trainer's
screening (:mod:`rlpulse.producers.control.screening`), ``rlpulse control send`` and the exporter's
alerts. Adding an action is one declaration here plus its handler in the integrations that
can carry it out; a trainer acks an action it has no handler for ``rejected``.

The checks here are pure: they take the parameter values (and a trainer's limits, any
object with the ``commands.*`` attributes) and return why they are unsound, or None.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from rlpulse.schemas.records import ParamValue

__all__ = [
    "ACTIONS",
    "SEVERITIES",
    "ActionContract",
    "ActionContracts",
    "ParamKind",
    "ParamSpec",
]

SEVERITIES: Final = ("info", "warning", "critical")
"""The severities of an ``alert`` action (and of the alerts commands become)."""


class ParamKind(StrEnum):
    """What a parameter holds; each kind has one check, the same for rules and trainers."""

    TEXT = "text"
    """Non-empty text, at most ``commands.max_text_chars`` characters."""
    NAME = "name"
    """Text that names a directory entry: not starting with '.', no '/', '\\' or controls."""
    NUMBER = "number"
    """A finite number (true and false are not numbers)."""
    WHOLE = "whole"
    """A whole number."""
    SCALAR = "scalar"
    """A string, a finite number, true, false or null."""
    SEVERITY = "severity"
    """One of :data:`SEVERITIES`."""


ValueProblem = str | None
Check = Callable[[Mapping[str, ParamValue], Any], ValueProblem]
"""A check relating parameters: (parameter values, limits or None in a rules file) -> why not."""


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of an action: its kind, bounds and meaning."""

    name: str
    kind: ParamKind
    description: str
    required: bool = False
    gt: float | None = None
    """Static lower bound, exclusive (checked in rules files and by trainers)."""
    ge: float | None = None
    """Static lower bound, inclusive."""
    low_limit: str | None = None
    """The ``commands.*`` limit a trainer holds the value at or above."""
    high_limit: str | None = None
    """The ``commands.*`` limit a trainer holds the value at or below."""

    def problem(self, value: ParamValue, limits: Any) -> ValueProblem:
        """Why ``value`` is unsound for this parameter (``limits``: a trainer's, or None)."""
        check = _KIND_CHECKS[self.kind]
        problem = check(self.name, value, limits)
        if problem is not None or self.kind not in (ParamKind.NUMBER, ParamKind.WHOLE):
            return problem
        assert isinstance(value, int | float)
        return self._bound_problem(float(value), limits)

    def _bound_problem(self, number: float, limits: Any) -> ValueProblem:
        low = self.ge if self.ge is not None else self.gt
        exclusive = self.ge is None and self.gt is not None
        high: float | None = None
        if limits is not None:
            if self.low_limit is not None:
                low, exclusive = float(getattr(limits, self.low_limit)), False
            if self.high_limit is not None:
                high = float(getattr(limits, self.high_limit))
        below = low is not None and (number <= low if exclusive else number < low)
        if not below and (high is None or number <= high):
            return None
        shown = _shown(number)
        if high is None:
            assert low is not None
            return f"{self.name} must be {'>' if exclusive else '>='} {_shown(low)}, got {shown}"
        where = _limits_label(self.low_limit, self.high_limit)
        return f"{self.name} {shown} is outside [{_shown(low or 0)}, {_shown(high)}] ({where})"


def _shown(number: float) -> str:
    """``256`` for a whole number, ``0.0625`` otherwise."""
    return str(int(number)) if float(number).is_integer() else f"{number:g}"


def _limits_label(low: str | None, high: str | None) -> str:
    """``commands.scale_factor_min/max`` for a pair sharing a stem, else the names."""
    names = [name for name in (low, high) if name is not None]
    if len(names) == 2 and low and high and low.rsplit("_", 1)[0] == high.rsplit("_", 1)[0]:
        stem = low.rsplit("_", 1)[0]
        return f"commands.{stem}_{low.rsplit('_', 1)[1]}/{high.rsplit('_', 1)[1]}"
    return ", ".join(f"commands.{name}" for name in names)


@dataclass(frozen=True)
class ActionContract:
    """One action: its name, parameters, the checks relating them, and its alert."""

    name: str
    description: str
    params: tuple[ParamSpec, ...] = ()
    checks: tuple[Check, ...] = ()
    """Checks across parameters, run once each parameter passed its own."""
    alert_name: str = "RlpulseRuleCommand"
    """The Alertmanager ``alertname`` of a command whose weightiest action this is."""
    alert_severity: str = "info"
    """The alert's severity when the command says none."""
    notified_by_default: bool = False
    """Whether ``exporter.notify_actions`` holds this action unless set otherwise."""
    for_trainer: bool = True
    """Whether a trainer carries it out (``alert``: the exporter does, ``capture_stacks``: the
    host agents; a trainer acks those ``noop``)."""

    def param(self, name: str) -> ParamSpec:
        """The parameter called ``name``; ``KeyError`` if the action has none."""
        for spec in self.params:
            if spec.name == name:
                return spec
        raise KeyError(name)

    @property
    def param_names(self) -> list[str]:
        """The parameters' names, in declaration order."""
        return [spec.name for spec in self.params]

    def problem(self, params: Mapping[str, ParamValue], limits: Any) -> ValueProblem:
        """Why ``params`` are unsound for this action (``limits``: a trainer's, or None)."""
        unknown = sorted(set(params) - set(self.param_names))
        if unknown:
            takes = ", ".join(sorted(self.param_names)) or "none"
            return f"unknown parameter {unknown[0]!r:.80}; {self.name} takes {takes}"
        missing = [spec.name for spec in self.params if spec.required and spec.name not in params]
        if missing:
            return f"parameter {missing[0]!r} is missing"
        for spec in self.params:
            value = params.get(spec.name)
            if value is None and not spec.required:
                continue
            problem = spec.problem(value, limits)
            if problem is not None:
                return problem
        return self.cross_problem(params, limits)

    def cross_problem(self, params: Mapping[str, ParamValue], limits: Any) -> ValueProblem:
        """Why the parameters, each sound, are unsound together."""
        for check in self.checks:
            problem = check(params, limits)
            if problem is not None:
                return problem
        return None


@dataclass(frozen=True)
class ActionContracts:
    """The declared actions, in order of weight (the first a command holds names its alert)."""

    actions: tuple[ActionContract, ...]
    _by_name: Mapping[str, ActionContract] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {action.name: action for action in self.actions})
        if len(self._by_name) != len(self.actions):
            raise ValueError("two actions share a name")

    def __iter__(self) -> Iterator[ActionContract]:
        return iter(self.actions)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> ActionContract:
        return self._by_name[name]

    def __hash__(self) -> int:
        return hash(self.actions)

    @property
    def names(self) -> list[str]:
        """The actions' names, weightiest first."""
        return [action.name for action in self.actions]

    def with_action(self, action: ActionContract) -> ActionContracts:
        """These actions and ``action`` (the lightest)."""
        return ActionContracts((*self.actions, action))


# -- the checks of each kind -----------------------------------------------------------------


def _text(name: str, value: ParamValue, limits: Any) -> ValueProblem:
    if not isinstance(value, str) or not value:
        return f"{name} must be non-empty text, got {value!r:.80}"
    if limits is not None and len(value) > limits.max_text_chars:
        return f"{name} has {len(value)} characters, more than commands.max_text_chars"
    return None


def _name(name: str, value: ParamValue, limits: Any) -> ValueProblem:
    problem = _text(name, value, limits)
    if problem is not None:
        return problem
    assert isinstance(value, str)
    if value.startswith(".") or any(c in "/\\" or ord(c) < 32 or ord(c) == 127 for c in value):
        return (
            f"{name} {value!r:.80} must not start with '.' or hold '/', '\\' or control characters"
        )
    return None


def finite_number(value: ParamValue) -> float | None:
    """``value`` as a finite float, or None when it is not one (booleans are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _number(name: str, value: ParamValue, limits: Any) -> ValueProblem:
    if finite_number(value) is None:
        return f"{name} must be a finite number, got {value!r:.80}"
    return None


def _whole(name: str, value: ParamValue, limits: Any) -> ValueProblem:
    number = finite_number(value)
    if number is None or not number.is_integer():
        return f"{name} must be a whole number, got {value!r:.80}"
    return None


def _scalar(name: str, value: ParamValue, limits: Any) -> ValueProblem:
    if isinstance(value, str) and limits is not None and len(value) > limits.max_text_chars:
        return f"{name} has {len(value)} characters, more than commands.max_text_chars"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{name} must be finite, got {value!r}"
    if value is not None and not isinstance(value, bool | int | float | str):
        return f"{name} must be a string, a finite number, true, false or null, got {value!r:.80}"
    return None


def _severity(name: str, value: ParamValue, limits: Any) -> ValueProblem:
    if value not in SEVERITIES:
        return f"{name} must be one of {', '.join(SEVERITIES)}, got {value!r:.80}"
    return None


_KIND_CHECKS: Final[Mapping[ParamKind, Callable[[str, ParamValue, Any], ValueProblem]]] = {
    ParamKind.TEXT: _text,
    ParamKind.NAME: _name,
    ParamKind.NUMBER: _number,
    ParamKind.WHOLE: _whole,
    ParamKind.SCALAR: _scalar,
    ParamKind.SEVERITY: _severity,
}


# -- checks across parameters ----------------------------------------------------------------


def ordered(low: str, high: str) -> Check:
    """A check that parameter ``low`` does not exceed ``high`` when both are given."""

    def check(params: Mapping[str, ParamValue], limits: Any) -> ValueProblem:
        lo, hi = finite_number(params.get(low)), finite_number(params.get(high))
        if lo is not None and hi is not None and lo > hi:
            return f"{low} {_shown(lo)} is above {high} {_shown(hi)}"
        return None

    return check


def growth_needs_bound(factor: str, bound: str, limit: str) -> Check:
    """A check that a ``factor`` above 1 comes with an upper ``bound``."""

    def check(params: Mapping[str, ParamValue], limits: Any) -> ValueProblem:
        number = finite_number(params.get(factor))
        if number is None or number <= 1 or params.get(bound) is not None:
            return None
        most = f"at most {getattr(limits, limit)}, " if limits is not None else ""
        return (
            f"{factor} {_shown(number)} grows the batch without a bound: give {bound} "
            f"({most}commands.{limit})"
        )

    return check


# -- the actions -----------------------------------------------------------------------------

_BATCH_BOUND = "commands.max_batch_size bounds it on the trainer"

ACTIONS: Final = ActionContracts(
    (
        ActionContract(
            "stop",
            "End the run attempt; nothing is issued for it afterwards.",
            alert_name="RlpulseRunStopped",
            alert_severity="critical",
            notified_by_default=True,
        ),
        ActionContract(
            "checkpoint",
            "Save a checkpoint.",
            (
                ParamSpec(
                    "tag",
                    ParamKind.NAME,
                    "Label of the checkpoint (e.g. kl_violation), for people.",
                ),
            ),
            alert_name="RlpulseRunCheckpointed",
            alert_severity="warning",
            notified_by_default=True,
        ),
        ActionContract(
            "alert",
            "Tell a person; the trainer carries on.",
            (
                ParamSpec("severity", ParamKind.SEVERITY, "info, warning or critical."),
                ParamSpec(
                    "message",
                    ParamKind.TEXT,
                    "What a person should know or do; the command's reason adds the evidence.",
                    required=True,
                ),
            ),
            alert_name="RlpulseRuleAlert",
            alert_severity="warning",
            notified_by_default=True,
            for_trainer=False,
        ),
        ActionContract(
            "capture_stacks",
            "Take every thread's Python stack of each rank process of the run, from outside "
            "(the host agents signal the ranks; the stacks go to the logs topic, logger "
            "rlpulse.stacks).",
            (
                ParamSpec(
                    "wait_s",
                    ParamKind.NUMBER,
                    "How long an agent waits for a rank's stacks before it reports the rank "
                    "silent (default 10 s).",
                    gt=0,
                ),
            ),
            alert_name="RlpulseStacksCaptured",
            alert_severity="info",
            for_trainer=False,
        ),
        ActionContract(
            "scale_rollout_batch",
            "Scale the rollout batch size, within [min, max]: new = clamp(round(current * "
            "factor), min, max).",
            (
                ParamSpec(
                    "factor",
                    ParamKind.NUMBER,
                    "Multiplier of the rollout batch size: new = clamp(round(current * factor), "
                    "min, max).",
                    required=True,
                    gt=0,
                    low_limit="scale_factor_min",
                    high_limit="scale_factor_max",
                ),
                ParamSpec(
                    "min",
                    ParamKind.WHOLE,
                    f"Smallest batch size to go to ({_BATCH_BOUND}).",
                    ge=1,
                    high_limit="max_batch_size",
                ),
                ParamSpec(
                    "max",
                    ParamKind.WHOLE,
                    f"Largest batch size to go to ({_BATCH_BOUND}); required when factor > 1.",
                    ge=1,
                    high_limit="max_batch_size",
                ),
            ),
            checks=(ordered("min", "max"), growth_needs_bound("factor", "max", "max_batch_size")),
        ),
        ActionContract(
            "set",
            "Set a trainer setting to a value.",
            (
                ParamSpec(
                    "key",
                    ParamKind.TEXT,
                    "Name of the setting, as the trainer's integration knows it.",
                    required=True,
                ),
                ParamSpec(
                    "value",
                    ParamKind.SCALAR,
                    "New value: a string, a finite number, true, false or null.",
                    required=True,
                ),
            ),
        ),
    )
)
"""The actions, weightiest first: a command's weightiest action names its alert."""
