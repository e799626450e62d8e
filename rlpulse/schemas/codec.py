"""Avro single-object encoding for rlpulse records.

Every message on an rlpulse topic is ``0xC3 0x01`` + the 8-byte little-endian
CRC-64-AVRO fingerprint of the writer schema's Parsing Canonical Form + the Avro
binary body. Readers look the writer schema up by fingerprint among every version
kept in ``schemas/avro/`` and resolve it to the newest version of the same record,
so data written by an older release stays readable.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Final, cast

from fastavro import schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from rlpulse.schemas.exceptions import DecodeError, DecodeFailure, EncodeError
from rlpulse.schemas.records import (
    ActionVerdict,
    CommandAck,
    ControlCommand,
    LogBatch,
    LogRecord,
    RolloutSample,
    SampleBatch,
    SampleText,
    SampleTextBatch,
    StepSummary,
    TrainerEvent,
)

MAGIC = b"\xc3\x01"
HEADER_SIZE = len(MAGIC) + 8
_FILE_NAME = re.compile(r"^(?P<name>[A-Za-z]+)\.v(?P<version>\d+)\.avsc$")

RECORD_NAMES = (
    "TrainerEvent",
    "StepSummary",
    "ControlCommand",
    "CommandAck",
    "LogRecord",
    "LogBatch",
    "AuditReport",
    "ActionVerdict",
    "SampleBatch",
    "SampleTextBatch",
)


@dataclass(frozen=True)
class SchemaVersion:
    """One released version of one record schema."""

    name: str
    version: int
    parsed: Any
    fingerprint: bytes
    path: str


class SchemaRegistry:
    """Every version of every record schema found in a directory of ``Name.vN.avsc`` files."""

    def __init__(self, directory: Path | None = None) -> None:
        root = directory if directory is not None else _packaged_schema_dir()
        self._by_fingerprint: dict[bytes, SchemaVersion] = {}
        self._versions: dict[str, dict[int, SchemaVersion]] = {}
        for path in sorted(root.glob("*.avsc")):
            match = _FILE_NAME.match(path.name)
            if match is None:
                raise ValueError(f"{path}: schema files are named <Record>.v<N>.avsc")
            parsed = parse_schema(json.loads(path.read_text()))  # hinted: not re-parsed per call
            canonical = to_parsing_canonical_form(parsed)
            version = SchemaVersion(
                name=match["name"],
                version=int(match["version"]),
                parsed=parsed,
                fingerprint=bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")),
                path=str(path),
            )
            self._by_fingerprint[version.fingerprint] = version
            self._versions.setdefault(version.name, {})[version.version] = version

    def latest(self, name: str) -> SchemaVersion:
        """The newest version of record ``name``."""
        try:
            versions = self._versions[name]
        except KeyError:
            raise KeyError(f"unknown record {name!r}; known: {sorted(self._versions)}") from None
        return versions[max(versions)]

    def versions(self, name: str) -> list[SchemaVersion]:
        """All versions of record ``name``, oldest first."""
        return [v for _, v in sorted(self._versions.get(name, {}).items())]

    def by_fingerprint(self, fp: bytes) -> SchemaVersion | None:
        """The schema version with this fingerprint, if it is known."""
        return self._by_fingerprint.get(fp)


def _packaged_schema_dir() -> Path:
    return Path(str(resources.files("rlpulse.schemas").joinpath("avro")))


class Codec:
    """Encodes records with the newest schema and decodes any known version."""

    def __init__(self, registry: SchemaRegistry | None = None) -> None:
        self.registry = registry if registry is not None else SchemaRegistry()

    def encode(self, name: str, record: Mapping[str, Any]) -> bytes:
        """Encode ``record`` as record type ``name`` with its newest schema."""
        schema = self.registry.latest(name)
        buffer = io.BytesIO()
        buffer.write(MAGIC)
        buffer.write(schema.fingerprint)
        try:
            schemaless_writer(buffer, schema.parsed, record)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise EncodeError(f"{name}: {exc}") from exc
        return buffer.getvalue()

    def decode(self, data: bytes, expect: str | None = None) -> dict[str, Any]:
        """Decode one message; ``expect`` names the record type the caller needs.

        Raises :class:`DecodeError` whose ``failure`` says whether the bytes were
        garbage, truncated, written with an unknown schema, or of another record type.
        """
        if len(data) < HEADER_SIZE:
            if data and not MAGIC.startswith(data[:2]):
                raise DecodeError(DecodeFailure.GARBAGE, "no single-object encoding marker")
            raise DecodeError(DecodeFailure.TRUNCATED, f"{len(data)} bytes, header needs 10")
        if data[:2] != MAGIC:
            raise DecodeError(DecodeFailure.GARBAGE, f"marker {data[:2].hex()} is not c301")
        writer = self.registry.by_fingerprint(data[2:HEADER_SIZE])
        if writer is None:
            raise DecodeError(
                DecodeFailure.UNKNOWN_FINGERPRINT,
                f"no schema with fingerprint {data[2:HEADER_SIZE].hex()}",
            )
        if expect is not None and writer.name != expect:
            raise DecodeError(DecodeFailure.WRONG_RECORD, f"got {writer.name}, need {expect}")
        reader = self.registry.latest(writer.name)
        body = io.BytesIO(data)
        body.seek(HEADER_SIZE)
        try:
            record = schemaless_reader(
                body, writer.parsed, None if reader is writer else reader.parsed
            )
        except (EOFError, IndexError) as exc:
            raise DecodeError(DecodeFailure.TRUNCATED, f"{writer.name}: body ends early") from exc
        except Exception as exc:  # fastavro raises assorted errors on corrupt bodies
            raise DecodeError(DecodeFailure.GARBAGE, f"{writer.name}: {exc!r}") from exc
        trailing = len(data) - body.tell()
        if trailing:
            raise DecodeError(DecodeFailure.GARBAGE, f"{trailing} bytes after the record")
        return cast(dict[str, Any], record)

    def decode_event(self, data: bytes) -> TrainerEvent:
        """Decode a ``TrainerEvent``."""
        return cast(TrainerEvent, self.decode(data, "TrainerEvent"))

    def decode_summary(self, data: bytes) -> StepSummary:
        """Decode a ``StepSummary``."""
        return cast(StepSummary, self.decode(data, "StepSummary"))

    def decode_command(self, data: bytes) -> ControlCommand:
        """Decode a ``ControlCommand``."""
        return cast(ControlCommand, self.decode(data, "ControlCommand"))

    def decode_ack(self, data: bytes) -> CommandAck:
        """Decode a ``CommandAck``."""
        return cast(CommandAck, self.decode(data, "CommandAck"))

    def decode_log(self, data: bytes) -> LogRecord:
        """Decode a ``LogRecord``."""
        return cast(LogRecord, self.decode(data, "LogRecord"))

    def decode_logs(self, data: bytes) -> list[LogRecord]:
        """The log records of one ``<prefix>.logs`` message: a ``LogBatch`` or a ``LogRecord``.

        Trainers send batches; a single ``LogRecord`` (what earlier releases sent) reads as a
        list of one.
        """
        return log_records(self.decode_log_batch(data))

    def decode_log_batch(self, data: bytes) -> LogBatch:
        """One ``<prefix>.logs`` message as a ``LogBatch``; a ``LogRecord`` as a batch of one.

        For readers that use the shared fields once, not once a record.
        """
        writer = self.registry.by_fingerprint(data[len(MAGIC) : HEADER_SIZE])
        if writer is not None and writer.name == "LogRecord":
            record: dict[str, Any] = dict(self.decode_log(data))
            batch = {name: record.pop(name) for name in _SHARED_LOG_FIELDS}
            return cast(LogBatch, {**batch, "entries": [record]})
        return cast(LogBatch, self.decode(data, "LogBatch"))

    def decode_sample_batch(self, data: bytes) -> SampleBatch:
        """One ``<prefix>.samples`` message."""
        return cast(SampleBatch, self.decode(data, "SampleBatch"))

    def decode_samples(self, data: bytes) -> list[RolloutSample]:
        """The rollout samples of one ``<prefix>.samples`` message, one record a sample."""
        return rollout_samples(self.decode_sample_batch(data))

    def decode_sample_text_batch(self, data: bytes) -> SampleTextBatch:
        """One ``<prefix>.sample-texts`` message."""
        return cast(SampleTextBatch, self.decode(data, "SampleTextBatch"))

    def decode_sample_texts(self, data: bytes) -> list[SampleText]:
        """The chosen samples' texts of one ``<prefix>.sample-texts`` message."""
        batch = self.decode_sample_text_batch(data)
        shared = {name: batch[name] for name in SHARED_SAMPLE_FIELDS}
        return [cast(SampleText, {**shared, **entry}) for entry in batch["entries"]]

    def decode_verdict(self, data: bytes) -> ActionVerdict:
        """Decode an ``ActionVerdict``."""
        return cast(ActionVerdict, self.decode(data, "ActionVerdict"))


