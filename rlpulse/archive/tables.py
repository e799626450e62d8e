"""The archive's tables: which topic each holds, its Arrow schema, and how a message becomes a row.

Each table's columns are its Avro record's fields (the newest version, mapped type by type:
``int`` -> int32, ``long`` -> int64, ``map`` -> map<string, ...>, ``array`` -> list,
``record`` -> struct, ``["null", X]`` -> nullable X; a union of several types, such as a
command action's parameters, becomes text: a string as itself, a number or boolean as JSON,
``2.0``, ``true``), plus where the message was read:

- ``kafka_partition``, ``kafka_offset``;
- ``kafka_timestamp_ms`` and ``kafka_timestamp_type`` (``log_append`` when the broker
  stamped it, ``create`` when the producer did);
- on the events, logs, samples and sample_texts tables, ``clock_offset_ns`` and
  ``clock_error_ns``: the host
  agent's estimate of its host's clock against the brokers' that came with the message (its
  ``rlpulse-clock`` header, :mod:`rlpulse.schemas.clock`), null where it carried none (an
  agent's first messages, older releases) or one that does not read; files written before
  these columns existed read as null too. ``timestamp_ns + coalesce(clock_offset_ns, 0)`` is
  a record's time on the brokers' clock, which orders records of several hosts;
- ``decode_error`` and ``raw_value``: a message the archiver could not decode is kept as a
  row with only these and the Kafka columns set (the views show it among the dead letters).

``samples`` has a row per rollout sample (the chunks of ``<prefix>.samples`` taken apart) and
``sample_texts`` a row per chosen sample's texts. ``dead_letters`` holds ``<prefix>.dlq`` as
it is: the original key and bytes, the reason and source headers. Pure: no I/O, no Kafka
client.
"""

from __future__ import annotations

import datetime
import io
import json
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from hashlib import blake2b
from typing import Any, Final, TypeAlias, cast

import numpy as np
import pyarrow as pa
from fastavro import schemaless_reader

from rlpulse.schemas.clock import CLOCK_HEADER, parse_clock_header
from rlpulse.schemas.codec import HEADER_SIZE, MAGIC, Codec, chunk_samples
from rlpulse.schemas.exceptions import DecodeError
from rlpulse.schemas.topics import REASON_HEADER, SOURCE_HEADER, Topics

__all__ = [
    "CLOCK_COLUMNS",
    "KAFKA_COLUMNS",
    "PARTITION_COLUMNS",
    "BatchColumns",
    "BatchRows",
    "Rows",
    "Table",
    "arrow_type",
    "day_of",
    "run_partition",
    "tables_of",
]

KAFKA_COLUMNS: Final = (
    pa.field("kafka_partition", pa.int32(), nullable=False),
    pa.field("kafka_offset", pa.int64(), nullable=False),
    pa.field("kafka_timestamp_ms", pa.int64()),
    pa.field("kafka_timestamp_type", pa.string()),
)
CLOCK_COLUMNS: Final = (
    pa.field("clock_offset_ns", pa.int64()),
    pa.field("clock_error_ns", pa.int64()),
)
"""The host's clock against the brokers', from the message's header (events and logs only)."""
PARTITION_COLUMNS: Final = (pa.field("date", pa.string()), pa.field("run", pa.string()))
"""The hive partition columns every table gets from its directories."""


@dataclass(frozen=True, slots=True)
class BatchRows:
    """The records of one batch message, not yet columns: what they share, and their own fields.

    ``shared`` holds the batch's shared fields and the message's Kafka columns; each entry the
    fields of one record. :meth:`Table.columns` turns the batch rows of many messages into one
    Arrow record batch (column by column: a column's values of every record at once).
    """

    shared: dict[str, Any]
    entries: list[dict[str, Any]]


