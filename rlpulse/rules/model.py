"""The rules file as frozen, validated pydantic models: the language of docs/design.md, "Rules".

A file is ``RuleSet(version=1, rules=[Rule, ...])``. ``Rule.when`` is parsed into a
:data:`Condition`; each action is a one-key mapping (``{stop: {}}``) whose key names an
action of the action contract (:mod:`rlpulse.schemas.actions`). ``Rule.version``
fingerprints the normalised definition, so a reload keeps the state of unchanged rules only.

The field descriptions are the help editors show: ``rules.schema.json`` is generated from
these models (:mod:`rlpulse.rules.schema`).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    StringConstraints,
    ValidationInfo,
    WithJsonSchema,
    create_model,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic_core import PydanticCustomError

from rlpulse.schemas.actions import ACTIONS, ActionContract, ActionContracts, ParamKind, ParamSpec
from rlpulse.schemas.records import ParamValue

AcrossRanks = Literal["mean", "min", "max", "sum", "std", "worst"]
WindowStat = Literal["mean", "std", "var", "min", "max", "delta", "slope", "zscore"]
ComparisonOp = Literal[">", ">=", "<", "<=", "==", "!="]
Mode = Literal["enforce", "dry_run"]
Severity = Literal["info", "warning", "critical"]

NonEmptyStr = Annotated[str, StringConstraints(min_length=1)]

ZSCORE_MIN_WINDOW: Final = 3


def closest(word: str, choices: Sequence[str]) -> str | None:
    """The one of ``choices`` that ``word`` most likely misspells, if any is close."""
    close = difflib.get_close_matches(word, choices, n=1)
    return close[0] if close else None


def choice_hint(word: str, choices: Sequence[str]) -> str:
    """``; did you mean 'x'?`` for a near miss of one of ``choices``, else the choices."""
    intended = closest(word, choices)
    if intended is not None:
        return f"; did you mean {intended!r}?"
    return f"; expected one of: {', '.join(choices)}"


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
_COMPARISON = rf"(>=|<=|==|!=|>|<)\s*({_NUMBER})"
_OUTSIDE = rf"outside\s*\[\s*({_NUMBER})\s*,\s*({_NUMBER})\s*\]"
_NON_FINITE = "non_finite"
_COMPARISON_RE = re.compile(rf"\s*{_COMPARISON}\s*")
_OUTSIDE_RE = re.compile(rf"\s*{_OUTSIDE}\s*")
WHEN_PATTERN: Final = rf"^\s*(?:{_COMPARISON}|{_OUTSIDE}|{_NON_FINITE})\s*$"
"""The syntax of ``when`` as a regular expression (for the JSON Schema; ``a <= b`` unchecked)."""
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


When = Annotated[
    Condition,
    PlainValidator(_validate_when),
    PlainSerializer(str, return_type=str),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": WHEN_PATTERN,
            "examples": ["> 0.3", "<= 0.05", "== 0", "outside [-1, 1]", "non_finite"],
        }
    ),
]


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


def metric_names(metric: str | list[str]) -> tuple[str, ...]:
    """A ``metric`` key as written: one name, or aliases in order of preference."""
    return (metric,) if isinstance(metric, str) else tuple(metric)


MetricNames = Annotated[
    str | list[str],
    PlainValidator(_validate_metric),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {
                    "type": "array",
                    "items": {"type": "string", "minLength": 1},
                    "minItems": 1,
                    "uniqueItems": True,
                },
            ],
            "examples": ["kl_divergence", ["critic/score/mean", "critic/rewards/mean"]],
        }
    ),
]


def _validate_scalar(value: object) -> ParamValue:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise ValueError(f"must be a string, a finite number, true, false or null, got {value!r}")


Scalar = Annotated[
    ParamValue,
    PlainValidator(_validate_scalar),
    WithJsonSchema({"type": ["string", "number", "boolean", "null"]}),
]


# -- models ----------------------------------------------------------------------------------


class _Model(BaseModel):
    """Frozen, strict, and refusing unknown keys."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


