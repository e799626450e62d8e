"""The one validation of a TrainerEvent: what the worker dead-letters, the trainer refuses.

The trainer's ``log()``, the per-rank JSON Lines writer and the step joiner all call
:func:`event_problem`. The worker sends a refused event to the dead-letter topic with
``str(problem)`` as its reason; the trainer counts it per :attr:`EventProblem.code`, warns
once per code, and does not send it. Problems come in two kinds: ``invalid`` (the event
cannot be joined as it is) and ``too_large`` (beyond the :class:`~rlpulse.settings.EventLimits`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from rlpulse.settings import EventLimits

__all__ = [
    "EVENT_KINDS",
    "KEY_SEPARATOR",
    "EventProblem",
    "count_problem",
    "event_problem",
    "metric_number",
    "name_problem",
    "position_problem",
    "run_problem",
    "size_problem",
    "stage_problem",
]

KEY_SEPARATOR: Final = "|"
"""Separates the parts of the joiner's state keys; a stage name must not contain it."""

EVENT_KINDS: Final = frozenset({"metrics", "log", "run_start", "run_end"})
_INT_FIELDS: Final = ("step", "rank", "world_size", "timestamp_ns", "seq")

ProblemKind = Literal["invalid", "too_large"]


@dataclass(frozen=True)
class EventProblem:
    """Why an event is refused: its kind, a stable code to count it by, and the details."""

    kind: ProblemKind
    code: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


def _invalid(code: str, detail: str) -> EventProblem:
    return EventProblem("invalid", code, detail)


def _too_large(code: str, detail: str) -> EventProblem:
    return EventProblem("too_large", code, detail)


def metric_number(value: object) -> float | None:
    """A metric's value as a float, or None when it is not a number.

    A number is what ``float()`` takes, text aside: ints, floats, bools, numpy scalars,
    one-element tensors (NaN and infinities kept). Strings, bytes, None, arrays of several
    elements and other objects are not. Every writer of metrics on the trainer side (``log()``,
    the logging handler, the framework integrations, the per-rank JSON Lines writer) asks this.
    """
    if value is None or isinstance(value, str | bytes | bytearray):  # float() takes "1.5"
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of several elements
        return None


def stage_problem(stage: object) -> EventProblem | None:
    """Why ``stage`` cannot name a stage (empty, not a string, or containing ``|``), or None."""
    if not stage or not isinstance(stage, str):
        return _invalid("stage", f"stage {stage!r} is not a non-empty string")
    if KEY_SEPARATOR in stage:
        return _invalid("stage_separator", f"stage {stage!r} contains {KEY_SEPARATOR!r}")
    return None


def size_problem(size: int, limits: EventLimits) -> EventProblem | None:
    """Why an encoded event of ``size`` bytes is too large, or None."""
    if size > limits.max_event_bytes:
        return _too_large("event_bytes", f"{size} bytes > {limits.max_event_bytes}")
    return None


def run_problem(run_id: object, attempt: object, limits: EventLimits) -> EventProblem | None:
    """Why ``run_id`` and ``attempt`` cannot identify a run attempt, or None."""
    if not run_id or not isinstance(run_id, str):
        return _invalid("run_id", f"run_id {run_id!r} is not a non-empty string")
    if len(run_id) > limits.max_name_chars:
        return _too_large("name_chars", f"run_id of {len(run_id)} chars > {limits.max_name_chars}")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        return _invalid("attempt", f"attempt {attempt!r} is not an integer >= 0")
    return None


def position_problem(
    step: int, rank: int, world_size: int, limits: EventLimits
) -> EventProblem | None:
    """Why ``step``, ``rank`` and ``world_size`` cannot place an event, or None."""
    if step < 0:
        return _invalid("negative_step", f"negative step {step}")
    if world_size < 1:
        return _invalid("world_size", f"world_size {world_size} < 1")
    if world_size > limits.max_world_size:
        return _too_large("world_size", f"world_size {world_size} > {limits.max_world_size}")
    if not 0 <= rank < world_size:
        return _invalid("rank", f"rank {rank} outside [0, {world_size})")
    return None


def name_problem(text: str, limits: EventLimits) -> EventProblem | None:
    """Why ``text`` is too long for a stage, producer id, metric name or tag, or None."""
    if len(text) > limits.max_name_chars:
        return _too_large(
            "name_chars", f"a name or tag of {len(text)} chars > {limits.max_name_chars}"
        )
    return None


def count_problem(metrics: int, tags: int, limits: EventLimits) -> EventProblem | None:
    """Why an event with ``metrics`` metrics and ``tags`` tags is too large, or None."""
    if metrics > limits.max_metrics:
        return _too_large("metrics", f"{metrics} metrics > {limits.max_metrics}")
    if tags > limits.max_tags:
        return _too_large("tags", f"{tags} tags > {limits.max_tags}")
    return None


_FLOAT = frozenset({float})


def event_problem(event: Mapping[str, Any], limits: EventLimits) -> EventProblem | None:
    """Why ``event`` (a decoded TrainerEvent) must be refused, or None if it may be joined."""
    try:
        return _problem(event, limits)
    except KeyError as exc:
        return _invalid("missing_field", f"missing field {exc}")
    except (TypeError, AttributeError) as exc:
        return _invalid("malformed", f"malformed event ({exc})")


def _problem(event: Mapping[str, Any], limits: EventLimits) -> EventProblem | None:
    kind = event["kind"]
    if kind not in EVENT_KINDS:
        return _invalid("kind", f"unknown kind {kind!r}, expected one of {sorted(EVENT_KINDS)}")
    problem = run_problem(event["run_id"], event["attempt"], limits)
    if problem is not None or kind in ("run_start", "run_end"):
        return problem
    not_int = [name for name in _INT_FIELDS if not isinstance(event[name], int)]
    if not_int:
        return _invalid("not_integer", f"{', '.join(not_int)} must be integers")
    stage = event["stage"]
    problem = stage_problem(stage) or position_problem(
        event["step"], event["rank"], event["world_size"], limits
    )
    if problem is not None:
        return problem
    metrics, tags, producer_id = event["metrics"], event["tags"], event["producer_id"]
    if not set(map(type, metrics.values())) <= _FLOAT:  # what a decoded event holds: at C speed
        not_number = [
            k for k, v in metrics.items() if not isinstance(v, int | float) or isinstance(v, bool)
        ]
        if not_number:
            return _invalid("not_number", f"metrics {not_number} are not numbers")
    if not isinstance(tags, dict) or not isinstance(producer_id, str):
        return _invalid("malformed", "tags must be a map and producer_id a string")
    problem = count_problem(len(metrics), len(tags), limits)
    if problem is not None:
        return problem
    if (
        len(stage) <= limits.max_name_chars
        and len(producer_id) <= limits.max_name_chars
        and max(map(len, metrics), default=0) <= limits.max_name_chars
        and not tags
    ):
        return None
    longest = max((stage, producer_id, *metrics, *tags, *tags.values()), key=len)
    return name_problem(longest, limits)
