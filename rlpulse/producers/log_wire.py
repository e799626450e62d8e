"""The log records of one logger on their way out: packed on the caller's thread, batched later.

Log records travel in :class:`~rlpulse.schemas.records.LogBatch` messages: the fields every
record of a logger shares (run id, rank, host, pid, producer id, tags) once, then the
records' own fields as an array of ``LogEntry``. The caller's thread does the least: it
*packs* a record (:meth:`LogEncoder.pack`: a fixed ``struct`` head and the texts' UTF-8
bytes, about a microsecond), which is the write-ahead log's frame
(:mod:`rlpulse.producers.wal`). The sender thread turns packed records into LogEntry bodies
(:class:`EntryWriter`) and joins them behind the shared head (:meth:`LogEncoder.batch`,
whose head is the codec's own encoding of a batch without entries). The bodies are
byte-identical to what the codec writes (a property test checks it); the layout is LogBatch
v1's, :data:`FAST_FINGERPRINT`, and a logger refuses to start if the newest schema is another.

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
    "EntryWriter",
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


_PACKED = struct.Struct("<qqqidIIIIIIII")
"""A packed record's head: seq, time, step, levelno, sample rate, then the byte lengths of
stage, level, logger, message, exception (+1; 0 means none), trace id (+1), and the Avro
encodings of fields and sampled_out; the bytes follow in that order."""


class LogEncoder:
    """Encodes the log records of one :class:`LogSource`; ``max_text_bytes`` caps text fields.

    On the caller's thread a record is only *packed* (:meth:`pack`: a fixed head and the
    texts' UTF-8 bytes, what the write-ahead log holds); the sender thread turns packed
    records into LogEntry bodies (:class:`EntryWriter`) and batches (:meth:`batch`).
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
        self._texts: dict[str, bytes] = {}

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

    def _utf8(self, text: str) -> bytes:
        """``text.encode()`` for the few texts that repeat: stage, level and logger names."""
        found = self._texts.get(text)
        if found is None:
            found = text.encode()
            if len(self._texts) < _CACHE_MAX:
                self._texts[text] = found
        return found

    def pack(
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
        """One record packed for the write-ahead log (text fields cut to fit)."""
        stage_b, level_b, logger_b = self._utf8(stage), self._utf8(level), self._utf8(logger)
        message_b = fit_text(message, self.max_text_bytes).encode()
        exception_b = (
            b"" if exception is None else fit_text(exception, self.max_text_bytes).encode()
        )
        trace_b = b"" if trace_id is None else trace_id.encode()
        fields_b = _string_map(fields) if fields else b""
        sampled_b = _long_map(sampled_out) if sampled_out else b""
        head = _PACKED.pack(
            seq, timestamp_ns, step, levelno, sample_rate,
            len(stage_b), len(level_b), len(logger_b), len(message_b),
            0 if exception is None else len(exception_b) + 1,
            0 if trace_id is None else len(trace_b) + 1,
            len(fields_b), len(sampled_b),
        )  # fmt: skip
        return b"".join(
            (head, stage_b, level_b, logger_b, message_b, exception_b, trace_b, fields_b, sampled_b)
        )

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
        """The Avro body of one record's LogEntry (what :meth:`pack` becomes on the wire)."""
        packed = self.pack(
            step, stage, level, levelno, logger, message, timestamp_ns, seq,
            exception=exception, trace_id=trace_id, fields=fields,
            sample_rate=sample_rate, sampled_out=sampled_out,
        )  # fmt: skip
        return EntryWriter().entry(packed)

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


class EntryWriter:
    """Turns packed records (:meth:`LogEncoder.pack`) into LogEntry Avro bodies.

    One per sending thread: it remembers the high bits of the last timestamp
    (:class:`TimestampVarint`).
    """

    def __init__(self) -> None:
        self._timestamp = TimestampVarint()
        self._levels: dict[tuple[bytes, int], bytes] = {}

    def entry(self, packed: bytes) -> bytes:
        """The LogEntry body of one packed record."""
        (
            seq, timestamp_ns, step, levelno, sample_rate,
            stage_n, level_n, logger_n, message_n, exception_n, trace_n, fields_n, sampled_n,
        ) = _PACKED.unpack_from(packed)  # fmt: skip
        at = _PACKED.size
        stage = packed[at : at + stage_n]
        at += stage_n
        level = packed[at : at + level_n]
        at += level_n
        logger = packed[at : at + logger_n]
        at += logger_n
        message = packed[at : at + message_n]
        at += message_n
        exception = _NULL
        if exception_n:
            exception = _SOME + zigzag(exception_n - 1) + packed[at : at + exception_n - 1]
            at += exception_n - 1
        trace = _NULL
        if trace_n:
            trace = _SOME + zigzag(trace_n - 1) + packed[at : at + trace_n - 1]
            at += trace_n - 1
        fields = packed[at : at + fields_n] if fields_n else _END_OF_MAP
        at += fields_n
        sampled = packed[at : at + sampled_n] if sampled_n else _END_OF_MAP
        level_bytes = self._levels.get((level, levelno))
        if level_bytes is None:
            level_bytes = zigzag(level_n) + level + zigzag(levelno)
            if len(self._levels) < _CACHE_MAX:
                self._levels[(level, levelno)] = level_bytes
        return b"".join(
            (
                zigzag(seq),
                self._timestamp(timestamp_ns),
                zigzag(step),
                zigzag(stage_n),
                stage,
                level_bytes,
                zigzag(logger_n),
                logger,
                zigzag(message_n),
                message,
                exception,
                trace,
                fields,
                _RATE_ONE if sample_rate == 1.0 else _DOUBLE(sample_rate),
                sampled,
            )
        )


def batch_body(entries: Sequence[bytes]) -> bytes:
    """The ``entries`` array of a LogBatch: one block of ``len(entries)`` items, then the end."""
    if not entries:
        return _END_OF_MAP
    return zigzag(len(entries)) + b"".join(entries) + _END_OF_MAP
