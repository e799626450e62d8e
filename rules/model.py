"""The rules file as frozen, validated pydantic models: the DSL of DESIGN.md.

A file is ``RuleSet(version=1, rules=[Rule, ...])``. ``Rule.when`` is parsed into a
:data:`Condition`; each action is a one-key mapping (``{stop: {}}``) whose key names an
entry of :data:`ACTION_TYPES`. ``Rule.version`` fingerprints the normalised definition,
so a reload keeps the state of unchanged rules only.
"""

from __future__ import annotations

import hashlib
import json
import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from rlpulse.schemas.records import ParamValue

AcrossRanks = Literal["mean", "min", "max", "sum", "std", "worst"]
WindowStat = Literal["mean", "std", "var", "min", "max", "delta", "slope", "zscore"]
ComparisonOp = Literal[">", ">=", "<", "<=", "==", "!="]
Mode = Literal["enforce", "dry_run"]
Severity = Literal["info", "warning", "critical"]

NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]

ZSCORE_MIN_WINDOW: Final = 3


def format_number(value: float) -> str:
    """Shortest text that reads back as ``value``, without a trailing ``.0``: ``0.3``, ``256``."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


# -- conditions ------------------------------------------------------------------------------

_COMPARE: Final[Mapping[str, Callable[[float, float], bool]]] = MappingProxyType(
    {
        ">": operator.gt,
        ">=": operator.ge,
        "<": operator.lt,
        "<=": operator.le,
        "==": operator.eq,
        "!=": operator.ne,
    }
)
_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_COMPARISON_RE = re.compile(rf"\s*(>=|<=|==|!=|>|<)\s*({_NUMBER})\s*")
_OUTSIDE_RE = re.compile(rf"\s*outside\s*\[\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\]\s*")
_NON_FINITE = "non_finite"
_WHEN_SYNTAX = (
    "expected '<op> <number>' with op one of > >= < <= == != (e.g. '> 0.5'), "
    "'outside [a, b]' or 'non_finite'"
)


@dataclass(frozen=True)
class Comparison:
    """``when: "> 0.5"``: the value compared with a finite threshold; false for NaN."""

    op: ComparisonOp
    threshold: float

    def holds(self, value: float) -> bool:
        """Whether ``value`` satisfies the comparison (never for NaN, not even ``!=``)."""
        return not math.isnan(value) and _COMPARE[self.op](value, self.threshold)

    def __str__(self) -> str:
        return f"{self.op} {format_number(self.threshold)}"


@dataclass(frozen=True)
class Outside:
    """``when: "outside [low, high]"``: value < low or value > high; false for NaN."""

    low: float
    high: float

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies strictly outside the closed interval ``[low, high]``."""
        return value < self.low or value > self.high

    def __str__(self) -> str:
        return f"outside [{format_number(self.low)}, {format_number(self.high)}]"


@dataclass(frozen=True)
class NonFinite:
    """``when: "non_finite"``: the value is NaN or infinite."""

    def holds(self, value: float) -> bool:
        """Whether ``value`` is NaN, ``inf`` or ``-inf``."""
        return not math.isfinite(value)

    def __str__(self) -> str:
        return _NON_FINITE


Condition = Comparison | Outside | NonFinite


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def parse_condition(text: str) -> Condition:
    """Parse the text of ``when``; raises ``ValueError`` saying what is accepted."""
    if (found := _COMPARISON_RE.fullmatch(text)) is not None:
        op: ComparisonOp = found.group(1)  # type: ignore[assignment]  # the regex allows only these
        return Comparison(op, _finite(found.group(2)))
    if (found := _OUTSIDE_RE.fullmatch(text)) is not None:
        low, high = _finite(found.group(1)), _finite(found.group(2))
        if low > high:
            raise ValueError(f"'outside [a, b]' needs a <= b, got {text!r}")
        return Outside(low, high)
    if text.strip() == _NON_FINITE:
        return NonFinite()
    raise ValueError(f"cannot parse {text!r}; {_WHEN_SYNTAX}")


def _validate_when(value: object) -> Condition:
    if isinstance(value, Comparison | Outside | NonFinite):
        return value
    if not isinstance(value, str):
        raise ValueError(f"must be a string (quote it in YAML), got {value!r}; {_WHEN_SYNTAX}")
    return parse_condition(value)


When = Annotated[Condition, PlainValidator(_validate_when), PlainSerializer(str, return_type=str)]


def _validate_metric(value: object) -> str | list[str]:
    if isinstance(value, str) and value:
        return value
    if (
        isinstance(value, list)
        and value
        and all(isinstance(name, str) and name for name in value)
        and len(set(value)) == len(value)
    ):
        return list(value)
    raise ValueError(
        f"must be a metric name or a non-empty list of distinct names (aliases), got {value!r}"
    )


MetricNames = Annotated[str | list[str], PlainValidator(_validate_metric)]


# -- models ----------------------------------------------------------------------------------