class BatchColumns:
    """The rows of batch messages of one table, gathered column by column (see :meth:`add`).

    A record's entry fields go to one list per field as its message is added (its dicts are
    not kept: holding many decoded records makes decoding the next ones slower); the shared
    fields are kept once per message. :meth:`record_batch` makes the Arrow record batch.
    """

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.rows = 0
        self._entries: dict[str, list[Any]] = {}
        self._shared: list[dict[str, Any]] = []
        self._counts: list[int] = []

    def add(self, rows: BatchRows) -> None:
        """Take the rows of one batch message."""
        entries = rows.entries
        if not entries:
            return
        if not self._entries:
            self._entries = {name: [] for name in entries[0] if name in self.schema.names}
        for name, values in self._entries.items():
            values += [entry[name] for entry in entries]
        self._shared.append(rows.shared)
        self._counts.append(len(entries))
        self.rows += len(entries)

    def record_batch(self) -> pa.RecordBatch:
        """Everything added, as one Arrow record batch in the table's schema.

        An entry field is one column of the gathered values; a shared field (and a Kafka
        column) is each message's value taken once per record of that message; the decode
        columns are null.
        """
        per_message = pa.array(np.repeat(np.arange(len(self._counts)), self._counts))
        columns = []
        for field in self.schema:
            name = field.name
            if name in self._entries:
                columns.append(pa.array(self._entries[name], type=field.type))
            elif self._shared and name in self._shared[0]:
                values = [_arrow_value(shared[name]) for shared in self._shared]
                columns.append(pa.array(values, type=field.type).take(per_message))
            else:
                columns.append(pa.nulls(self.rows, type=field.type))
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


Rows: TypeAlias = list[dict[str, Any]] | BatchRows
"""The rows of one message: dicts, or (a batch message's) :class:`BatchRows`."""
_UNDECODABLE: Final = (pa.field("decode_error", pa.string()), pa.field("raw_value", pa.binary()))
_TIMESTAMP_TYPES: Final = {0: None, 1: "create", 2: "log_append"}
_NS_PER_MS: Final = 1_000_000
_MS_PER_DAY: Final = 86_400_000
_RUN_CHARS: Final = 150  # of a run id kept in its directory name (names are <= 255 bytes)
NO_RUN: Final = "_"
"""The ``run`` partition of records without a run id (a dead letter without a key)."""


def arrow_type(avro: Any) -> pa.DataType:
    """The Arrow type of a parsed Avro type (see the module docstring for the mapping)."""
    if isinstance(avro, list):
        branches = [branch for branch in avro if branch != "null"]
        return arrow_type(branches[0]) if len(branches) == 1 else pa.string()
    if isinstance(avro, str):
        return _PRIMITIVES[avro]
    kind = avro["type"]
    if kind == "enum":
        return pa.string()
    if kind == "map":
        return pa.map_(pa.string(), arrow_type(avro["values"]))
    if kind == "array":
        return pa.list_(arrow_type(avro["items"]))
    if kind == "record":
        return pa.struct([pa.field(f["name"], arrow_type(f["type"])) for f in avro["fields"]])
    return arrow_type(kind)


_PRIMITIVES: Final = {
    "string": pa.string(),
    "int": pa.int32(),
    "long": pa.int64(),
    "double": pa.float64(),
    "float": pa.float32(),
    "boolean": pa.bool_(),
    "bytes": pa.binary(),
}


