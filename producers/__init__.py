"""Trainer side of rlpulse: publish TrainerEvents, receive and acknowledge ControlCommands.

``RunLink`` is the one object a training loop needs; ``EventLogger`` and ``ControlClient``
are its two halves. Imports confluent-kafka and ``rlpulse.schemas`` only (never faust).
"""

from rlpulse.producers.config import ProducerConfig
from rlpulse.producers.control import ControlClient
from rlpulse.producers.exceptions import (
    InvalidFieldError,
    InvalidValueError,
    ProducerClosedError,
    ProducerConfigError,
    ProducerError,
)
from rlpulse.producers.link import RunLink
from rlpulse.producers.logger import EventLogger

__all__ = [
    "ControlClient",
    "EventLogger",
    "InvalidFieldError",
    "InvalidValueError",
    "ProducerClosedError",
    "ProducerConfig",
    "ProducerConfigError",
    "ProducerError",
    "RunLink",
]