class _Model(BaseModel):
    """Frozen, strict, and refusing unknown keys."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class OverSteps(_Model):
    """``over_steps``: a statistic over the last ``window`` evaluations of the value."""

    stat: WindowStat
    window: int = Field(ge=2)

    @field_validator("window")
    @classmethod
    def _zscore_window(cls, window: int, info: ValidationInfo) -> int:
        if info.data.get("stat") == "zscore" and window < ZSCORE_MIN_WINDOW:
            raise ValueError(
                f"zscore needs window >= {ZSCORE_MIN_WINDOW} (a mean and std of the previous "
                f"values), got {window}"
            )
        return window


class Match(_Model):
    """``match``: the rule applies only to runs whose tags include all of these."""

    tags: dict[str, str] = Field(default_factory=dict)


class ActionParams(_Model):
    """Base of the parameter models of the actions."""

    def wire_params(self) -> dict[str, ParamValue]:
        """Return the ``ControlCommand.actions[].params``; unset options are left out."""
        return {key: value for key, value in self.model_dump().items() if value is not None}


class StopParams(ActionParams):
    """``stop: {}``: end the run attempt."""


class CheckpointParams(ActionParams):
    """``checkpoint: {tag: ...}``: save a checkpoint, optionally tagged."""

    tag: NonEmptyStr | None = None


class ScaleRolloutBatchParams(ActionParams):
    """``scale_rollout_batch``: new = clamp(round(current * factor), min, max)."""

    factor: float = Field(gt=0, allow_inf_nan=False)
    min: int | None = Field(default=None, ge=1)
    max: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _min_not_above_max(self) -> ScaleRolloutBatchParams:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class SetParams(ActionParams):
    """``set: {key, value}``: set a trainer setting to a scalar (``null`` included)."""

    key: NonEmptyStr
    value: ParamValue

    def wire_params(self) -> dict[str, ParamValue]:
        """``key`` and ``value``, even when ``value`` is null."""
        return {"key": self.key, "value": self.value}


class AlertParams(ActionParams):
    """``alert: {severity, message}``: tell a person; the trainer carries on."""

    severity: Severity
    message: NonEmptyStr


ACTION_TYPES: Final[Mapping[str, type[ActionParams]]] = MappingProxyType(
    {
        "stop": StopParams,
        "checkpoint": CheckpointParams,
        "scale_rollout_batch": ScaleRolloutBatchParams,
        "set": SetParams,
        "alert": AlertParams,
    }
)
"""The registry of action types: name in the rules file -> model of its parameters."""


class ActionSpec(_Model):
    """One action of a rule, written as a one-key mapping ``{type: params}``.

    Exactly one field is set; :attr:`type` names it and :attr:`params` holds its value.
    """

    stop: StopParams | None = None
    checkpoint: CheckpointParams | None = None
    scale_rollout_batch: ScaleRolloutBatchParams | None = None
    set: SetParams | None = None
    alert: AlertParams | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_known_key(cls, data: Any) -> Any:
        if isinstance(data, ActionSpec):
            return data
        if not isinstance(data, Mapping) or len(data) != 1:
            raise ValueError(
                f"an action is a one-key mapping such as {{stop: {{}}}} or "
                f"{{checkpoint: {{tag: best}}}}, got {data!r}"
            )
        ((name, params),) = data.items()
        if name not in ACTION_TYPES:
            raise ValueError(f"unknown action {name!r}; expected one of: {', '.join(ACTION_TYPES)}")
        return {name: {} if params is None else params}

    @property
    def type(self) -> str:
        """The action's name: ``stop``, ``checkpoint``, ``scale_rollout_batch``, ..."""
        return next(name for name in ACTION_TYPES if getattr(self, name) is not None)

    @property
    def params(self) -> ActionParams:
        """The validated parameters of the action."""
        params: ActionParams = getattr(self, self.type)
        return params

    @model_serializer
    def _as_written(self) -> dict[str, dict[str, Any]]:
        return {self.type: self.params.model_dump()}


class Rule(_Model):
    """One rule: which value to watch, when it is bad, and what to do about it."""

    id: NonEmptyStr
    description: str | None = None
    metric: MetricNames
    stage: NonEmptyStr | None = None
    across_ranks: AcrossRanks = "mean"
    over_steps: OverSteps | None = None
    when: When
    for_steps: int = Field(default=1, ge=1)
    cooldown_steps: int = Field(default=0, ge=0)
    once: bool = False
    mode: Mode = "enforce"
    match: Match | None = None
    actions: list[ActionSpec] = Field(min_length=1)

    @field_validator("id")
    @classmethod
    def _id_is_trimmed(cls, rule_id: str) -> str:
        if rule_id != rule_id.strip():
            raise ValueError(f"must not start or end with whitespace, got {rule_id!r}")
        return rule_id

    @field_validator("when")
    @classmethod
    def _worst_needs_an_order(cls, when: Condition, info: ValidationInfo) -> Condition:
        if info.data.get("across_ranks") == "worst" and not (
            isinstance(when, Comparison) and when.op in (">", ">=", "<", "<=")
        ):
            raise ValueError(
                f"across_ranks 'worst' needs a >, >=, < or <= condition, got {str(when)!r}"
            )
        return when

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metric name, or the alias names in order of preference."""
        return (self.metric,) if isinstance(self.metric, str) else tuple(self.metric)

    @property
    def stops(self) -> bool:
        """Whether one of the actions is ``stop``."""
        return any(action.type == "stop" for action in self.actions)

    @property
    def version(self) -> str:
        """First 12 hex digits of the sha256 of the normalised definition (defaults filled in)."""
        normalised = json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(normalised.encode()).hexdigest()[:12]


class RuleSet(_Model):
    """A whole rules file: ``version: 1`` and the rules, evaluated in file order."""

    version: Literal[1]
    rules: list[Rule]

    @field_validator("rules")
    @classmethod
    def _unique_ids(cls, rules: list[Rule]) -> list[Rule]:
        seen: set[str] = set()
        for rule in rules:
            if rule.id in seen:
                raise PydanticCustomError(
                    "duplicate_rule_id", "duplicate rule id {rule_id!r}", {"rule_id": rule.id}
                )
            seen.add(rule.id)
        return rules

    def rule(self, rule_id: str) -> Rule:
        """Return the rule with that id; ``KeyError`` if there is none."""
        for rule in self.rules:
            if rule.id == rule_id:
                return rule
        raise KeyError(rule_id)
