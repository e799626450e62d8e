"""What a caller gives for one event or one text log record, and what a logger's records share.

:class:`EventFields` and :class:`LogFields` carry those fields from the public calls
(:meth:`EventLogger.log <rlpulse.producers.caller.logger.EventLogger.log>`,
:meth:`~rlpulse.producers.caller.logger.EventLogger.log_record`) to the encoders
(:mod:`rlpulse.producers.encoding.events`, :mod:`rlpulse.producers.encoding.logs`): one object
instead of a long argument list through each layer. The fields every record of a logger shares (run,
rank, host, ...) are the encoders' :class:`RecordSource`, made once per logger; ``seq`` and the
timestamp are given under the logger's lock. The first two are plain slotted classes: one is made
per record, on the hot path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rlpulse.schemas.records import EventKind

__all__ = ["EventFields", "LogFields", "RecordSource", "resolved"]


def resolved(value: int | None, field: str) -> int:
    """``value`` of a field the logger fills in before encoding; None there is a bug."""
    if value is None:
        raise ValueError(f"{field} was not filled in before encoding")
    return value


@dataclass(frozen=True)
class RecordSource:
    """The fields every event and log record of one logger shares: its run, rank and host."""

    run_id: str
    attempt: int
    rank: int
    tags: dict[str, str]
    hostname: str
    host_ip: str
    """The address the host's name resolves to; log records carry it, events do not."""
    pid: int
    producer_id: str


@dataclass(slots=True)
class EventFields:
    """One TrainerEvent's own fields, as :meth:`EventLogger.log` was called with them."""

    kind: EventKind
    step: int
    stage: str
    world_size: int | None
    """None: the logger's world size."""
    metrics: Mapping[str, float]
    level: str | None = None
    message: str | None = None
    policy_version: int | None = None
    trace_id: str | None = None


@dataclass(slots=True)
class LogFields:
    """One text log record's own fields (a LogEntry's, without ``seq`` and the timestamp)."""

    step: int | None
    """None: the step of the logger's last metrics event."""
    stage: str
    level: str
    levelno: int
    logger: str
    message: str
    exception: str | None = None
    trace_id: str | None = None
    fields: Mapping[str, str] | None = None
    sample_rate: float = 1.0
    sampled_out: Mapping[str, int] | None = None
