"""The serializer of the worker's faust Tables.

Table values are plain JSON documents. faust's own ``json`` codec may switch to
``orjson``, which writes NaN as ``null``; metric windows hold NaN on purpose, so
the tables use the standard library's encoder
(:mod:`rlpulse.streams.worker.json_values`), which keeps NaN and infinities.
"""

from __future__ import annotations

from typing import Any

from faust.serializers import codecs

from rlpulse.streams.worker.json_values import dumps, loads

CODEC_NAME = "rlpulse_state"


class StateCodec(codecs.Codec):
    """Compact stdlib JSON that round-trips NaN and +-inf."""

    def _dumps(self, obj: Any) -> bytes:
        return dumps(obj)

    def _loads(self, data: bytes) -> Any:
        return loads(data)


def register_state_codec() -> str:
    """Register the codec with faust (idempotent) and return its name."""
    if CODEC_NAME not in codecs.codecs:
        codecs.register(CODEC_NAME, StateCodec())
    return CODEC_NAME
