"""Wire contracts of rlpulse: every version of each Avro schema, and the codec."""

if __name__ != "rlpulse.schemas":  # the repo root's `schemas` is a link to this folder; see docs/design.md
    raise ImportError(f"import rlpulse.schemas, not {__name__}: `schemas/` at the repository root is a "
                      "link to rlpulse/schemas, never a package of its own")


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