def _as_text(value: Any) -> str | None:
    """A value of a multi-type union as text: a string as itself, anything else as JSON."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value)


def _text_unions(avro: Any) -> Callable[[Any], Any] | None:
    """A function that turns the values of multi-type unions in ``avro`` into text, or None."""
    if isinstance(avro, list):
        branches = [branch for branch in avro if branch != "null"]
        if len(branches) == 1:
            return _text_unions(branches[0])
        return _as_text
    if isinstance(avro, str) or avro["type"] == "enum":
        return None
    kind = avro["type"]
    if kind in ("map", "array"):
        inner = _text_unions(avro["values"] if kind == "map" else avro["items"])
        if inner is None:
            return None
        each: Callable[[Any], Any] = inner
        if kind == "map":
            return lambda values: {k: each(v) for k, v in values.items()}
        return lambda items: [each(v) for v in items]
    if kind == "record":
        changed: dict[str, Callable[[Any], Any]] = {}
        for child in avro["fields"]:
            convert = _text_unions(child["type"])
            if convert is not None:
                changed[child["name"]] = convert
        if not changed:
            return None
        return lambda r: {k: (changed[k](v) if k in changed else v) for k, v in r.items()}
    return None


_NEWEST: dict[tuple[int, str], tuple[bytes, Any]] = {}


def _newest(codec: Codec, record: str) -> tuple[bytes, Any]:
    """The header and parsed schema of the newest version of ``record`` in ``codec``."""
    key = (id(codec), record)
    found = _NEWEST.get(key)
    if found is None:
        latest = codec.registry.latest(record)
        found = _NEWEST[key] = (MAGIC + latest.fingerprint, latest.parsed)
    return found


@cache
def _day(day_number: int) -> str:
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=day_number)).isoformat()


def day_of(ms: int) -> str:
    """The UTC date (``YYYY-MM-DD``) of a time in milliseconds since the epoch."""
    return _day(ms // _MS_PER_DAY)


def run_partition(run_id: str | None) -> str:
    """The ``run`` partition value of a run id (long ids cut, with a hash to keep them apart)."""
    if not run_id:
        return NO_RUN
    if len(run_id) <= _RUN_CHARS:
        return run_id
    return f"{run_id[:_RUN_CHARS]}~{blake2b(run_id.encode(), digest_size=8).hexdigest()}"


def quote_partition(value: str) -> str:
    """A partition value as it appears in a directory name (URI-encoded, as pyarrow reads it)."""
    return urllib.parse.quote(value, safe="")


@dataclass(frozen=True)
class Table:
    """One table of the archive: the topic it holds and how its messages become rows."""

    name: str
    """The view name: events, logs, steps, commands, acks, verdicts, audits, samples,
    sample_texts, dead_letters."""
    topic: str
    record: str | None
    """The Avro record of the topic; None for the dead-letter topic (kept as bytes)."""
    time_field: str | None
    """The record's own time, in ns (``timestamp_ns``, ``emitted_ns``, ...)."""
    schema: pa.Schema
    """The columns of the files (the partition columns come from the directories)."""
    convert: Callable[[Any], Any] | None = None
    batch_record: str | None = None
    """The Avro record that carries many of ``record`` in one message (``LogBatch``), if any."""
    host_clock: bool = False
    """Its messages come from a host agent, with its host's clock (:data:`CLOCK_COLUMNS`)."""
    explode: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None
    """Turns one entry of a batch into the table's rows (a chunk of samples into its samples)."""

    def rows(
        self,
        codec: Codec,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        offset: int,
        timestamp: tuple[int, int],
        headers: Sequence[tuple[str, bytes | str | None]] | None = None,
    ) -> tuple[Rows, str | None, int]:
        """The rows of one message, its run id (None when it has none) and when it happened.

        A message is one row (a dict), except a batch (a LogBatch), whose records come as one
        Arrow record batch, a row per record with the batch's shared fields, built column by
        column. ``timestamp`` is confluent-kafka's ``message.timestamp()`` pair (type, ms). The
        time (ms) is Kafka's timestamp, else the record's own time, else 0: its UTC date is the
        rows' ``date`` partition, and retention goes by it. ``headers``: the message's (a dead
        letter's reason and source; the host's clock of the events and logs tables). Never
        raises: a message that does not decode becomes a ``decode_error`` row.
        """
        kind, stamp = timestamp
        stamp_type = _TIMESTAMP_TYPES.get(kind)
        stamp_ms: int | None = stamp if stamp_type is not None else None
        if self.record is None:
            row, run, when = self._dead_letter(
                key, value, partition, offset, stamp_ms, stamp_type, headers
            )
            return [row], run, when
        kafka = _kafka(partition, offset, stamp_ms, stamp_type)
        if self.host_clock:
            kafka.update(_clock_columns(headers))
        data = value or b""
        try:
            batch = self._batch(codec, data)
            record = self._read(codec, data, self.record) if batch is None else batch
        except DecodeError as exc:
            kafka["decode_error"] = str(exc)
            kafka["raw_value"] = data
            return [kafka], _text(key), stamp_ms if stamp_ms is not None and stamp_ms >= 0 else 0
        if stamp_ms is None or stamp_ms < 0:
            first = record["entries"][0] if batch is not None and record["entries"] else record
            own = first.get(self.time_field) if self.time_field else None
            stamp_ms = own // _NS_PER_MS if isinstance(own, int) and own >= 0 else 0
        if batch is not None:
            entries = batch.pop("entries")
            if self.explode is not None:
                entries = [row for entry in entries for row in self.explode(entry)]
            batch.update(kafka)
            return BatchRows(batch, entries), batch.get("run_id", _text(key)), stamp_ms
        if self.convert is not None:
            record = self.convert(record)
        record.update(kafka)
        return [record], record.get("run_id"), stamp_ms

    def decode(self, codec: Codec, data: bytes) -> list[dict[str, Any]]:
        """The records of one message of this table; :class:`DecodeError` if it holds none.

        Messages written with the newest schema (nearly all) are read straight with fastavro;
        others (older versions, garbage) go through :meth:`Codec.decode`. A batch's records
        each get the batch's shared fields.
        """
        batch = self._batch(codec, data)
        if batch is None:
            return [self._read(codec, data, self.record or "")]
        entries: list[dict[str, Any]] = batch.pop("entries")
        if self.explode is not None:
            entries = [row for entry in entries for row in self.explode(entry)]
        for entry in entries:
            entry.update(batch)
        return entries

    def _batch(self, codec: Codec, data: bytes) -> dict[str, Any] | None:
        """The decoded batch record, if ``data`` is one of this table's batch messages."""
        if self.batch_record is None:
            return None
        writer = codec.registry.by_fingerprint(data[len(MAGIC) : HEADER_SIZE])
        if writer is None or writer.name != self.batch_record:
            return None
        return self._read(codec, data, self.batch_record)

    def _read(self, codec: Codec, data: bytes, record: str | None) -> dict[str, Any]:
        header, parsed = _newest(codec, record or "")
        if data[:HEADER_SIZE] != header:
            return codec.decode(data, record)
        body = io.BytesIO(data)
        body.seek(HEADER_SIZE)
        try:
            decoded = cast(dict[str, Any], schemaless_reader(body, parsed, None))
        except Exception:  # fastavro's assorted errors: let the codec name the failure
            return codec.decode(data, record)
        if body.tell() != len(data):
            return codec.decode(data, record)
        return decoded

    def _dead_letter(
        self,
        key: bytes | None,
        value: bytes | None,
        partition: int,
        offset: int,
        stamp_ms: int | None,
        stamp_type: str | None,
        headers: Sequence[tuple[str, bytes | str | None]] | None,
    ) -> tuple[dict[str, Any], str | None, int]:
        found = {name: raw.encode() if isinstance(raw, str) else raw for name, raw in headers or ()}
        run = _text(key)
        row = {
            "run_id": run,
            "reason": _text(found.get(REASON_HEADER)),
            "source": _text(found.get(SOURCE_HEADER)),
            "key": key,
            "value": value,
            **_kafka(partition, offset, stamp_ms, stamp_type),
        }
        return row, run, stamp_ms if stamp_ms is not None and stamp_ms >= 0 else 0


