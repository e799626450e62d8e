"""Applying a ControlCommand's actions in a trainer, shared by the framework integrations.

An integration maps each action type it supports to an :data:`ActionHandler`;
:func:`apply_command` runs a command's actions in order and folds their results into
the one ack status and detail the command gets. :func:`resize_batch` is the arithmetic
of ``scale_rollout_batch`` (docs/design.md, "Commands at the trainer": ``new =
clamp(round(current * factor), min, max)``), plus the trainer's own constraint that the
size stay a multiple of a unit.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from rlpulse.producers.integrations.exceptions import ActionRejectedError
from rlpulse.schemas.records import AckStatus, Action, ControlCommand, ParamValue

log = logging.getLogger(__name__)

# Folding the statuses of a command's actions: the most severe one wins.
_SEVERITY: dict[AckStatus, int] = {"noop": 0, "applied": 1, "rejected": 2, "failed": 3}


@dataclass(frozen=True)
class ActionResult:
    """What one action did: ``applied`` or ``noop``, and the facts for the ack's detail."""

    status: AckStatus
    detail: Mapping[str, str] = field(default_factory=dict)


ActionHandler = Callable[[Action], ActionResult]
"""Applies one action; raises :class:`ActionRejectedError` when it cannot (any other error
makes the action ``failed``)."""


@dataclass(frozen=True)
class Outcome:
    """The ack a command gets once its actions ran."""

    status: AckStatus
    detail: dict[str, str]


def alert(action: Action) -> ActionResult:
    """The trainer's part of an ``alert`` action: log it (the exporter does the alerting)."""
    params = action["params"]
    log.warning("rlpulse alert (%s): %s", params.get("severity", "warning"), params.get("message"))
    return ActionResult("noop", {"note": "alerts are raised by the exporter; logged here"})


def left_to_agents(action: Action) -> ActionResult:
    """The trainer's part of ``capture_stacks``: none (the host agents take the stacks)."""
    return ActionResult("noop", {"note": "the host agents take the stacks"})


def apply_command(command: ControlCommand, handlers: Mapping[str, ActionHandler]) -> Outcome:
    """Run ``command``'s actions in order with ``handlers``; return its ack.

    Every action runs even when an earlier one was rejected or failed (a ``stop`` after
    a failed ``checkpoint`` still stops). The status is the most severe of the actions'
    (failed > rejected > applied > noop); the detail has ``<type>.status`` and each fact
    as ``<type>.<key>`` (``<type>[<index>]`` when a type repeats), and a rejection or
    failure as ``<type>.reason``.
    """
    counts = Counter(action["type"] for action in command["actions"])
    statuses: list[AckStatus] = []
    detail: dict[str, str] = {}
    for index, action in enumerate(command["actions"]):
        kind = action["type"]
        name = kind if counts[kind] == 1 else f"{kind}[{index}]"
        status, facts = _run(command, action, handlers)
        statuses.append(status)
        detail[f"{name}.status"] = status
        detail.update({f"{name}.{key}": value for key, value in facts.items()})
    status = max(statuses, key=_SEVERITY.__getitem__) if statuses else "noop"
    return Outcome(status, detail)


def _run(
    command: ControlCommand, action: Action, handlers: Mapping[str, ActionHandler]
) -> tuple[AckStatus, Mapping[str, str]]:
    handler = handlers.get(action["type"])
    if handler is None and action["type"] == "capture_stacks":
        handler = left_to_agents
    try:
        if handler is None:
            raise ActionRejectedError(
                f"action {action['type']!r} is not supported here; supported: "
                + ", ".join(sorted(handlers))
            )
        result = handler(action)
    except ActionRejectedError as exc:
        log.warning("command %s: %s rejected: %s", command["command_id"], action["type"], exc)
        return "rejected", {"reason": str(exc)}
    except Exception as exc:  # an action that breaks is acked `failed`, training goes on
        log.exception("command %s: %s failed", command["command_id"], action["type"])
        return "failed", {"reason": f"{type(exc).__name__}: {exc}"}
    return result.status, result.detail


@dataclass(frozen=True)
class BatchResize:
    """A batch size change: ``old`` -> ``new``, via ``requested`` (before the unit)."""

    old: int
    requested: int
    new: int
    unit: int

    def result(self, **extra: str) -> ActionResult:
        """The action's result: ``noop`` when the size does not change, else ``applied``."""
        detail = {
            "old": str(self.old),
            "new": str(self.new),
            "requested": str(self.requested),
            "unit": str(self.unit),
            **extra,
        }
        return ActionResult("noop" if self.new == self.old else "applied", detail)


def resize_batch(current: int, params: Mapping[str, ParamValue], unit: int = 1) -> BatchResize:
    """The size ``scale_rollout_batch`` asks for, a multiple of ``unit``.

    ``requested = clamp(round(current * factor), min, max)``; ``new`` is the largest
    multiple of ``unit`` not above it that is at least ``min`` (and ``unit``), else the
    smallest multiple above it up to ``max``. Raises :class:`ActionRejectedError` for a
    missing or non-positive ``factor``, ``min > max``, or no multiple of ``unit`` in
    ``[min, max]``.
    """
    factor = _param(params, "factor", required=True)
    low = _param(params, "min")
    high = _param(params, "max")
    if factor is None or factor <= 0:
        raise ActionRejectedError(f"factor must be a number > 0, got {params.get('factor')!r}")
    lowest = 1 if low is None else max(1, math.ceil(low))
    highest = None if high is None else math.floor(high)
    if highest is not None and highest < lowest:
        raise ActionRejectedError(f"min {low} is above max {high}")
    requested = max(lowest, round(current * factor))
    if highest is not None:
        requested = min(requested, highest)
    below = requested // unit * unit
    if below >= max(lowest, unit):
        return BatchResize(current, requested, below, unit)
    above = -(-requested // unit) * unit
    if highest is None or above <= highest:
        return BatchResize(current, requested, above, unit)
    raise ActionRejectedError(
        f"no multiple of {unit} (the batch size unit) lies in [{lowest}, {highest}]"
    )


def _param(params: Mapping[str, ParamValue], name: str, *, required: bool = False) -> float | None:
    value = params.get(name)
    if value is None:
        if required:
            raise ActionRejectedError(f"parameter {name!r} is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ActionRejectedError(f"parameter {name!r} must be a finite number, got {value!r}")
    return float(value)
