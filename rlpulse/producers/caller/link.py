"""``RunLink``: one object per trainer process for events out and commands in."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from rlpulse.closing import ClosedByWith
from rlpulse.producers.caller.attempts import resume_attempt, write_attempt
from rlpulse.producers.caller.ending import CLOSED, FINISHED, RunEnding, stopped_by
from rlpulse.producers.caller.logger import EventLogger
from rlpulse.producers.caller.system import SystemSampler
from rlpulse.producers.control.bus import Broadcast, CommandBus
from rlpulse.producers.control.client import ControlClient
from rlpulse.producers.exceptions import EXIT_STOPPED_BY_RULE, StopRequested
from rlpulse.schemas.records import AckStatus, ControlCommand
from rlpulse.settings import Settings

EXPIRED_CHECK = "expired"
"""``detail["check"]`` of a rule's command acked ``rejected`` because it came too late."""


def stops(command: ControlCommand) -> bool:
    """Whether ``command`` has a ``stop`` action."""
    return any(action["type"] == "stop" for action in command["actions"])


def expiry(command: ControlCommand, step: int, max_age_steps: int | None) -> str | None:
    """Why a rule's scaling ``command`` polled at ``step`` is too old to apply; None if it is not.

    A rule decides to scale the batch on the window it saw at the command's step; applied many
    steps later (after a stall of the pipeline, when commands queued up arrive in one poll),
    that decision is stale and several of them would compound. Only commands from rules whose
    actions are all ``scale_rollout_batch`` expire: a stop or a checkpoint stays as valid late
    as it was on time, and an operator's command is meant for the next step.
    """
    if max_age_steps is None or command["origin"] != "rule" or command["step"] < 0:
        return None
    if any(action["type"] != "scale_rollout_batch" for action in command["actions"]):
        return None
    age = step - command["step"]
    if age <= max_age_steps:
        return None
    return (
        f"issued for step {command['step']}, polled at step {step}: {age} steps old, more than "
        f"producer.scale_max_age_steps={max_age_steps}"
    )


