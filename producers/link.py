"""``RunLink``: one object per trainer process for events out and commands in."""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

from rlpulse.producers.config import ProducerConfig
from rlpulse.producers.control import ControlClient
from rlpulse.producers.logger import EventLogger
from rlpulse.schemas.records import AckStatus, ControlCommand, EventKind


class RunLink:
    """A training run's link to rlpulse: an :class:`EventLogger` plus a :class:`ControlClient`.

    ``link.log(...)`` every step, ``link.poll_commands()`` (non-blocking, deduplicated),
    ``link.ack(cmd, status=...)`` after applying a command, ``link.close()`` at the end.
    Construction does no network I/O. In SPMD jobs rank 0 polls and broadcasts.
    """

    def __init__(
        self,
        run_id: str,
        *,
        rank: int = 0,
        world_size: int = 1,
        attempt: int = 0,
        tags: Mapping[str, str] | None = None,
        config: ProducerConfig | None = None,
    ) -> None:
        config = config if config is not None else ProducerConfig()
        self.events = EventLogger(
            run_id, rank=rank, world_size=world_size, attempt=attempt, tags=tags, config=config
        )
        """The event logger (its counters: ``sent``, ``delivered``, ``failed``, ``dropped``)."""
        self.control = ControlClient(run_id, attempt=attempt, config=config)
        """The control client (``dry_run_seen``, ``acked_command_ids``)."""

    @property
    def run_id(self) -> str:
        """The run this link reports for."""
        return self.events.run_id

    def log(
        self,
        metrics: Mapping[str, float],
        step: int,
        stage: str = "trainer",
        *,
        kind: EventKind = "metrics",
        level: str | None = None,
        message: str | None = None,
        world_size: int | None = None,
        policy_version: int | None = None,
        trace_id: str | None = None,
    ) -> None:
        """Publish one event; see :meth:`EventLogger.log`."""
        self.events.log(
            metrics,
            step,
            stage,
            kind=kind,
            level=level,
            message=message,
            world_size=world_size,
            policy_version=policy_version,
            trace_id=trace_id,
        )

    def run_start(self, step: int = 0) -> None:
        """Publish a ``run_start`` event; see :meth:`EventLogger.run_start`."""
        self.events.run_start(step)

    def run_end(self, step: int) -> None:
        """Publish a ``run_end`` event; see :meth:`EventLogger.run_end`."""
        self.events.run_end(step)

    def poll_commands(self, timeout_s: float = 0.0) -> list[ControlCommand]:
        """Return new commands for this run attempt; see :meth:`ControlClient.poll`."""
        return self.control.poll(timeout_s)

    def ack(
        self,
        command: ControlCommand,
        status: AckStatus,
        *,
        applied_at_step: int | None = None,
        detail: Mapping[str, str] | None = None,
    ) -> bool:
        """Acknowledge ``command``; see :meth:`ControlClient.ack`."""
        return self.control.ack(command, status, applied_at_step=applied_at_step, detail=detail)

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait for queued events; return how many remain (see :meth:`EventLogger.flush`)."""
        return self.events.flush(timeout_s)

    def close(self, timeout_s: float = 10.0) -> int:
        """Close the control client, then flush and close the logger; return events lost."""
        self.control.close()
        return self.events.close(timeout_s)

    def __enter__(self) -> RunLink:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
