"""Signed ControlCommands: an HMAC a trainer checks before it applies a command.

A deployment that sets ``security.control_signing_key`` shares one secret key between its
workers and operators (who sign what they write to the control topic) and its trainers
(who refuse what is not signed with it). Kafka's ACLs say who may write the control topic;
the signature says that whoever wrote a command held the key, so a command forged by any
other principal that may write there -- or replayed from elsewhere with another run,
attempt or action -- is refused.

The signature is ``HMAC-SHA256(key, DOMAIN + fingerprint + canonical)``:

- ``DOMAIN`` is the ASCII text ``rlpulse-control-command`` and a zero byte, so the key
  signs nothing else by accident;
- ``fingerprint`` is the 8-byte CRC-64-AVRO fingerprint of the newest ControlCommand schema
  (as in the single-object header);
- ``canonical`` is the Avro binary body of the command under that schema with
  ``signature`` null and the entries of every map (each action's ``params``, ``evidence``)
  in ascending order of their keys (Unicode code points); the actions keep their order.

Every field is covered, and so is each field a later schema version adds. Avro's binary
encoding of given values is unique, so a reader that decodes a command and encodes it again
this way gets the writer's bytes. The signature travels in the command's ``signature``
field (ControlCommand v2).
"""

from __future__ import annotations

import hashlib
import hmac
import io
from typing import Any

from fastavro import schemaless_writer

from rlpulse.schemas.codec import Codec, default_codec
from rlpulse.schemas.records import ControlCommand

__all__ = ["DOMAIN", "canonical_bytes", "sign", "signature_problem"]

DOMAIN = b"rlpulse-control-command\x00"


def _canonical_record(command: ControlCommand) -> dict[str, Any]:
    return {
        **command,
        "actions": [
            {"type": action["type"], "params": dict(sorted(action["params"].items()))}
            for action in command["actions"]
        ],
        "evidence": dict(sorted(command["evidence"].items())),
        "signature": None,
    }


def canonical_bytes(command: ControlCommand, codec: Codec | None = None) -> bytes:
    """What the signature of ``command`` covers: fingerprint + canonical Avro body."""
    schema = (codec or default_codec()).registry.latest("ControlCommand")
    buffer = io.BytesIO()
    schemaless_writer(buffer, schema.parsed, _canonical_record(command))
    return schema.fingerprint + buffer.getvalue()


def _mac(command: ControlCommand, key: bytes, codec: Codec | None) -> bytes:
    return hmac.new(key, DOMAIN + canonical_bytes(command, codec), hashlib.sha256).digest()


def sign(command: ControlCommand, key: bytes, codec: Codec | None = None) -> ControlCommand:
    """A copy of ``command`` carrying its signature with ``key``."""
    signed: ControlCommand = {**command, "signature": _mac(command, key, codec)}
    return signed


def signature_problem(
    command: ControlCommand, key: bytes, codec: Codec | None = None
) -> str | None:
    """Why ``command`` is not correctly signed with ``key``, or None when it is."""
    signature = command.get("signature")
    if not signature:
        return "it is not signed, and this trainer accepts only commands signed with its key"
    if not hmac.compare_digest(signature, _mac(command, key, codec)):
        return "its signature does not match: it was not signed with this trainer's key"
    return None
