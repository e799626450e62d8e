"""The contracts of rlpulse: what its records, commands and files are.

Every version of each Avro schema and the codec (:mod:`.codec`, :mod:`.records`), topic
names (:mod:`.topics`), the one validation of an event (:mod:`.validation`), command
signing (:mod:`.signing`), the action contract (:mod:`.actions`), the trainers'
per-rank JSON Lines files (:mod:`.jsonl`) and the host clock header (:mod:`.clock`).
"""

# `schemas/` at the repository root is a link to this folder (docs/design.md, "Layout"):
# importing it as `schemas` would load every file a second time, under another name.
if __name__ != "rlpulse.schemas":
    raise ImportError(f"import rlpulse.schemas, not {__name__}: schemas/ is a link to it")


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
