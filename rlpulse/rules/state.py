"""The evaluator's state: one JSON-serialisable dict per run attempt.

Layout (``RunState``)::

    {"format": 1, "run_id": "run-7", "attempt": 1,
     "stopped_by": null | {"command_id": ..., "rule_id": ..., "stage": ..., "step": 40},
     "stages": {"rollout": {"last_step": 20,
                            "rules": {"unstable-reward": <RuleState.to_dict()>}}}}

Only dicts, lists, str, int, float (NaN and infinities included), bool and None, so the
worker can keep it in a faust Table and the backtest in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, NotRequired, TypedDict

from rlpulse.rules.exceptions import RuleStateError

STATE_FORMAT: Final = 1


class StopRecord(TypedDict):
    """The enforced ``stop`` command a run attempt got; nothing is issued after it."""

    command_id: str
    rule_id: str
    stage: str
    step: int


class StageState(TypedDict):
    """State of one stage of a run attempt: the last evaluated step and each rule's state."""

    last_step: int
    rules: dict[str, dict[str, Any]]


class Pace(TypedDict):
    """When a stage (or the whole run) started its newest steps (:mod:`rlpulse.rules.silence`)."""

    stage: str  # the stage that started the newest step
    step: int  # the newest step started
    started_ns: int  # when the pipeline took its first event
    starts: list[list[int]]  # [step, started_ns] of the recent starts, oldest first


class SilenceRecord(TypedDict):
    """The newest step a silence rule fired for, and when."""

    step: int
    issued_ns: int


class RunState(TypedDict):
    """The whole evaluator state of one run attempt (run_id, attempt).

    ``checks`` and ``early_acks`` belong to the verdicts (:mod:`rlpulse.rules.verdicts`);
    a state without them (written before verdicts existed) has none open. ``pace``,
    ``silences``, ``tags`` and ``ended`` belong to the silence rules
    (:mod:`rlpulse.rules.silence`).
    """

    format: int
    run_id: str
    attempt: int
    stopped_by: StopRecord | None
    stages: dict[str, StageState]
    checks: NotRequired[dict[str, Any]]
    early_acks: NotRequired[dict[str, Any]]
    pace: NotRequired[dict[str, Pace]]  # stage name (or "*", the run) -> its pace
    silences: NotRequired[dict[str, SilenceRecord]]  # rule id -> its last firing
    tags: NotRequired[dict[str, str]]
    ended: NotRequired[bool]  # its run_end arrived


def new_run_state(run_id: str, attempt: int) -> RunState:
    """Return the state of a run attempt nothing was evaluated for yet."""
    return {
        "format": STATE_FORMAT,
        "run_id": run_id,
        "attempt": attempt,
        "stopped_by": None,
        "stages": {},
    }


def check_run_state(state: object, run_id: str, attempt: int) -> RunState:
    """``state`` if it is a run state of (run_id, attempt); raises :class:`RuleStateError`."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise RuleStateError(f"not a rule evaluator state of format {STATE_FORMAT}")
    if state.get("run_id") != run_id or state.get("attempt") != attempt:
        raise RuleStateError(
            f"state of run {state.get('run_id')!r} attempt {state.get('attempt')!r} "
            f"passed with a summary of run {run_id!r} attempt {attempt!r}"
        )
    checked: RunState = state  # type: ignore[assignment]  # the keys of RunState were checked
    return checked


class Status(StrEnum):
    """Where a rule stands after its last evaluation."""

    INACTIVE = "inactive"  # the condition did not hold, or the window was not full yet
    PENDING = "pending"  # it held, for fewer than for_steps consecutive evaluations
    BLOCKED = "blocked"  # it qualified, but cooldown, once or the run's stop kept it quiet
    FIRED = "fired"  # it issued a command at this evaluation


Point = tuple[int, float]  # (step, value)


@dataclass
class RuleState:
    """State of one rule for one (run, attempt, stage).

    Counters count evaluations (summaries that carried the metric), not step numbers.
    """

    version: str
    metric: str | None = None  # the bound name; an alias list binds once
    status: Status = Status.INACTIVE
    evaluations: int = 0
    window: list[Point] = field(default_factory=list)  # the last `window` reduced values
    streak: list[Point] = field(default_factory=list)  # the last for_steps values that held
    streak_length: int = 0  # consecutive evaluations that held, since the last firing
    active_since_step: int | None = None  # step where the current streak began
    fired_count: int = 0
    last_fired_evaluation: int | None = None
    last_fired_step: int | None = None
    ranks: list[int] = field(default_factory=list)  # missing_ranks: missing from every streak step

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-serialisable form kept in :class:`StageState`."""
        return {
            "version": self.version,
            "metric": self.metric,
            "status": self.status.value,
            "evaluations": self.evaluations,
            "window": [[step, value] for step, value in self.window],
            "streak": [[step, value] for step, value in self.streak],
            "streak_length": self.streak_length,
            "active_since_step": self.active_since_step,
            "fired_count": self.fired_count,
            "last_fired_evaluation": self.last_fired_evaluation,
            "last_fired_step": self.last_fired_step,
            "ranks": list(self.ranks),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RuleState:
        """Read back :meth:`to_dict` output (also after a JSON round trip)."""
        try:
            return cls(
                version=str(data["version"]),
                metric=data["metric"],
                status=Status(data["status"]),
                evaluations=int(data["evaluations"]),
                window=[(int(step), float(value)) for step, value in data["window"]],
                streak=[(int(step), float(value)) for step, value in data["streak"]],
                streak_length=int(data["streak_length"]),
                active_since_step=data["active_since_step"],
                fired_count=int(data["fired_count"]),
                last_fired_evaluation=data["last_fired_evaluation"],
                last_fired_step=data["last_fired_step"],
                ranks=[int(rank) for rank in data.get("ranks", ())],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RuleStateError(f"malformed rule state {data!r}: {exc!r}") from exc
