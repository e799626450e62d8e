"""The pure step pipeline: events and acks in; summaries, commands and verdicts out.

:class:`StepPipeline` joins events with a :class:`~rlpulse.streams.joiner.StepJoiner` and
evaluates each summary the joiner releases with the current
:class:`~rlpulse.rules.evaluator.RuleEngine`, keeping every run attempt's rule state in a
mapping under :func:`~rlpulse.streams.keys.run_key`. It imports neither Kafka clients nor
faust: the worker drives it with its faust tables (and publishes what comes out), the
backtest with plain dicts over a recording, so both issue the same commands by
construction, not by two loops kept alike. The same state carries the checks of the
commands whose rules ``expect`` an effect (:mod:`rlpulse.rules.verdicts`): each evaluated
summary, each trainer ack (:meth:`StepPipeline.acknowledge`) and each ``run_end`` may decide
verdicts.

A rule engine that raises on a summary does not stop the pipeline: that summary comes out
with the error and no commands (the worker dead-letters it), its run's rule state stays as
it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from rlpulse.rules import verdicts
from rlpulse.rules.evaluator import RuleEngine
from rlpulse.rules.state import RunState, new_run_state
from rlpulse.schemas.records import (
    ActionVerdict,
    CommandAck,
    ControlCommand,
    StepSummary,
    TrainerEvent,
)
from rlpulse.settings import EventLimits, JoinerSettings
from rlpulse.streams.joiner import GroupState, JoinerStage, StepJoiner
from rlpulse.streams.keys import run_key

__all__ = ["PipelineTables", "Released", "StepOutput", "StepPipeline"]


@dataclass(frozen=True)
class Released:
    """One summary the joiner released, and what the rules made of it."""

    summary: StepSummary
    commands: list[ControlCommand] = field(default_factory=list)
    error: str | None = None
    """Why the rule engine failed on this summary (then there are no commands)."""
    verdicts: list[ActionVerdict] = field(default_factory=list)
    """The verdicts this summary decided."""


@dataclass(frozen=True)
class StepOutput:
    """What one event or one timer tick produced, in the order to publish it."""

    released: list[Released] = field(default_factory=list)
    rejected: str | None = None
    """Why the event was refused (``invalid: ...``, ``too_large: ...``, ``too_late: ...``)."""
    duplicate: bool = False
    """The event was a duplicate by (producer_id, seq) and changed nothing."""
    ended: list[ActionVerdict] = field(default_factory=list)
    """Verdicts decided by a ``run_end`` or an ack, after those of ``released``."""

    @property
    def summaries(self) -> list[StepSummary]:
        """The summaries released, in order."""
        return [item.summary for item in self.released]

    @property
    def commands(self) -> list[ControlCommand]:
        """Every command issued, in order."""
        return [command for item in self.released for command in item.commands]

    @property
    def verdicts(self) -> list[ActionVerdict]:
        """Every verdict decided, in order."""
        return [v for item in self.released for v in item.verdicts] + self.ended


@dataclass
class PipelineTables:
    """The state of a pipeline: the joiner's three mappings and the rule state per run attempt.

    Values are JSON-compatible documents; the worker passes faust tables, tests and the
    backtest pass dicts.
    """

    groups: MutableMapping[str, GroupState] = field(default_factory=dict)
    stages: MutableMapping[str, JoinerStage] = field(default_factory=dict)
    runs: MutableMapping[str, list[str]] = field(default_factory=dict)
    rules: MutableMapping[str, Any] = field(default_factory=dict)


class StepPipeline:
    """Joiner plus rule engine over caller-owned state; see the module docstring.

    ``engine`` returns the rule engine to evaluate the next summary with (the worker's may
    change when new rules are published).
    """

    def __init__(
        self,
        tables: PipelineTables,
        engine: Callable[[], RuleEngine],
        settings: JoinerSettings | None = None,
        limits: EventLimits | None = None,
    ) -> None:
        self.tables = tables
        self.joiner = StepJoiner(tables.groups, tables.stages, tables.runs, settings, limits)
        self._engine = engine

    def add(self, event: TrainerEvent, now_ns: int) -> StepOutput:
        """Join one event at wall-clock ``now_ns`` and evaluate what it released.

        A ``run_end`` also decides the run attempt's open checks (``unknown``), after the
        summaries it released were evaluated.
        """
        outcome = self.joiner.add(event, now_ns)
        released = self._evaluate(outcome.summaries, now_ns)
        ended: list[ActionVerdict] = []
        if event["kind"] == "run_end" and outcome.rejected is None:
            key = run_key(event["run_id"], event["attempt"])
            state: RunState | None = self.tables.rules.get(key)
            if state is not None and state.get("checks"):
                ended = verdicts.end_attempt(state, now_ns)
                self.tables.rules[key] = state
        return StepOutput(released, outcome.rejected, outcome.duplicate, ended)

    def acknowledge(self, ack: CommandAck, now_ns: int) -> StepOutput:
        """Take a trainer's ack: it may decide its command's verdict (in ``ended``)."""
        key = run_key(ack["run_id"], ack["attempt"])
        stored: RunState | None = self.tables.rules.get(key)
        state = stored if stored is not None else new_run_state(ack["run_id"], ack["attempt"])
        decided = verdicts.acknowledge(state, ack, now_ns)
        self.tables.rules[key] = state
        return StepOutput(ended=decided)

    def expire(self, now_ns: int, stage_keys: Iterable[str] | None = None) -> StepOutput:
        """Close the steps whose grace ran out and emit the revisions whose linger ran out.

        In ``stage_keys``, else everywhere. The rule engine evaluates revision 1 only.
        """
        return StepOutput(self._evaluate(self.joiner.expire(now_ns, stage_keys), now_ns))

    def _evaluate(self, summaries: list[StepSummary], now_ns: int) -> list[Released]:
        released: list[Released] = []
        for summary in summaries:
            key = run_key(summary["run_id"], summary["attempt"])
            state: RunState | None = self.tables.rules.get(key)
            try:
                state, commands = self._engine().evaluate(state, summary, now_ns)
            except Exception as exc:  # a bug must not stop the pipeline: keep the summary
                released.append(Released(summary, error=f"rule engine: {exc!r}"))
                continue
            decided = verdicts.observe(state, summary, now_ns)
            self.tables.rules[key] = state
            released.append(Released(summary, commands, verdicts=decided))
        return released