_SAME_VALUE = "a window of 1 is the value itself: leave out over_steps"
_WINDOW_MINIMUM: Final[Mapping[str, tuple[int, str]]] = MappingProxyType(
    {
        "mean": (2, _SAME_VALUE),
        "min": (2, _SAME_VALUE),
        "max": (2, _SAME_VALUE),
        "std": (2, "a spread needs at least 2 values"),
        "var": (2, "a spread needs at least 2 values"),
        "delta": (2, "last - first needs 2 values"),
        "slope": (2, "a slope needs at least 2 points"),
        "zscore": (ZSCORE_MIN_WINDOW, "a mean and std of the previous values"),
    }
)
"""Smallest ``over_steps.window`` of each statistic, and why."""


class OverSteps(_Model):
    """``over_steps``: a statistic over the last ``window`` evaluations of the value."""

    model_config = ConfigDict(
        json_schema_extra={
            "if": {"properties": {"stat": {"const": "zscore"}}, "required": ["stat"]},
            "then": {"properties": {"window": {"minimum": ZSCORE_MIN_WINDOW}}},
        }
    )

    stat: WindowStat = Field(
        description=(
            "The statistic compared: mean, std, var (population), min, max, delta (last - "
            "first), slope (least squares against the step number) or zscore ((last - mean "
            "of the previous window-1) / their std)."
        )
    )
    window: int = Field(
        description=(
            "How many evaluations (summaries that carried the metric) the statistic covers; "
            "it is evaluated only once the window is full. At least 2, 3 for zscore."
        ),
        json_schema_extra={"minimum": 2},
    )

    @field_validator("window")
    @classmethod
    def _window_fits_stat(cls, window: int, info: ValidationInfo) -> int:
        stat = info.data.get("stat")
        minimum, why = _WINDOW_MINIMUM.get(stat, (2, "")) if isinstance(stat, str) else (2, "")
        if window < minimum:
            reason = f" for stat {stat!r} ({why})" if why else ""
            raise ValueError(f"must be >= {minimum}{reason}, got {window}")
        return window


class Match(_Model):
    """``match``: the rule applies only to runs whose tags include all of these."""

    tags: dict[str, str] = Field(
        default_factory=dict,
        description="Tag name -> value; the rule applies to a run only if it has every one.",
    )


class ActionParams(_Model):
    """Base of the parameter models of the actions, built from :data:`ACTIONS`."""

    contract: ClassVar[ActionContract]

    def wire_params(self) -> dict[str, ParamValue]:
        """Return the ``ControlCommand.actions[].params``: unset options are left out."""
        return {
            spec.name: getattr(self, spec.name)
            for spec in self.contract.params
            if spec.required or getattr(self, spec.name) is not None
        }

    @model_validator(mode="after")
    def _sound_together(self) -> ActionParams:
        problem = self.contract.cross_problem(self.wire_params(), None)
        if problem is not None:
            raise ValueError(problem)
        return self


_FIELD_TYPES: Final[Mapping[ParamKind, Any]] = MappingProxyType(
    {
        ParamKind.TEXT: NonEmptyStr,
        ParamKind.NAME: NonEmptyStr,
        ParamKind.NUMBER: float,
        ParamKind.WHOLE: int,
        ParamKind.SCALAR: Scalar,
        ParamKind.SEVERITY: Severity,
    }
)
"""The pydantic type of each kind of parameter; what a type cannot say, ``problem`` checks."""


def _param_field(spec: ParamSpec) -> tuple[Any, Any]:
    """The pydantic field of one parameter: its type, bounds and description."""
    kind: Any = _FIELD_TYPES[spec.kind]
    if spec.kind is ParamKind.NAME:

        def as_name(value: str, spec: ParamSpec = spec) -> str:
            problem = spec.problem(value, None)
            if problem is not None:
                raise ValueError(problem.removeprefix(f"{spec.name} "))
            return value

        kind = Annotated[kind, AfterValidator(as_name)]
    options: dict[str, Any] = {"description": spec.description, "gt": spec.gt, "ge": spec.ge}
    if spec.kind is ParamKind.NUMBER:
        options["allow_inf_nan"] = False
    if spec.required:
        return kind, Field(**options)
    return kind | None, Field(default=None, **options)