class RunLink(ClosedByWith):
    """A run's link to rlpulse: an :class:`EventLogger` and rank 0's :class:`ControlClient`.

    Every step, on every rank: ``link.log(...)``; ``link.poll_commands()`` (rank 0
    polls, the ``broadcast`` function hands the same commands to every rank — a
    collective, see :mod:`rlpulse.producers.control.bus`); apply each command, then
    ``link.ack(cmd, status=...)`` (rank 0 writes it); at the end of the step
    ``link.exit_if_stopped(step)``. ``link.close()`` at the end (also run at
    interpreter exit). Construction does no network I/O.

    Each run attempt ends with one ``run_end`` event, from rank 0, whose ``message`` says
    why (:mod:`rlpulse.producers.caller.ending`): the first of :meth:`run_end` (``training
    finished`` unless told otherwise), :meth:`exit_if_stopped` (``stopped by command <id>
    (<rule>)``) and :meth:`close` (the stop's reason after a stop, else ``closed``) sends
    it, and no later one. A plain :meth:`close` ends the run too: it is the call at the end
    of training. Not ended: a ``with`` block left by an error (an exception other than the
    stop and ``sys.exit(0)``), and a link the program never closed (closed at interpreter
    exit) — a crash, perhaps restarted; the archiver audits such a run once it has been
    silent for ``archive.audit_silent_after_s``.

    With ``producer.system_metrics_interval_s`` set, the link also samples its process's CPU,
    memory and GPU from its start, in stage ``system`` (see :mod:`rlpulse.producers.caller.system`);
    those samples are not training steps, so the ``run_end`` a link sends at the last step
    is the trainer's last step whatever they number.

    ``attempt`` is 0 for a fresh run; a process that resumes from a checkpoint
    starts a new attempt — build it with :meth:`resume`, and call
    :meth:`save_attempt` with each checkpoint saved.
    """

    def __init__(
        self,
        run_id: str,
        *,
        rank: int = 0,
        world_size: int = 1,
        attempt: int = 0,
        tags: Mapping[str, str] | None = None,
        settings: Settings | None = None,
        broadcast: Broadcast | None = None,
        redact: Callable[[str], str] | None = None,
    ) -> None:
        settings = settings if settings is not None else Settings()
        self.events = EventLogger(
            run_id, rank=rank, world_size=world_size, attempt=attempt, tags=tags,
            settings=settings, redact=redact,
        )  # fmt: skip
        """The event logger (counters ``logged``, ``delivered``, ``resent``, ``dropped``...)."""
        self.control = (
            ControlClient(run_id, attempt=attempt, settings=settings)
            if self.events.rank == 0
            else None
        )
        """Rank 0's control client (``dry_run_seen``, ``acked_command_ids``); None elsewhere."""
        self.bus = CommandBus(self.events.rank, broadcast)
        """How rank 0's commands reach every rank."""
        self.stop_command: ControlCommand | None = None
        """The first command with a ``stop`` action returned by :meth:`poll_commands`."""
        self.ending = RunEnding(self.events.rank)
        """Whether (and why) this attempt's ``run_end`` was sent (rank 0 only sends one)."""
        interval = settings.producer.system_metrics_interval_s
        self.system = SystemSampler(self.events, interval) if interval is not None else None
        """The system-metrics sampler, when ``producer.system_metrics_interval_s`` is set; it
        samples from the link's start to its close."""
        if self.system is not None:
            self.system.start()
        events = self.events
        self.log = events.log
        """Publish one event: :meth:`EventLogger.log`."""
        self.log_record = events.log_record
        """Publish one text log record: :meth:`EventLogger.log_record`."""
        self.log_event = events.log_event
        """Publish one event given as :class:`~rlpulse.producers.EventFields`."""
        self.log_line = events.log_line
        """Publish one text log record given as :class:`~rlpulse.producers.LogFields`."""
        self.log_samples = events.log_samples
        """Publish one step's rollout samples: :meth:`EventLogger.log_samples`."""

    @classmethod
    def resume(
        cls,
        run_id: str,
        checkpoint_dir: Path,
        *,
        rank: int = 0,
        world_size: int = 1,
        tags: Mapping[str, str] | None = None,
        settings: Settings | None = None,
        broadcast: Broadcast | None = None,
    ) -> RunLink:
        """A link for a process resuming ``run_id`` from ``checkpoint_dir``: a new attempt.

        Rank 0 takes the next attempt (see
        :func:`~rlpulse.producers.caller.attempts.resume_attempt`) and ``broadcast`` hands it to
        every rank — a collective like :meth:`poll_commands`.
        """
        bus = CommandBus(rank, broadcast)
        attempt = bus.share(resume_attempt(checkpoint_dir, run_id) if rank == 0 else 0)
        return cls(
            run_id,
            rank=rank,
            world_size=world_size,
            attempt=attempt,
            tags=tags,
            settings=settings,
            broadcast=broadcast,
        )

    @property
    def run_id(self) -> str:
        """The run this link reports for."""
        return self.events.run_id

    @property
    def settings(self) -> Settings:
        """The settings this link was built with."""
        return self.events.settings

    @property
    def rank(self) -> int:
        """The rank of this process."""
        return self.events.rank

    @property
    def attempt(self) -> int:
        """The run attempt this process is."""
        return self.events.attempt

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran."""
        return self.events.closed

    def run_start(self, step: int = 0) -> None:
        """Publish a ``run_start`` event; see :meth:`EventLogger.run_start`."""
        self.events.run_start(step)

    def run_end(self, step: int, reason: str = FINISHED) -> bool:
        """End the run attempt at ``step``: rank 0 publishes ``run_end`` with ``reason``, once.

        Returns whether this call published it: False on other ranks and once a
        ``run_end`` was sent (by this method, :meth:`exit_if_stopped` or :meth:`close`).
        System sampling stops on every rank.
        """
        if self.system is not None:
            self.system.stop()
        if not self.ending.claim(reason):
            return False
        self.events.run_end(step, reason)
        return True

    def poll_commands(
        self, timeout_s: float = 0.0, *, step: int | None = None
    ) -> list[ControlCommand]:
        """New commands for this run attempt, the same list on every rank.

        Rank 0 polls (see :meth:`ControlClient.poll`; ``timeout_s`` applies there)
        and the broadcast hands its list to every rank: call it on all ranks at the
        same point of the same step. Ranks other than 0 need a broadcast function.

        With ``step`` (the step the loop is at), a rule's ``scale_rollout_batch`` issued more
        than ``producer.scale_max_age_steps`` steps earlier is not returned: rank 0 acks it
        ``rejected`` with ``check=expired`` and the reason (see :func:`expiry`).
        """
        control = self.control
        commands = self.bus.commands(None if control is None else lambda: control.poll(timeout_s))
        if step is not None:
            commands = self._drop_expired(commands, step)
        if self.stop_command is None:
            self.stop_command = next((c for c in commands if stops(c)), None)
        return commands

    def _drop_expired(self, commands: list[ControlCommand], step: int) -> list[ControlCommand]:
        max_age = self.settings.producer.scale_max_age_steps
        kept = []
        for command in commands:
            why = expiry(command, step, max_age)
            if why is None:
                kept.append(command)
            else:
                detail = {"check": EXPIRED_CHECK, "reason": why}
                self.ack(command, "rejected", applied_at_step=step, detail=detail)
        return kept

    def ack(
        self,
        command: ControlCommand,
        status: AckStatus,
        *,
        applied_at_step: int | None = None,
        detail: Mapping[str, str] | None = None,
    ) -> bool:
        """Acknowledge ``command`` after applying it; see :meth:`ControlClient.ack`.

        Rank 0 writes the ack; on other ranks this does nothing and returns True.
        """
        if self.control is None:
            return True
        return self.control.ack(command, status, applied_at_step=applied_at_step, detail=detail)

    def exit_if_stopped(
        self, step: int | None = None, *, exit_code: int = EXIT_STOPPED_BY_RULE
    ) -> None:
        """End the process if a polled command said ``stop``; otherwise return.

        Call it at the end of a step, after the command's other actions (such as its
        checkpoint) were applied. Rank 0 acks the stop command ``applied`` (with
        ``stopped_at_step``) unless that was done and ends the run (``run_end`` at
        ``step``, default the last training step logged, unless one was sent), the link is
        closed (events flushed), and :class:`StopRequested` is raised: uncaught, the process
        exits with ``exit_code``, by default :data:`EXIT_STOPPED_BY_RULE` (0: launchers do
        not restart it; see its documentation).
        """
        command = self.stop_command
        if command is None:
            return
        if self.control is not None and command["command_id"] not in (
            self.control.acked_command_ids
        ):
            detail = {} if step is None else {"stopped_at_step": str(step)}
            self.control.ack(command, "applied", applied_at_step=step, detail=detail)
        self.run_end(self.events.last_step if step is None else step, stopped_by(command))
        self.close()
        raise StopRequested(command["command_id"], command["reason"], exit_code)

    def save_attempt(self, checkpoint_dir: Path) -> Path | None:
        """Record this attempt next to a checkpoint just saved (rank 0; None on other ranks)."""
        if self.rank != 0:
            return None
        return write_attempt(checkpoint_dir, self.run_id, self.attempt)

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait for queued events; return how many remain (see :meth:`EventLogger.flush`)."""
        return self.events.flush(timeout_s)

    def close(self, timeout_s: float | None = None, *, end: bool = True) -> int:
        """End the run unless it was ended, close the control client, then the logger.

        Returns the records Kafka had not acknowledged at close (they wait in the write-ahead
        log). With ``end`` (the default), rank 0 of a link that logged anything sends
        ``run_end`` at the last training step logged (:attr:`EventLogger.last_step`: system
        samples do not count) unless one was sent: the stop's reason after a polled ``stop``,
        else ``closed``. ``end=False`` closes without it. A second call does nothing.
        """
        if end and self.events.logged and not self.events.closed:
            reason = CLOSED if self.stop_command is None else stopped_by(self.stop_command)
            self.run_end(self.events.last_step, reason)
        if self.system is not None:
            self.system.stop()
        if self.control is not None:
            self.control.close()
        return self.events.close(timeout_s)

    def close_after(self, exc: BaseException | None) -> None:
        """Close at the end of a ``with`` block; a crash (``exc``) does not end the run."""
        self.close(end=_ends_the_run(exc))


def _ends_the_run(exc: BaseException | None) -> bool:
    """Whether leaving a ``with`` block with ``exc`` ends the run: not after a crash."""
    if exc is None or isinstance(exc, StopRequested):
        return True
    return isinstance(exc, SystemExit) and exc.code in (0, None)
