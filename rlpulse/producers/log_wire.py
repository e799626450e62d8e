"""The hot-path encoder of one logger's LogRecords (``<prefix>.logs``).

Like :mod:`rlpulse.producers.wire` for events: fastavro's ``schemaless_writer`` takes about
14 us per log record, more than the ``logging`` call around it, while most of a record's
bytes (run id, rank, host, pid, producer id, tags) are the same for every record of a
logger. :class:`LogEncoder` writes those once; a record costs a few microseconds. The
output is byte-identical to ``Codec.encode("LogRecord", ...)`` (a property test checks
it); if the newest LogRecord schema is not :data:`FAST_FINGERPRINT`, records go through
the codec.

Messages and tracebacks longer than a record may be are cut (with a note saying how much
was cut), never refused: a log line that explains a crash must arrive.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

from rlpulse.producers.wire import avro_string, zigzag
from rlpulse.schemas.codec import MAGIC, Codec
from rlpulse.schemas.records import LogRecord

__all__ = ["FAST_FINGERPRINT", "LogEncoder", "LogSource", "TimestampVarint", "fit_text"]

FAST_FINGERPRINT = bytes.fromhex("6db7cccdb56f4a74")
"""CRC-64-AVRO fingerprint (as on the wire) of LogRecord v1, the layout written here."""

_DOUBLE = struct.Struct("<d").pack
_NULL = b"\x00"
_SOME = b"\x02"
_END_OF_MAP = b"\x00"
_RATE_ONE = _DOUBLE(1.0)
_CACHE_MAX = 4096


def fit_text(text: str, max_bytes: int) -> str:
    """``text``, cut to at most ``max_bytes`` UTF-8 bytes with a note of what was cut."""
    if len(text) * 4 <= max_bytes:
        return text
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    note = f" ... [{len(data) - max_bytes} bytes cut]"
    return data[: max(0, max_bytes - len(note))].decode("utf-8", "ignore") + note


def _string_map(values: Mapping[str, str]) -> bytes:
    if not values:
        return _END_OF_MAP
    pairs = b"".join(avro_string(str(k)) + avro_string(str(v)) for k, v in values.items())
    return zigzag(len(values)) + pairs + _END_OF_MAP


def _long_map(values: Mapping[str, int]) -> bytes:
    if not values:
        return _END_OF_MAP
    pairs = b"".join(avro_string(str(k)) + zigzag(int(v)) for k, v in values.items())
    return zigzag(len(values)) + pairs + _END_OF_MAP


class TimestampVarint:
    """Zig-zag varints of nanosecond timestamps, the bits above the lowest 21 remembered.

    A timestamp's 9-byte varint changes only in its first three bytes within ~1 ms (2**21
    ns, after zig-zag), so those are computed and the rest reused: about a fifth of the
    cost of :func:`~rlpulse.producers.wire.zigzag` for such numbers.
    """

    _LOW_BITS = 21

    def __init__(self) -> None:
        self._high = -1
        self._tail = b""

    def __call__(self, number: int) -> bytes:
        """``zigzag(number)``, fast for numbers of 2**20 and more."""
        if number < 1 << (self._LOW_BITS - 1):
            return zigzag(number)
        folded = number << 1
        high = folded >> self._LOW_BITS
        if high != self._high:
            out = bytearray()
            rest = high
            while rest > 0x7F:
                out.append((rest & 0x7F) | 0x80)
                rest >>= 7
            out.append(rest)
            self._high, self._tail = high, bytes(out)
        return (
            bytes(
                (
                    (folded & 0x7F) | 0x80,
                    ((folded >> 7) & 0x7F) | 0x80,
                    ((folded >> 14) & 0x7F) | 0x80,
                )
            )
            + self._tail
        )


def _optional(text: str | None) -> bytes:
    return _NULL if text is None else _SOME + avro_string(text)


@dataclass(frozen=True)
class LogSource:
    """The fields every log record of one logger shares."""

    run_id: str
    attempt: int
    rank: int
    tags: dict[str, str]
    hostname: str
    host_ip: str
    pid: int
    producer_id: str


class LogEncoder:
    """Encodes the LogRecords of one :class:`LogSource`; ``max_text_bytes`` caps text fields."""

    def __init__(self, source: LogSource, codec: Codec, max_text_bytes: int) -> None:
        self.source = source
        self._codec = codec
        self.max_text_bytes = max_text_bytes
        schema = codec.registry.latest("LogRecord")
        self.fast = schema.fingerprint == FAST_FINGERPRINT
        """Whether the precomputed layout is used (the newest schema is v1)."""
        self._head = MAGIC + schema.fingerprint + avro_string(source.run_id)
        self._head += zigzag(source.attempt)
        self._rank = zigzag(source.rank)
        self._tags = _string_map(source.tags)
        self._host = (
            avro_string(source.hostname)
            + avro_string(source.host_ip)
            + zigzag(source.pid)
            + avro_string(source.producer_id)
        )
        self._timestamp = TimestampVarint()
        self._strings: dict[str, bytes] = {}
        self._levels: dict[tuple[str, int], bytes] = {}

    def _cached(self, text: str) -> bytes:
        """``avro_string(text)`` for the few texts that repeat: stage and logger names."""
        found = self._strings.get(text)
        if found is None:
            found = avro_string(text)
            if len(self._strings) < _CACHE_MAX:
                self._strings[text] = found
        return found

    def encode(
        self,
        step: int,
        stage: str,
        level: str,
        levelno: int,
        logger: str,
        message: str,
        timestamp_ns: int,
        seq: int,
        *,
        exception: str | None = None,
        trace_id: str | None = None,
        fields: Mapping[str, str] | None = None,
        sample_rate: float = 1.0,
        sampled_out: Mapping[str, int] | None = None,
    ) -> bytes:
        """The single-object encoding of one record (text fields cut to fit)."""
        message = fit_text(message, self.max_text_bytes)
        if exception is not None:
            exception = fit_text(exception, self.max_text_bytes)
        if not self.fast:
            record = self.record(
                step, stage, level, levelno, logger, message, timestamp_ns, seq,
                exception=exception, trace_id=trace_id, fields=fields,
                sample_rate=sample_rate, sampled_out=sampled_out,
            )  # fmt: skip
            return self._codec.encode("LogRecord", record)
        level_bytes = self._levels.get((level, levelno))
        if level_bytes is None:
            level_bytes = self._levels[(level, levelno)] = avro_string(level) + zigzag(levelno)
        return b"".join(
            (
                self._head,
                zigzag(step),
                self._cached(stage),
                self._rank,
                level_bytes,
                self._cached(logger),
                avro_string(message),
                _optional(exception),
                _optional(trace_id),
                _string_map(fields) if fields else _END_OF_MAP,
                _RATE_ONE if sample_rate == 1.0 else _DOUBLE(sample_rate),
                _long_map(sampled_out) if sampled_out else _END_OF_MAP,
                self._tags,
                self._timestamp(timestamp_ns),
                self._host,
                zigzag(seq),
            )
        )

    def record(
        self,
        step: int,
        stage: str,
        level: str,
        levelno: int,
        logger: str,
        message: str,
        timestamp_ns: int,
        seq: int,
        *,
        exception: str | None = None,
        trace_id: str | None = None,
        fields: Mapping[str, str] | None = None,
        sample_rate: float = 1.0,
        sampled_out: Mapping[str, int] | None = None,
    ) -> LogRecord:
        """The same record as consumers decode it."""
        source = self.source
        return {
            "run_id": source.run_id,
            "attempt": source.attempt,
            "step": step,
            "stage": stage,
            "rank": source.rank,
            "level": level,
            "levelno": levelno,
            "logger": logger,
            "message": message,
            "exception": exception,
            "trace_id": trace_id,
            "fields": {str(k): str(v) for k, v in (fields or {}).items()},
            "sample_rate": float(sample_rate),
            "sampled_out": {str(k): int(v) for k, v in (sampled_out or {}).items()},
            "tags": dict(source.tags),
            "timestamp_ns": timestamp_ns,
            "hostname": source.hostname,
            "host_ip": source.host_ip,
            "pid": source.pid,
            "producer_id": source.producer_id,
            "seq": seq,
        }
