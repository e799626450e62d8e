"""Trainer side of rlpulse: publish TrainerEvents, receive and acknowledge ControlCommands.

``RunLink`` is the one object a training loop needs; ``EventLogger`` and ``ControlClient``
are its two halves, ``CommandBus`` hands rank 0's commands to every rank, and
``EventHandler`` publishes ``logging`` records. Imports confluent-kafka and
``rlpulse.schemas`` only (never faust).
"""

from rlpulse.producers.bus import Broadcast, CommandBus, single_process_broadcast
from rlpulse.producers.config import ProducerConfig
from rlpulse.producers.control import ControlClient
from rlpulse.producers.exceptions import (
    EXIT_STOPPED_BY_RULE,
    InvalidFieldError,
    InvalidValueError,
    ProducerClosedError,
    ProducerConfigError,
    ProducerError,
    StopRequested,
)
from rlpulse.producers.link import RunLink
from rlpulse.producers.logger import EventLogger
from rlpulse.producers.logging_handler import EventHandler

__all__ = [
    "EXIT_STOPPED_BY_RULE",
    "Broadcast",
    "CommandBus",
    "ControlClient",
    "EventHandler",
    "EventLogger",
    "InvalidFieldError",
    "InvalidValueError",
    "ProducerClosedError",
    "ProducerConfig",
    "ProducerConfigError",
    "ProducerError",
    "RunLink",
    "StopRequested",
    "single_process_broadcast",
]
