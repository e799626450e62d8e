"""Trainer side of rlpulse: publish TrainerEvents, receive and acknowledge ControlCommands.

``RunLink`` is the one object a training loop needs; ``EventLogger`` and ``ControlClient``
are its two halves, ``CommandBus`` hands rank 0's commands to every rank, and
``EventHandler`` publishes ``logging`` records (text ones to ``<prefix>.logs``),
``SamplingFilter`` samples chatty ones, ``trace`` sets the trace id they carry, and
``RankLogWriter`` writes the per-rank JSON Lines layout. ``Settings`` (from
:mod:`rlpulse.settings`) says where Kafka is and how the clients behave. Imports
confluent-kafka, pydantic and ``rlpulse.schemas`` (never faust).

Its rooms, each importing only the ones below it (docs/design.md, "Layout and layers"):

- :mod:`~rlpulse.producers.integrations`: rlpulse inside verl, Hugging Face and TRL;
- :mod:`~rlpulse.producers.caller`: what a training loop holds and calls, on its thread;
- :mod:`~rlpulse.producers.control`: the run's commands in, checked, on every rank, acked;
- :mod:`~rlpulse.producers.delivery`: the write-ahead log and sending it to Kafka;
- :mod:`~rlpulse.producers.encoding`: one call's fields, checked and encoded;
- :mod:`~rlpulse.producers.exceptions`: the errors of them all.
"""

# `producers/` at the repository root is a link to this folder (docs/design.md, "Layout"):
# importing it as `producers` would load every file a second time, under another name.
if __name__ != "rlpulse.producers":
    raise ImportError(f"import rlpulse.producers, not {__name__}: producers/ is a link to it")


from rlpulse.producers.caller.link import RunLink
from rlpulse.producers.caller.logger import EventLogger
from rlpulse.producers.caller.logging_handler import EventHandler
from rlpulse.producers.caller.sampling import SamplingFilter
from rlpulse.producers.caller.trace import current_trace_id, new_trace_id, trace
from rlpulse.producers.control.bus import Broadcast, CommandBus, single_process_broadcast
from rlpulse.producers.control.client import ControlClient
from rlpulse.producers.encoding.fields import EventFields, LogFields
from rlpulse.producers.exceptions import (
    EXIT_STOPPED_BY_RULE,
    InvalidFieldError,
    InvalidValueError,
    ProducerClosedError,
    ProducerError,
    RefusedSourceError,
    StopRequested,
)
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
