"""The hot-path encoder of one logger's text log records, and their batches (``<prefix>.logs``).

Log records travel in :class:`~rlpulse.schemas.records.LogBatch` messages: the fields every
record of a logger shares (run id, rank, host, pid, producer id, tags) once, then the
records' own fields as an array of ``LogEntry``. A record is encoded once, as its LogEntry's
Avro body, on the caller's thread: those bytes are the write-ahead log's frame
(:mod:`rlpulse.producers.delivery.wal`) and, unchanged, an item of the batch the host's agent
builds (:meth:`LogEncoder.batch` joins the shared head, the count and the entries). fastavro's
``schemaless_writer`` would take over 10 us a record, more than the ``logging`` call around
it; :meth:`LogEncoder.entry` takes one or two (the stage/level/logger bytes of a record
repeat, and most records end the same way). Its output is byte-identical to the codec's (a
property test checks it); the head is the codec's own encoding of a batch without entries.
The schema, not this module, is the authority: each encoder checks at its start that its
LogEntry layout writes what the codec writes for the newest LogBatch schema (sample records
with every field set and unset); if the schema changed, entries are written by fastavro
(slower, still correct) and a warning says the fast layout needs an update.

Messages and tracebacks longer than a record may be are cut (with a note saying how much
was cut), never refused: a log line that explains a crash must arrive.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from fastavro import schemaless_writer

from rlpulse.producers.encoding.events import TimestampVarint, avro_string, layout_agrees, zigzag
from rlpulse.producers.encoding.fields import LogFields, RecordSource, resolved
from rlpulse.schemas.codec import Codec
from rlpulse.schemas.records import LogEntry, LogRecord

__all__ = [
    "LogEncoder",
    "TimestampVarint",
    "batch_body",
    "fit_text",
]


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


_SAMPLES = (
    LogFields(3, "trainer", "INFO", 20, "trainer.loop", "step 3 loss 0.5"),
    LogFields(
        -(2**40), "rollout", "ERROR", 40, "w", "text é", "Traceback ...", "trace-1",
        {"k": "v"}, 0.25, {"INFO": 2**33},
    ),
)  # fmt: skip
"""Records that set and unset every field the caller gives: what the layout check encodes."""

_PLAIN_TAIL = _NULL + _NULL + _END_OF_MAP + _RATE_ONE + _END_OF_MAP
"""The end of the LogEntry of most records: no exception, no trace id, no fields, rate 1, no
sampled-out counts."""


class LogEncoder:
    """Encodes the log records of one :class:`RecordSource`; ``max_text_bytes`` caps text fields.

    On the caller's thread a record becomes its LogEntry's Avro body (:meth:`entry`: what the
    write-ahead log holds); the host's agent joins entries behind the shared head
    (:meth:`batch`). Not thread-safe: its caller holds the logger's lock.
    """

    def __init__(self, source: RecordSource, codec: Codec, max_text_bytes: int) -> None:
        self.source = source
        self.max_text_bytes = max_text_bytes
        schema = codec.registry.latest("LogBatch")
        empty = codec.encode("LogBatch", {**self._shared(), "entries": []})
        self.head = empty[:-1]  # without the empty array's terminating count
        """The bytes every batch of this source starts with (header and shared fields)."""
        self._timestamp = TimestampVarint()
        self._middles: dict[tuple[str, str, int, str], bytes] = {}
        entries = next(f for f in schema.parsed["fields"] if f["name"] == "entries")
        self._entry_schema: Any = entries["type"]["items"]
        self._codec = codec
        self.fast = layout_agrees(
            "LogEncoder",
            f"LogBatch v{schema.version} ({schema.path})",
            [partial(self._sample, line) for line in _SAMPLES],
        )
        """Whether the precomputed LogEntry layout is used (it writes what the codec writes)."""
        if not self.fast:
            self.entry = self._schema_entry  # type: ignore[method-assign]

    def _sample(self, line: LogFields) -> tuple[bytes, bytes]:
        """One sample record as a batch, by :meth:`entry` and by the codec."""
        timestamp_ns, seq = 1_700_000_000_000_000_000, 4242
        record = self.record(line, timestamp_ns, seq)
        shared = self._shared()
        entry = {k: v for k, v in record.items() if k not in shared}
        wanted = self._codec.encode("LogBatch", {**shared, "entries": [entry]})
        return self.batch([self.entry(line, timestamp_ns, seq)]), wanted

    def _schema_entry(self, line: LogFields, timestamp_ns: int, seq: int) -> bytes:
        """:meth:`entry` by fastavro, for a LogBatch schema the fast layout does not write."""
        entry = self.record(line, timestamp_ns, seq)
        entry["message"] = fit_text(line.message, self.max_text_bytes)
        if line.exception is not None:
            entry["exception"] = fit_text(line.exception, self.max_text_bytes)
        buffer = io.BytesIO()
        schemaless_writer(buffer, self._entry_schema, entry)
        return buffer.getvalue()

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

    def entry(self, line: LogFields, timestamp_ns: int, seq: int) -> bytes:
        """The Avro body of one record's LogEntry (text fields cut to fit)."""
        step = line.step
        if step is None:
            raise ValueError("step was not filled in before encoding")
        message = line.message
        if len(message) * 4 > self.max_text_bytes:  # else it fits, whatever its characters
            message = fit_text(message, self.max_text_bytes)
        text = message.encode()
        exception, trace_id, fields = line.exception, line.trace_id, line.fields
        sample_rate, sampled_out = line.sample_rate, line.sampled_out
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
                self._middle(line.stage, line.level, line.levelno, line.logger),
                zigzag(len(text)),
                text,
                tail,
            )
        )

    def batch(self, entries: Sequence[bytes]) -> bytes:
        """One LogBatch message of ``entries`` (LogEntry bodies, in seq order)."""
        return self.head + batch_body(entries)

    def record(self, line: LogFields, timestamp_ns: int, seq: int) -> LogRecord:
        """The whole record as consumers decode it (shared fields and the entry's)."""
        entry: LogEntry = {
            "seq": seq,
            "timestamp_ns": timestamp_ns,
            "step": resolved(line.step, "step"),
            "stage": line.stage,
            "level": line.level,
            "levelno": line.levelno,
            "logger": line.logger,
            "message": line.message,
            "exception": line.exception,
            "trace_id": line.trace_id,
            "fields": {str(k): str(v) for k, v in (line.fields or {}).items()},
            "sample_rate": float(line.sample_rate),
            "sampled_out": {str(k): int(v) for k, v in (line.sampled_out or {}).items()},
        }
        return {**self._shared(), **entry}  # type: ignore[typeddict-item]


def batch_body(entries: Sequence[bytes]) -> bytes:
    """The ``entries`` array of a LogBatch: one block of ``len(entries)`` items, then the end."""
    if not entries:
        return _END_OF_MAP
    return zigzag(len(entries)) + b"".join(entries) + _END_OF_MAP
