"""Search documents: one per log record, step summary and chosen sample, each with a stable id.

A document's id comes from what identifies its record, never from when it was read: a log
record and a chosen sample's texts are ``<producer_id>:<seq>``, a step summary its
``summary_id``. Indexing a record again
(a restarted indexer reading past its last commit, a replay) overwrites the same document, so
the index holds every record exactly once.

Each document goes to the daily index of its record's own time (UTC):
``<prefix>-logs-YYYY.MM.DD``, ``<prefix>-steps-YYYY.MM.DD`` or
``<prefix>-sample-texts-YYYY.MM.DD``; a record read late still lands in the day it happened.
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any, Final

from rlpulse.schemas.records import LogBatch, SampleTextBatch, StepSummary

__all__ = [
    "LOGS",
    "SAMPLE_TEXTS",
    "STEPS",
    "Document",
    "IndexNames",
    "log_batch_documents",
    "sample_text_documents",
    "summary_document",
]

LOGS: Final = "logs"
STEPS: Final = "steps"
SAMPLE_TEXTS: Final = "sample-texts"
_NS_PER_DAY: Final = 86_400 * 10**9
_NS_PER_MS: Final = 10**6
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


@dataclass(frozen=True, slots=True)
class Document:
    """One document to index: where it goes, its id, its run and its JSON body."""

    index: str
    id: str
    run_id: str
    body: bytes

    def bulk_lines(self) -> bytes:
        """The document as two lines of a ``_bulk`` request (an ``index`` action)."""
        # An index name is lower-case letters, digits and ".-_" (IndexNames): no escaping.
        action = f'{{"index":{{"_index":"{self.index}","_id":{encode_basestring(self.id)}}}}}\n'
        return action.encode() + self.body + b"\n"


class IndexNames:
    """The daily index names of one prefix, computed once per day and kind."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._names: dict[tuple[str, int], str] = {}

    def pattern(self, kind: str) -> str:
        """The wildcard pattern of every daily index of ``kind`` (``logs``, ``steps`` ...)."""
        return f"{self.prefix}-{kind}-*"

    def of(self, kind: str, when_ns: int) -> str:
        """The index of ``kind`` for a record that happened at ``when_ns`` (ns since the epoch)."""
        day = when_ns // _NS_PER_DAY
        name = self._names.get((kind, day))
        if name is None:
            date = datetime.datetime.fromtimestamp(day * 86_400, datetime.UTC)
            name = self._names[(kind, day)] = f"{self.prefix}-{kind}-{date:%Y.%m.%d}"
        return name


def log_batch_documents(
    names: IndexNames, batch: LogBatch | SampleTextBatch, kind: str = LOGS
) -> list[Document]:
    """The documents of a batch's records, one a record: its fields, ``@timestamp`` in ms.

    Id ``<producer_id>:<seq>``. The fields the batch's records share are encoded once. A
    LogBatch's go to the logs indices; a SampleTextBatch's (``kind`` :data:`SAMPLE_TEXTS`,
    :func:`sample_text_documents`) to the sample texts'.
    """
    shared = {key: value for key, value in batch.items() if key != "entries"}
    head = _dumps(shared)[:-1]  # '{"run_id":...,"producer_id":"..."' without its closing brace
    run_id, producer = batch["run_id"], batch["producer_id"]
    documents = []
    for entry in batch["entries"]:
        when = entry["timestamp_ns"]
        own = _dumps(entry)[1:-1]
        body = f'{head},{own},"@timestamp":{when // _NS_PER_MS}}}'
        documents.append(
            Document(names.of(kind, when), f"{producer}:{entry['seq']}", run_id, body.encode())
        )
    return documents


def sample_text_documents(names: IndexNames, batch: SampleTextBatch) -> list[Document]:
    """The documents of a SampleTextBatch, one a chosen sample.

    Its prompt, response head and tail and ground truth are text to search; the rest are
    keywords and numbers.
    """
    return log_batch_documents(names, batch, SAMPLE_TEXTS)


def summary_document(names: IndexNames, summary: StepSummary) -> Document:
    """The document of one step summary; its metrics as a list of ``{name, mean, ...}``.

    A list (mapped ``nested``) rather than an object per metric: the index's mapping stays
    the same size however many metrics the runs log.
    """
    when = summary["emitted_ns"]
    body: dict[str, Any] = {key: value for key, value in summary.items() if key != "metrics"}
    body["metrics"] = [_metric(name, stats) for name, stats in summary["metrics"].items()]
    body["@timestamp"] = when // _NS_PER_MS
    return Document(
        names.of(STEPS, when), summary["summary_id"], summary["run_id"], _dumps(body).encode()
    )


def _metric(name: str, stats: Mapping[str, Any]) -> dict[str, Any]:
    return {"name": name, **{key: _finite(value) for key, value in stats.items()}}


def _finite(value: Any) -> Any:
    """JSON has no NaN nor infinity: such a statistic is indexed as absent."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
