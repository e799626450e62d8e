"""The hot-path encoder of one logger's text log records, and their batches (``<prefix>.logs``).

Log records travel in :class:`~rlpulse.schemas.records.LogBatch` messages: the fields every
record of a logger shares (run id, rank, host, pid, producer id, tags) once, then the
records' own fields as an array of ``LogEntry``. A record is encoded once, as its LogEntry's
Avro body, on the caller's thread: those bytes are the write-ahead log's frame
(:mod:`rlpulse.producers.wal`) and, unchanged, an item of the batch the sender thread builds
(:meth:`LogEncoder.batch` joins the shared head, the count and the entries). fastavro's
``schemaless_writer`` would take over 10 us a record, more than the ``logging`` call around
it; :meth:`LogEncoder.entry` takes one or two (the stage/level/logger bytes of a record
repeat, and most records end the same way). Its output is byte-identical to the codec's (a
property test checks it); the head is the codec's own encoding of a batch without entries.
The layout is LogBatch v1's, :data:`FAST_FINGERPRINT`: a logger refuses to start if the
newest LogBatch schema is another.

Messages and tracebacks longer than a record may be are cut (with a note saying how much
was cut), never refused: a log line that explains a crash must arrive.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlpulse.producers.wire import avro_string, zigzag
from rlpulse.schemas.codec import Codec
from rlpulse.schemas.exceptions import EncodeError
from rlpulse.schemas.records import LogEntry, LogRecord

__all__ = [
    "FAST_FINGERPRINT",
    "LogEncoder",
    "LogSource",
    "TimestampVarint",
    "batch_body",
    "fit_text",
]

FAST_FINGERPRINT = bytes.fromhex("3c496b0615a579c5")
"""CRC-64-AVRO fingerprint (as on the wire) of LogBatch v1, whose LogEntry is written here."""

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


_PLAIN_TAIL = _NULL + _NULL + _END_OF_MAP + _RATE_ONE + _END_OF_MAP
"""The end of the LogEntry of most records: no exception, no trace id, no fields, rate 1, no
sampled-out counts."""


class LogEncoder:
    """Encodes the log records of one :class:`LogSource`; ``max_text_bytes`` caps text fields.

    On the caller's thread a record becomes its LogEntry's Avro body (:meth:`entry`: what the
    write-ahead log holds); the sender thread joins entries behind the shared head
    (:meth:`batch`). Not thread-safe: its caller holds the logger's lock.
    """

    def __init__(self, source: LogSource, codec: Codec, max_text_bytes: int) -> None:
        self.source = source
        self.max_text_bytes = max_text_bytes
        schema = codec.registry.latest("LogBatch")
        if schema.fingerprint != FAST_FINGERPRINT:
            raise EncodeError(
                f"LogBatch v{schema.version} ({schema.fingerprint.hex()}) is the newest schema, "
                f"but rlpulse.producers.log_wire writes v1 ({FAST_FINGERPRINT.hex()}): "
                "update its LogEntry layout"
            )
        empty = codec.encode("LogBatch", {**self._shared(), "entries": []})
        self.head = empty[:-1]  # without the empty array's terminating count
        """The bytes every batch of this source starts with (header and shared fields)."""
        self._timestamp = TimestampVarint()
        self._middles: dict[tuple[str, str, int, str], bytes] = {}

    def _shared(self) -> dict[str, Any]:
        source = self.source
        return {
            "run_id": source.run_id,
            "attempt": source.attempt,
            "rank": source.rank,
            "tags": dict(source.tags),
            "hostname": source.hostname,
            "host_ip": source.host_ip,
            "pid": source.pid,
            "producer_id": source.producer_id,
        }

    def _middle(self, stage: str, level: str, levelno: int, logger: str) -> bytes:
        """Stage, level, levelno and logger, encoded: the few combinations repeat."""
        key = (stage, level, levelno, logger)
        found = self._middles.get(key)
        if found is None:
            found = avro_string(stage) + avro_string(level) + zigzag(levelno) + avro_string(logger)
            if len(self._middles) < _CACHE_MAX:
                self._middles[key] = found
        return found

    def entry(
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
        """The Avro body of one record's LogEntry (text fields cut to fit)."""
        text = fit_text(message, self.max_text_bytes).encode()
        if exception is None and trace_id is None and not fields and not sampled_out:
            tail = (
                _PLAIN_TAIL
                if sample_rate == 1.0
                else _NULL + _NULL + _END_OF_MAP + _DOUBLE(sample_rate) + _END_OF_MAP
            )
        else:
            tail = b"".join(
                (
                    _NULL
                    if exception is None
                    else _SOME + avro_string(fit_text(exception, self.max_text_bytes)),
                    _NULL if trace_id is None else _SOME + avro_string(trace_id),
                    _string_map(fields) if fields else _END_OF_MAP,
                    _RATE_ONE if sample_rate == 1.0 else _DOUBLE(sample_rate),
                    _long_map(sampled_out) if sampled_out else _END_OF_MAP,
                )
            )
        return b"".join(
            (
                zigzag(seq),
                self._timestamp(timestamp_ns),
                zigzag(step),
                self._middle(stage, level, levelno, logger),
                zigzag(len(text)),
                text,
                tail,
            )
        )

    def batch(self, entries: Sequence[bytes]) -> bytes:
        """One LogBatch message of ``entries`` (LogEntry bodies, in seq order)."""
        return self.head + batch_body(entries)

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
        """The whole record as consumers decode it (shared fields and the entry's)."""
        entry: LogEntry = {
            "seq": seq,
            "timestamp_ns": timestamp_ns,
            "step": step,
            "stage": stage,
            "level": level,
            "levelno": levelno,
            "logger": logger,
            "message": message,
            "exception": exception,
            "trace_id": trace_id,
            "fields": {str(k): str(v) for k, v in (fields or {}).items()},
            "sample_rate": float(sample_rate),
            "sampled_out": {str(k): int(v) for k, v in (sampled_out or {}).items()},
        }
        return {**self._shared(), **entry}  # type: ignore[typeddict-item]


def batch_body(entries: Sequence[bytes]) -> bytes:
    """The ``entries`` array of a LogBatch: one block of ``len(entries)`` items, then the end."""
    if not entries:
        return _END_OF_MAP
    return zigzag(len(entries)) + b"".join(entries) + _END_OF_MAP