def _params_model(contract: ActionContract) -> type[ActionParams]:
    """The pydantic model of ``contract``'s parameters (``scale_rollout_batch: {...}``)."""
    name = "".join(part.title() for part in contract.name.split("_")) + "Params"
    what = contract.description
    fields = {spec.name: _param_field(spec) for spec in contract.params}
    model: type[ActionParams] = create_model(  # type: ignore[call-overload]
        name,
        __base__=ActionParams,
        __doc__=f"``{contract.name}``: {what[:1].lower()}{what[1:]}",
        **fields,
    )
    model.contract = contract
    return model


def _one_key_schema(schema: JsonDict) -> None:
    """An action object holds exactly one of the properties; their absence is no default."""
    schema["minProperties"] = schema["maxProperties"] = 1
    properties = schema.get("properties")
    if isinstance(properties, dict):
        for prop in properties.values():
            if isinstance(prop, dict):
                prop.pop("default", None)


class ActionSpecBase(_Model):
    """One action of a rule, written as a one-key mapping ``{type: params}``.

    Its fields, one per declared action, are made from an action contract
    (:func:`action_spec_model`). Exactly one is set; :attr:`type` names it and :attr:`params`
    holds its value.
    """

    model_config = ConfigDict(json_schema_extra=_one_key_schema, title="Action")

    @model_validator(mode="before")
    @classmethod
    def _one_known_key(cls, data: Any) -> Any:
        if isinstance(data, ActionSpecBase):
            return data
        if not isinstance(data, Mapping) or len(data) != 1:
            raise ValueError(
                f"an action is a one-key mapping such as {{stop: {{}}}} or "
                f"{{checkpoint: {{tag: best}}}}, got {data!r}"
            )
        ((name, params),) = data.items()
        known = list(cls.model_fields)
        if name not in known:
            raise ValueError(f"unknown action {name!r}" + choice_hint(str(name), known))
        return {name: {} if params is None else params}

    @property
    def type(self) -> str:
        """The action's name: ``stop``, ``checkpoint``, ``scale_rollout_batch``, ..."""
        return next(name for name in type(self).model_fields if getattr(self, name) is not None)

    @property
    def params(self) -> ActionParams:
        """The validated parameters of the action."""
        params: ActionParams = getattr(self, self.type)
        return params

    @model_serializer
    def _as_written(self) -> dict[str, dict[str, Any]]:
        return {self.type: self.params.model_dump()}


@functools.cache
def action_spec_model(actions: ActionContracts) -> type[ActionSpecBase]:
    """The model of one action of a rule, with a field for each of ``actions``."""
    fields = {
        contract.name: (
            _params_model(contract) | None,
            Field(None, description=contract.description),
        )
        for contract in actions
    }
    model: type[ActionSpecBase] = create_model(  # type: ignore[call-overload]
        "ActionSpec", __base__=ActionSpecBase, **fields
    )
    return model


class ActionSpec(action_spec_model(ACTIONS)):  # type: ignore[misc]
    """One action of a rule, written as a one-key mapping ``{type: params}``.

    One field per action of the contract (:mod:`rlpulse.schemas.actions`); exactly one is
    set: :attr:`type` names it and :attr:`params` holds its value.
    """


_ORDERED_OPS: Final = (">", ">=", "<", "<=")


_WORST_NEEDS_AN_ORDER: Final[JsonDict] = {
    "if": {"properties": {"across_ranks": {"const": "worst"}}, "required": ["across_ranks"]},
    "then": {"properties": {"when": {"pattern": r"^\s*(?:>=|<=|>|<)"}}},
}
"""``across_ranks: worst`` with a ``when`` that is not an ordered comparison, in JSON Schema."""


Reduction = Literal["mean", "min", "max", "sum", "std"]


