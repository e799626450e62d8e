"""Trainer side of rlpulse: publish TrainerEvents, receive and acknowledge ControlCommands.

``RunLink`` is the one object a training loop needs; ``EventLogger`` and ``ControlClient``
are its two halves, ``CommandBus`` hands rank 0's commands to every rank, and
``EventHandler`` publishes ``logging`` records (text ones to ``<prefix>.logs``),
``SamplingFilter`` samples chatty ones, ``trace`` sets the trace id they carry, and
``RankLogWriter`` writes the per-rank JSON Lines layout. ``Settings`` (from
:mod:`rlpulse.settings`) says where Kafka is and how the clients behave. Imports
confluent-kafka, pydantic and ``rlpulse.schemas`` (never faust).
"""

# `producers/` at the repository root is a link to this folder (docs/design.md, "Layout"):
# importing it as `producers` would load every file a second time, under another name.
if __name__ != "rlpulse.producers":
    raise ImportError(f"import rlpulse.producers, not {__name__}: producers/ is a link to it")


from rlpulse.producers.bus import Broadcast, CommandBus, single_process_broadcast
from rlpulse.producers.control import ControlClient
from rlpulse.producers.exceptions import (
    EXIT_STOPPED_BY_RULE,
    InvalidFieldError,
    InvalidValueError,
    ProducerClosedError,
    ProducerError,
    RefusedSourceError,
    StopRequested,
)
from rlpulse.producers.fields import EventFields, LogFields
from rlpulse.producers.link import RunLink
from rlpulse.producers.logger import EventLogger
from rlpulse.producers.logging_handler import EventHandler
from rlpulse.producers.sampling import SamplingFilter
from rlpulse.producers.trace import current_trace_id, new_trace_id, trace
from rlpulse.schemas.jsonl import RankLogWriter
from rlpulse.settings import Settings

__all__ = [
    "EXIT_STOPPED_BY_RULE",
    "Broadcast",
    "CommandBus",
    "ControlClient",
    "EventFields",
    "EventHandler",
    "EventLogger",
    "InvalidFieldError",
    "InvalidValueError",
    "LogFields",
    "ProducerClosedError",
    "ProducerError",
    "RankLogWriter",
    "RefusedSourceError",
    "RunLink",
    "SamplingFilter",
    "Settings",
    "StopRequested",
    "current_trace_id",
    "new_trace_id",
    "single_process_broadcast",
    "trace",
]
