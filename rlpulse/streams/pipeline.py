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

from rlpulse.rules import silence, verdicts
from rlpulse.rules.evaluator import RuleEngine
from rlpulse.rules.state import RunState, new_run_state
from rlpulse.schemas.records import (
    READING_STAGES,
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
    silences: list[ControlCommand] = field(default_factory=list)
    """Commands of silence rules (a tick's), after those of ``released``."""

    @property
    def summaries(self) -> list[StepSummary]:
        """The summaries released, in order."""
        return [item.summary for item in self.released]

    @property
    def commands(self) -> list[ControlCommand]:
        """Every command issued, in order."""
        return [command for item in self.released for command in item.commands] + self.silences

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
        if outcome.rejected is None and not outcome.duplicate:
            self._note_activity(event, now_ns)
        released = self._evaluate(outcome.summaries, now_ns)
        ended: list[ActionVerdict] = []
        if event["kind"] == "run_end" and outcome.rejected is None:
            key = run_key(event["run_id"], event["attempt"])
            state: RunState | None = self.tables.rules.get(key)
            if state is not None and (state.get("checks") or not state.get("ended")):
                ended = verdicts.end_attempt(state, now_ns) if state.get("checks") else []
                state["ended"] = True
                self.tables.rules[key] = state
        return StepOutput(released, outcome.rejected, outcome.duplicate, ended)

    def _note_activity(self, event: TrainerEvent, now_ns: int) -> None:
        """A metrics event of a step no stage of its run started yet starts the silence clock.

        Samples (stage ``system``) are not activity (:mod:`rlpulse.rules.silence`).
        """
        if event["kind"] != "metrics" or event["stage"] in READING_STAGES:
            return
        key = run_key(event["run_id"], event["attempt"])
        stored: RunState | None = self.tables.rules.get(key)
        state = stored if stored is not None else new_run_state(event["run_id"], event["attempt"])
        if silence.note_start(state, event["stage"], event["step"], now_ns, event["tags"] or {}):
            self.tables.rules[key] = state

    def acknowledge(self, ack: CommandAck, now_ns: int) -> StepOutput:
        """Take a trainer's ack: it may decide its command's verdict (in ``ended``)."""
        key = run_key(ack["run_id"], ack["attempt"])
        stored: RunState | None = self.tables.rules.get(key)
        state = stored if stored is not None else new_run_state(ack["run_id"], ack["attempt"])
        decided = verdicts.acknowledge(state, ack, now_ns)
        self.tables.rules[key] = state
        return StepOutput(ended=decided)

    def expire(
        self,
        now_ns: int,
        stage_keys: Iterable[str] | None = None,
        run_keys: Iterable[str] | None = None,
    ) -> StepOutput:
        """Close overdue steps, emit lingering revisions, issue the due silence commands.

        Steps whose grace ran out and revisions whose linger ran out in ``stage_keys``,
        silences of the run attempts in ``run_keys``; each None: everywhere. The rule engine
        evaluates revision 1 only.
        """
        released = self._evaluate(self.joiner.expire(now_ns, stage_keys), now_ns)
        engine = self._engine()
        if not engine.watches_silence:
            return StepOutput(released)
        issued: list[ControlCommand] = []
        for key in list(self.tables.rules) if run_keys is None else run_keys:
            state: RunState | None = self.tables.rules.get(key)
            if state is None or "pace" not in state:
                continue
            commands = engine.silences(state, now_ns)
            if commands:
                self.tables.rules[key] = state
                issued += commands
        return StepOutput(released, silences=issued)

    def silence_due_ns(self) -> int | None:
        """When the next silence rule is due for any run attempt (None: none is watched)."""
        engine = self._engine()
        if not engine.watches_silence:
            return None
        return min(
            (
                due
                for state in self.tables.rules.values()
                if "pace" in state and (due := engine.silence_due_ns(state)) is not None
            ),
            default=None,
        )

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