def reduction_of(across_ranks: AcrossRanks, when: Condition) -> Reduction:
    """The MetricStats field a step's value is read from: ``worst`` follows the condition."""
    if across_ranks != "worst":
        return across_ranks
    upward = isinstance(when, Comparison) and when.op in (">", ">=")
    return "max" if upward else "min"  # validated: worst comes only with > >= < <=


def _check_worst(across_ranks: object, when: Condition) -> Condition:
    """``when`` if it suits ``across_ranks``: worst needs an ordered comparison to pick a side."""
    if across_ranks == "worst" and not (isinstance(when, Comparison) and when.op in _ORDERED_OPS):
        raise ValueError(
            f"across_ranks 'worst' needs a >, >=, < or <= condition, got {str(when)!r}"
        )
    return when


class Expectation(_Model):
    """``expect``: what the rule's action should achieve, checked after it was applied.

    The value is computed as a rule's is, over the steps after the command's applied step
    (from the trainer's ack) only: the command is ``effective`` at the first of the next
    ``within_steps`` steps where ``when`` holds, ``ineffective`` when they run out without it.
    """

    model_config = ConfigDict(json_schema_extra=_WORST_NEEDS_AN_ORDER)

    metric: MetricNames | None = Field(
        default=None,
        description=(
            "The metric that shows the effect (a name or aliases). Absent: the metric the rule "
            "fired on."
        ),
    )
    stage: NonEmptyStr | None = Field(
        default=None,
        description="The stage it is read in. Absent: the stage the rule fired in.",
    )
    across_ranks: AcrossRanks | None = Field(
        default=None,
        description="How a step's per-rank values become one value. Absent: as the rule's.",
    )
    over_steps: OverSteps | None = Field(
        default=None,
        description=(
            "A statistic over the last `window` values after the applied step, instead of each "
            "step's value. Not inherited from the rule: write it again to check the same "
            "statistic."
        ),
    )
    when: When = Field(
        description=(
            "When the action worked, in the syntax of a rule's `when` (e.g. '<= 0.5'). The "
            "opposite of the rule's condition is the usual choice."
        )
    )
    within_steps: int = Field(
        ge=1,
        description=(
            "How many steps after the applied step the effect may take; at least the window "
            "of over_steps."
        ),
    )

    @field_validator("when")
    @classmethod
    def _worst_needs_an_order(cls, when: Condition, info: ValidationInfo) -> Condition:
        return _check_worst(info.data.get("across_ranks"), when)

    @field_validator("within_steps")
    @classmethod
    def _window_fits(cls, within_steps: int, info: ValidationInfo) -> int:
        over = info.data.get("over_steps")
        if isinstance(over, OverSteps) and within_steps < over.window:
            raise ValueError(
                f"must be >= over_steps.window ({over.window}): a window of {over.window} "
                f"values after the applied step never fits in {within_steps} step(s), got "
                f"{within_steps}"
            )
        return within_steps


class Silence(_Model):
    """``silent``: the run (or the rule's stage) started no step for too long.

    The bound is ``max(factor x the median time between its recent steps, floor_s)``; until
    two steps have started, ``floor_s`` alone. Samples (stage ``system``) do not count as
    activity, nor do text records: a hung run still sends both.
    """

    factor: float = Field(
        default=5.0,
        gt=1,
        le=1000,
        description=(
            "How many median step times without a new step make the run silent (more than 1)."
        ),
    )
    floor_s: float = Field(
        default=300.0,
        ge=5,
        le=7 * 86400,
        description=(
            "The shortest silence, in seconds, that fires (5 s to 7 days): the bound while the "
            "steps are fast, or before two steps have started."
        ),
    )


class MissingRanks(_Model):
    """``missing_ranks``: ranks absent from the step's summary (closed without them)."""

    at_least: int = Field(
        default=1,
        ge=1,
        description=(
            "How many ranks must be missing: the same ranks in each of the rule's for_steps "
            "consecutive steps."
        ),
    )


