"""Wire contracts of rlpulse: every version of each Avro schema, and the codec."""

from rlpulse.schemas.codec import Codec, SchemaRegistry, default_codec
from rlpulse.schemas.exceptions import DecodeError, DecodeFailure, EncodeError, SchemaError
from rlpulse.schemas.records import CommandAck, ControlCommand, StepSummary, TrainerEvent

__all__ = [
    "Codec",
    "CommandAck",
    "ControlCommand",
    "DecodeError",
    "DecodeFailure",
    "EncodeError",
    "SchemaError",
    "SchemaRegistry",
    "StepSummary",
    "TrainerEvent",
    "default_codec",
]