def _arrow_value(value: Any) -> Any:
    """A map value as pyarrow takes it for a map column (pairs); other values as they are."""
    return list(value.items()) if isinstance(value, dict) else value


def _kafka(
    partition: int, offset: int, stamp_ms: int | None, stamp_type: str | None
) -> dict[str, Any]:
    return {
        "kafka_partition": partition,
        "kafka_offset": offset,
        "kafka_timestamp_ms": stamp_ms,
        "kafka_timestamp_type": stamp_type,
    }


def _clock_columns(
    headers: Sequence[tuple[str, bytes | str | None]] | None,
) -> dict[str, int | None]:
    """The :data:`CLOCK_COLUMNS` of a message with ``headers`` (null without a good header)."""
    for name, value in headers or ():
        if name == CLOCK_HEADER:
            found = parse_clock_header(value)
            if found is not None:
                return {"clock_offset_ns": found[0], "clock_error_ns": found[1]}
            break
    return {"clock_offset_ns": None, "clock_error_ns": None}


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", "replace")


_RECORD_TABLES: Final = (
    ("events", "events", "TrainerEvent", "timestamp_ns"),
    ("logs", "logs", "LogRecord", "timestamp_ns"),  # sent in LogBatch messages
    ("steps", "steps", "StepSummary", "emitted_ns"),
    ("commands", "control", "ControlCommand", "issued_ns"),
    ("acks", "acks", "CommandAck", "acked_ns"),
    ("verdicts", "verdicts", "ActionVerdict", "emitted_ns"),
    ("audits", "audits", "AuditReport", "audited_ns"),
)
_BATCHES: Final = {"LogRecord": "LogBatch"}
"""The record that carries many of a table's records in one message."""
_HOST_CLOCKED: Final = frozenset({"events", "logs", "samples", "sample_texts"})
"""The tables of the topics the host agents write: their messages carry the host's clock."""
_DEAD_LETTER_SCHEMA: Final = pa.schema(
    [
        pa.field("run_id", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("source", pa.string()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        *KAFKA_COLUMNS,
    ]
)


_SAMPLE_COLUMNS: Final = (
    pa.field("seq", pa.int64()),
    pa.field("timestamp_ns", pa.int64()),
    pa.field("step", pa.int64()),
    pa.field("split", pa.string()),
    pa.field("sample_index", pa.int64()),
    pa.field("group", pa.string()),
    pa.field("data_source", pa.string()),
    pa.field("reward", pa.float64()),
    pa.field("scores", pa.map_(pa.string(), pa.float64())),
    pa.field("dropped_scores", pa.list_(pa.string())),
    pa.field("advantage", pa.float64()),
    pa.field("prompt_length", pa.int64()),
    pa.field("response_length", pa.int64()),
    pa.field("truncated", pa.bool_()),
    pa.field("aborted", pa.bool_()),
    pa.field("num_turns", pa.int32()),
    pa.field("repetition", pa.float64()),
    pa.field("empty", pa.bool_()),
)
"""A sample's own columns in the ``samples`` table (a row per sample of a SampleBatch's chunks:
:func:`~rlpulse.schemas.codec.chunk_samples`)."""


def tables_of(topics: Topics, codec: Codec) -> dict[str, Table]:
    """Every archived table of a deployment, by view name."""
    tables: dict[str, Table] = {}
    for name, role, record, time_field in _RECORD_TABLES:
        avro = codec.registry.latest(record).parsed
        fields = [pa.field(f["name"], arrow_type(f["type"])) for f in avro["fields"]]
        clock = name in _HOST_CLOCKED
        tables[name] = Table(
            name=name,
            topic=getattr(topics, role),
            record=record,
            time_field=time_field,
            schema=pa.schema(
                [*fields, *KAFKA_COLUMNS, *(CLOCK_COLUMNS if clock else ()), *_UNDECODABLE]
            ),
            convert=_text_unions(avro),
            batch_record=_BATCHES.get(record),
            host_clock=clock,
        )
    shared = [
        pa.field(f["name"], arrow_type(f["type"]))
        for f in codec.registry.latest("SampleBatch").parsed["fields"]
        if f["name"] != "entries"
    ]
    tables["samples"] = Table(
        name="samples",
        topic=topics.samples,
        record="SampleBatch",
        time_field="timestamp_ns",
        schema=pa.schema(
            [*shared, *_SAMPLE_COLUMNS, *KAFKA_COLUMNS, *CLOCK_COLUMNS, *_UNDECODABLE]
        ),
        batch_record="SampleBatch",
        host_clock=True,
        explode=chunk_samples,
    )
    texts = codec.registry.latest("SampleTextBatch").parsed
    entry = next(f for f in texts["fields"] if f["name"] == "entries")["type"]["items"]
    tables["sample_texts"] = Table(
        name="sample_texts",
        topic=topics.sample_texts,
        record="SampleTextBatch",
        time_field="timestamp_ns",
        schema=pa.schema(
            [
                *shared,
                *(pa.field(f["name"], arrow_type(f["type"])) for f in entry["fields"]),
                *KAFKA_COLUMNS,
                *CLOCK_COLUMNS,
                *_UNDECODABLE,
            ]
        ),
        batch_record="SampleTextBatch",
        host_clock=True,
    )
    tables["dead_letters"] = Table(
        name="dead_letters",
        topic=topics.dlq,
        record=None,
        time_field=None,
        schema=_DEAD_LETTER_SCHEMA,
    )
    return tables