SILENCE_ACTIONS: Final = ("alert", "capture_stacks")
"""The actions a silence rule may take: those no trainer has to carry out (a hung one cannot)."""


class Rule(_Model):
    """One rule: which value to watch, when it is bad, and what to do about it."""

    model_config = ConfigDict(json_schema_extra=_WORST_NEEDS_AN_ORDER)

    id: NonEmptyStr = Field(
        description="Name of the rule, unique in the file; its commands and state carry it."
    )
    description: str | None = Field(default=None, description="Free text for people.")
    metric: MetricNames | None = Field(
        default=None,
        description=(
            "The metric to watch: a name, or a list of aliases (names trainers or versions "
            "use for the same quantity). A list binds, per run attempt and stage, to the first "
            "name present in the first summary that carries any of them. With `when`; a rule "
            "has a metric, `silent` or `missing_ranks`."
        ),
    )
    silent: Silence | None = Field(
        default=None,
        description=(
            "Fire when the run (or `stage`) has started no step for longer than max(factor x "
            "its median step time, floor_s); once per silence. Actions: alert, capture_stacks."
        ),
    )
    missing_ranks: MissingRanks | None = Field(
        default=None,
        description=(
            "Fire when the same ranks are missing from for_steps consecutive steps' summaries "
            "(each closed without them); the command names them."
        ),
    )
    stage: NonEmptyStr | None = Field(
        default=None,
        description=(
            "Stage to watch (rollout, actor, trainer, ...). Absent: every stage, each with its "
            "own state. verl, TRL and OpenRLHF integrations publish as stage 'trainer'."
        ),
    )
    across_ranks: AcrossRanks = Field(
        default="mean",
        description=(
            "How a step's per-rank values become one value: mean (default), min, max, sum, "
            "std, or worst (max for > and >=, min for < and <=; only with those conditions)."
        ),
    )
    over_steps: OverSteps | None = Field(
        default=None,
        description=(
            "Compare a statistic of the last `window` values instead of the step's value; "
            "not evaluated until the window is full."
        ),
    )
    when: When | None = Field(
        default=None,
        description=(
            "When the value is bad: '<op> <number>' with op one of > >= < <= == != (quote it "
            "in YAML: when: \"> 0.3\"), 'outside [a, b]', or 'non_finite' (NaN or infinite). "
            "Comparisons with NaN are false. Required with `metric`."
        ),
    )
    for_steps: int = Field(
        default=1,
        ge=1,
        description="Consecutive evaluations the condition must hold before the rule fires.",
    )
    cooldown_steps: int = Field(
        default=0,
        ge=0,
        description=(
            "Evaluations after a firing during which the rule does not fire again; it keeps "
            "counting meanwhile and fires at the first qualifying evaluation after."
        ),
    )
    once: bool = Field(default=False, description="Fire at most once per run attempt.")
    mode: Mode = Field(
        default="enforce",
        description="enforce, or dry_run: commands are published marked dry-run, never applied.",
    )
    match: Match | None = Field(
        default=None, description="Apply the rule only to runs with these tags."
    )
    actions: list[ActionSpec] = Field(
        min_length=1,
        description="What to do when the rule fires, in this order; stop, if present, comes last.",
    )
    expect: Expectation | None = Field(
        default=None,
        description=(
            "What the action should achieve; each applied command then gets a verdict: "
            "effective, ineffective or unknown. Not with stop (no step follows it)."
        ),
    )

    @field_validator("id")
    @classmethod
    def _id_is_trimmed(cls, rule_id: str) -> str:
        if rule_id != rule_id.strip():
            raise ValueError(f"must not start or end with whitespace, got {rule_id!r}")
        return rule_id

    @field_validator("when")
    @classmethod
    def _worst_needs_an_order(cls, when: Condition, info: ValidationInfo) -> Condition:
        return _check_worst(info.data.get("across_ranks"), when)

    @model_validator(mode="after")
    def _one_condition(self) -> Rule:
        given = [name for name in ("metric", "silent", "missing_ranks") if getattr(self, name)]
        if len(given) != 1:
            raise ValueError(
                "a rule watches one thing: give metric (with when), silent or missing_ranks"
                + (f"; got {' and '.join(given)}" if given else "")
            )
        if self.metric is not None:
            if self.when is None:
                raise ValueError("a rule with a metric needs when")
            return self
        unused = ["when", "across_ranks", "over_steps", "expect"]
        if self.silent is not None:
            unused += ["for_steps", "cooldown_steps"]
        fields = type(self).model_fields
        extra = [name for name in unused if getattr(self, name) != fields[name].default]
        kind = "silent" if self.silent is not None else "missing_ranks"
        if extra:
            raise ValueError(f"{extra[0]} does not apply to a {kind} rule")
        if self.silent is not None:
            taken = [a.type for a in self.actions if a.type not in SILENCE_ACTIONS]
            if taken:
                raise ValueError(
                    f"a silent rule may only {' or '.join(SILENCE_ACTIONS)} (a hung trainer "
                    f"cannot apply {taken[0]})"
                )
        return self

    @field_validator("actions")
    @classmethod
    def _stop_comes_last(cls, actions: list[ActionSpec]) -> list[ActionSpec]:
        for index, action in enumerate(actions[:-1]):
            if action.type == "stop":
                after = actions[index + 1].type
                raise ValueError(
                    f"stop must be the last action: actions[{index + 1}] ({after}) after it "
                    f"would never run"
                )
        return actions

    @field_validator("expect")
    @classmethod
    def _expect_needs_steps_after(
        cls, expect: Expectation | None, info: ValidationInfo
    ) -> Expectation | None:
        actions = info.data.get("actions") or []
        if expect is not None and any(action.type == "stop" for action in actions):
            raise PydanticCustomError(
                "expect_after_stop",
                "cannot check a rule that stops the run: no step follows its command",
            )
        if expect is not None and expect.across_ranks is None:
            try:
                _check_worst(info.data.get("across_ranks"), expect.when)
            except ValueError as exc:
                raise ValueError(f"{exc}; it is the rule's, or set expect.across_ranks") from None
        return expect

    @property
    def metrics(self) -> tuple[str, ...]:
        """The metric name, or the alias names in order of preference (none: no metric)."""
        return () if self.metric is None else metric_names(self.metric)

    @property
    def stops(self) -> bool:
        """Whether one of the actions is ``stop``."""
        return any(action.type == "stop" for action in self.actions)

    @property
    def version(self) -> str:
        """First 12 hex digits of the sha256 of the normalised definition (defaults filled in).

        ``expect`` is left out: it does not change when the rule fires, so editing it keeps
        the rule's state (a pending check keeps the expectation it was issued with).
        """
        definition = self.model_dump(exclude={"expect"})
        for name in ("silent", "missing_ranks"):  # absent: the versions of earlier releases
            if definition[name] is None:
                del definition[name]
        normalised = json.dumps(definition, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(normalised.encode()).hexdigest()[:12]


class RuleSet(_Model):
    """A whole rules file: ``version: 1`` and the rules, evaluated in file order."""

    version: Literal[1] = Field(description="Format of the rules file: 1.")
    rules: list[Rule] = Field(description="The rules, evaluated in file order.")

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


@functools.cache
def rule_set_model(actions: ActionContracts) -> type[RuleSet]:
    """The model of a rules file whose actions are ``actions`` (:class:`RuleSet` for ACTIONS)."""
    if actions == ACTIONS:
        return RuleSet
    # The fields' types are made here, so they are Any to a type checker.
    spec: Any = action_spec_model(actions)
    rule_actions: Any = (
        list[spec],
        Field(min_length=1, description=Rule.model_fields["actions"].description),
    )
    rule: Any = create_model("Rule", __base__=Rule, actions=rule_actions)
    rules: Any = (list[rule], Field(description=RuleSet.model_fields["rules"].description))
    model: type[RuleSet] = create_model("RuleSet", __base__=RuleSet, rules=rules)
    return model