_SHARED_LOG_FIELDS: Final = (
    "run_id", "attempt", "rank", "tags", "hostname", "host_ip", "pid", "producer_id"
)  # fmt: skip
"""The fields of a LogRecord that a LogBatch holds once for all its entries."""

SHARED_SAMPLE_FIELDS: Final = (
    "run_id", "attempt", "rank", "tags", "hostname", "pid", "producer_id"
)  # fmt: skip
"""The fields a SampleBatch and a SampleTextBatch hold once for all their entries."""


def rollout_samples(batch: SampleBatch) -> list[RolloutSample]:
    """Every sample of every chunk of ``batch``, with the shared fields."""
    shared = {name: batch[name] for name in SHARED_SAMPLE_FIELDS}
    return [
        cast(RolloutSample, {**shared, **sample})
        for chunk in batch["entries"]
        for sample in chunk_samples(chunk)
    ]


def chunk_samples(chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The samples of one ``SampleChunk``, a dict each (a RolloutSample's own fields)."""
    groups, sources = chunk["groups"], chunk["data_sources"]
    group, source = chunk["group"], chunk["data_source"]
    advantage, aborted, turns = chunk["advantage"], chunk["aborted"], chunk["num_turns"]
    scores, dropped = chunk["scores"], chunk["dropped_scores"]
    seq, stamp, step, split = chunk["seq"], chunk["timestamp_ns"], chunk["step"], chunk["split"]
    first = chunk["first_index"]
    prompts, responses = chunk["prompt_length"], chunk["response_length"]
    truncated, repetition, empty = chunk["truncated"], chunk["repetition"], chunk["empty"]
    return [
        {
            "seq": seq,
            "timestamp_ns": stamp,
            "step": step,
            "split": split,
            "sample_index": first + i,
            "group": groups[group[i]] if group and group[i] >= 0 else None,
            "data_source": sources[source[i]] if source and source[i] >= 0 else None,
            "reward": reward,
            "scores": {name: values[i] for name, values in scores.items()},
            "dropped_scores": list(dropped),
            "advantage": _number_or_none(advantage[i]) if advantage else None,
            "prompt_length": prompts[i],
            "response_length": responses[i],
            "truncated": truncated[i],
            "aborted": aborted[i] if aborted else False,
            "num_turns": turns[i] if turns else 1,
            "repetition": repetition[i],
            "empty": empty[i],
        }
        for i, reward in enumerate(chunk["reward"])
    ]


def _number_or_none(value: float) -> float | None:
    return None if math.isnan(value) else value  # NaN: none given


def log_records(batch: LogBatch) -> list[LogRecord]:
    """The :class:`LogRecord` of each entry of ``batch`` (its fields and the shared ones)."""
    shared = {name: batch[name] for name in _SHARED_LOG_FIELDS}
    return [cast(LogRecord, {**shared, **entry}) for entry in batch["entries"]]


@cache
def default_codec() -> Codec:
    """A process-wide codec over the packaged schemas."""
    return Codec()
