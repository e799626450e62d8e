"""The trainer's check of a command's contents before the training loop sees it.

A command that reaches a trainer was validated where it was made (a rules file, the
``rlpulse control`` command line), but the trainer does not take that on trust: whatever
wrote the control topic, :func:`command_problem` refuses an action it does not know,
parameters it does not know or of the wrong type, a scale factor outside
``commands.scale_factor_min..scale_factor_max``, batch bounds below 1 or above
``commands.max_batch_size``, a growing factor without an upper bound, more than
``commands.max_actions`` actions, and text parameters that are too long or (a checkpoint
tag) could name another directory. The control client acks such a command ``rejected``
with the reason and never returns it (:class:`~rlpulse.producers.control.ControlClient`).

The action vocabulary is the wire contract of ``ControlCommand.actions`` (docs/design.md,
"Rules"): ``stop{}``, ``checkpoint{tag?}``, ``scale_rollout_batch{factor, min?, max?}``,
``set{key, value}``, ``alert{message, severity?}`` (a trainer logs an alert without a
severity as a warning).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from rlpulse.schemas.records import Action, ControlCommand, ParamValue
from rlpulse.settings import CommandLimits

__all__ = ["ACTION_PARAMS", "SEVERITIES", "action_problem", "command_problem"]

SEVERITIES = ("info", "warning", "critical")

ACTION_PARAMS: Mapping[str, tuple[frozenset[str], frozenset[str]]] = {
    "stop": (frozenset(), frozenset()),
    "checkpoint": (frozenset(), frozenset({"tag"})),
    "scale_rollout_batch": (frozenset({"factor"}), frozenset({"min", "max"})),
    "set": (frozenset({"key", "value"}), frozenset()),
    "alert": (frozenset({"message"}), frozenset({"severity"})),
}
"""Each action type and its (required, optional) parameters."""

Check = Callable[[Mapping[str, ParamValue], CommandLimits], str | None]


def command_problem(command: ControlCommand, limits: CommandLimits) -> str | None:
    """Why the trainer must not apply ``command``, or None when its contents are sound."""
    actions = command["actions"]
    if not actions:
        return "it has no actions"
    if len(actions) > limits.max_actions:
        return (
            f"it has {len(actions)} actions, more than commands.max_actions ({limits.max_actions})"
        )
    for index, action in enumerate(actions):
        problem = action_problem(action, limits)
        if problem is not None:
            return f"action {index + 1} ({action['type']!r:.80}): {problem}"
    return None


def action_problem(action: Action, limits: CommandLimits) -> str | None:
    """Why one action is unsound, or None."""
    kind = action["type"]
    if kind not in ACTION_PARAMS:
        return f"unknown action; known: {', '.join(ACTION_PARAMS)}"
    params = action["params"]
    required, optional = ACTION_PARAMS[kind]
    unknown = sorted(set(params) - required - optional)
    if unknown:
        return f"unknown parameter {unknown[0]!r:.80}; {kind} takes {_names(required | optional)}"
    missing = sorted(required - set(params))
    if missing:
        return f"parameter {missing[0]!r} is missing"
    return _CHECKS[kind](params, limits)


def _names(names: frozenset[str]) -> str:
    return ", ".join(sorted(names)) or "none"


def _text(name: str, value: ParamValue, limits: CommandLimits) -> str | None:
    if not isinstance(value, str) or not value:
        return f"{name} must be non-empty text, got {value!r:.80}"
    if len(value) > limits.max_text_chars:
        return f"{name} has {len(value)} characters, more than commands.max_text_chars"
    return None


def _number(value: ParamValue) -> float | None:
    """``value`` as a finite float, or None when it is not one (booleans are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _stop(params: Mapping[str, ParamValue], limits: CommandLimits) -> str | None:
    return None


def _checkpoint(params: Mapping[str, ParamValue], limits: CommandLimits) -> str | None:
    tag = params.get("tag")
    if tag is None:
        return None
    problem = _text("tag", tag, limits)
    if problem is not None:
        return problem
    assert isinstance(tag, str)
    if tag.startswith(".") or any(c in "/\\" or ord(c) < 32 or ord(c) == 127 for c in tag):
        return f"tag {tag!r:.80} must not start with '.' or hold '/', '\\' or control characters"
    return None


def _scale(params: Mapping[str, ParamValue], limits: CommandLimits) -> str | None:
    factor = _number(params["factor"])
    if factor is None:
        return f"factor must be a finite number, got {params['factor']!r:.80}"
    if not limits.scale_factor_min <= factor <= limits.scale_factor_max:
        return (
            f"factor {factor:g} is outside [{limits.scale_factor_min:g}, "
            f"{limits.scale_factor_max:g}] (commands.scale_factor_min/max)"
        )
    bounds: dict[str, int] = {}
    for name in ("min", "max"):
        value = params.get(name)
        if value is None:
            continue
        number = _number(value)
        if number is None or not number.is_integer():
            return f"{name} must be a whole number, got {value!r:.80}"
        if not 1 <= number <= limits.max_batch_size:
            return (
                f"{name} {int(number)} is outside [1, {limits.max_batch_size}] "
                "(commands.max_batch_size)"
            )
        bounds[name] = int(number)
    if "min" in bounds and "max" in bounds and bounds["min"] > bounds["max"]:
        return f"min {bounds['min']} is above max {bounds['max']}"
    if factor > 1 and "max" not in bounds:
        return (
            f"factor {factor:g} grows the batch without a bound: give max (at most "
            f"{limits.max_batch_size}, commands.max_batch_size)"
        )
    return None


def _set(params: Mapping[str, ParamValue], limits: CommandLimits) -> str | None:
    problem = _text("key", params["key"], limits)
    if problem is not None:
        return problem
    value = params["value"]
    if isinstance(value, str) and len(value) > limits.max_text_chars:
        return f"value has {len(value)} characters, more than commands.max_text_chars"
    if isinstance(value, float) and not math.isfinite(value):
        return f"value must be finite, got {value!r}"
    return None


def _alert(params: Mapping[str, ParamValue], limits: CommandLimits) -> str | None:
    severity = params.get("severity")
    if severity is not None and severity not in SEVERITIES:
        return f"severity must be one of {', '.join(SEVERITIES)}, got {severity!r:.80}"
    return _text("message", params["message"], limits)


_CHECKS: Mapping[str, Check] = {
    "stop": _stop,
    "checkpoint": _checkpoint,
    "scale_rollout_batch": _scale,
    "set": _set,
    "alert": _alert,
}
