"""The last minutes of the live topics, as rows of the archive's tables.

The archive is written in rolls (``archive.roll_s``, 5 minutes by default), so a running
run's newest steps are on Kafka before they are in Parquet. :class:`LiveTail` reads
``<prefix>.steps``, ``.control``, ``.acks``, ``.verdicts``, ``.events`` and ``.logs`` from
``lookback_s`` before its start (``offsets_for_times``, every partition, no consumer group:
it commits nothing), turns each message into rows exactly as the archiver does
(:meth:`~rlpulse.archive.tables.Table.rows`), and keeps the rows of the last ``lookback_s``
seconds (by the records' Kafka time) as Arrow tables that :mod:`rlpulse.ui.data` puts beside
the archive's. A record both here and in the archive is read twice; the page's queries are
written so that a duplicate changes nothing (latest revision, distinct ids, averages).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from rlpulse.archive.tables import BatchColumns, BatchRows, Table, day_of, run_partition
from rlpulse.schemas.codec import Codec, default_codec
from rlpulse.settings import Settings
from rlpulse.transport.clients import new_consumer

__all__ = ["LIVE_TABLES", "LiveTail"]

log = logging.getLogger(__name__)

LIVE_TABLES: Final = (
    "steps", "commands", "acks", "verdicts", "events", "logs", "samples", "sample_texts"
)  # fmt: skip
"""The archive tables the live tail keeps (not audits or dead letters)."""
_RETRY_S: Final = 5.0


@dataclass
class _Chunk:
    batch: pa.RecordBatch
    newest_ms: int


@dataclass
class _LiveTable:
    """One table's rows of the lookback: converted chunks, and rows not yet converted."""

    table: Table
    chunks: deque[_Chunk] = field(default_factory=deque)
    rows: list[dict[str, Any]] = field(default_factory=list)
    pending: BatchColumns | None = None
    newest_ms: int = -1
    count: int = 0

    def add(self, rows: Any, run: str | None, stamp_ms: int) -> None:
        partition = {"date": day_of(stamp_ms), "run": run_partition(run)}
        if isinstance(rows, BatchRows):
            if self.rows:
                self.convert()
            if self.pending is None:
                self.pending = BatchColumns(_with_partitions(self.table.schema))
            rows.shared.update(partition)
            self.pending.add(rows)
            self.count += len(rows.entries)
        else:
            if self.pending is not None:
                self.convert()
            for row in rows:
                row.update(partition)
            self.rows += rows
            self.count += len(rows)
        self.newest_ms = max(self.newest_ms, stamp_ms)

    def convert(self) -> None:
        """Turn the rows not yet converted into one Arrow record batch."""
        batch: pa.RecordBatch | None = None
        if self.pending is not None and self.pending.rows:
            batch = self.pending.record_batch()
        elif self.rows:
            struct = pa.struct(list(_with_partitions(self.table.schema)))
            batch = pa.RecordBatch.from_struct_array(pa.array(self.rows, type=struct))
        self.pending, self.rows = None, []
        if batch is not None and batch.num_rows:
            self.chunks.append(_Chunk(batch, self.newest_ms))

    def prune(self, oldest_ms: int, max_rows: int) -> None:
        """Drop chunks whose newest record is older than ``oldest_ms``, and beyond ``max_rows``."""
        while self.chunks and (self.chunks[0].newest_ms < oldest_ms or self.count > max_rows):
            self.count -= self.chunks.popleft().batch.num_rows

    def snapshot(self) -> pa.Table:
        schema = _with_partitions(self.table.schema)
        return pa.Table.from_batches([chunk.batch for chunk in self.chunks], schema=schema)


def _with_partitions(schema: pa.Schema) -> pa.Schema:
    return schema.append(pa.field("date", pa.string())).append(pa.field("run", pa.string()))


class LiveTail:
    """A thread that keeps the last ``lookback_s`` of the live topics (module docstring).

    :meth:`start` returns at once; :attr:`error` says why it reads nothing (no broker yet: it
    keeps trying every few seconds). :meth:`snapshot` returns each table's rows as an Arrow
    table with the archive's columns (and ``date``, ``run``), never raises.
    """

    def __init__(
        self,
        settings: Settings,
        tables: dict[str, Table],
        lookback_s: float,
        max_rows: int,
        codec: Codec | None = None,
    ) -> None:
        self.settings = settings
        self.lookback_s = lookback_s
        self.max_rows = max_rows
        self.codec = codec or default_codec()
        self._tables = {name: _LiveTable(tables[name]) for name in LIVE_TABLES}
        self._by_topic = {live.table.topic: live for live in self._tables.values()}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlpulse-ui-live", daemon=True)
        self.error: str | None = "not started"
        self.messages = 0

    def start(self) -> None:
        """Start reading in the background."""
        self._thread.start()

    def close(self) -> None:
        """Stop reading and wait for the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10.0)

    def snapshot(self) -> dict[str, pa.Table]:
        """The rows of each live table now (the lookback window, newest last)."""
        oldest_ms = int((time.time() - self.lookback_s) * 1000)
        with self._lock:
            tables = {}
            for name, live in self._tables.items():
                live.convert()
                live.prune(oldest_ms, self.max_rows)
                tables[name] = live.snapshot()
            return tables

    def _run(self) -> None:
        while not self._stop.is_set():
            consumer: Consumer | None = None
            try:
                consumer = self._assign()
                self.error = None
                while not self._stop.is_set():
                    self._take(consumer.consume(1000, 0.5))
            except (KafkaException, OSError) as exc:
                self.error = f"cannot read the live topics: {exc}"
                log.warning("ui: %s (retrying in %.0f s)", self.error, _RETRY_S)
            finally:
                if consumer is not None:
                    consumer.close()
            self._stop.wait(_RETRY_S)

    def _assign(self) -> Consumer:
        consumer = new_consumer(
            self.settings,
            f"{self.settings.prefix}-ui",
            "ui",
            {"enable.auto.commit": False, "fetch.wait.max.ms": 200},
        )
        try:
            metadata = consumer.list_topics(timeout=10.0)
            missing = sorted(set(self._by_topic) - set(metadata.topics))
            if missing:
                raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, str(missing)))
            since_ms = int((time.time() - self.lookback_s) * 1000)
            wanted = [
                TopicPartition(topic, partition, since_ms)
                for topic in self._by_topic
                for partition in sorted(metadata.topics[topic].partitions)
            ]
            starts = consumer.offsets_for_times(wanted, timeout=10.0)
            # A partition with nothing that recent starts at its end (offset -1 = OFFSET_END).
            consumer.assign(
                [
                    TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else -1)
                    for tp in starts
                ]
            )
        except BaseException:
            consumer.close()
            raise
        return consumer

    def _take(self, messages: list[Any]) -> None:
        taken = []
        for message in messages:
            if message.error() is not None:
                continue
            live = self._by_topic[message.topic()]
            rows, run, stamp_ms = live.table.rows(
                self.codec,
                message.key(),
                message.value(),
                message.partition(),
                message.offset(),
                message.timestamp(),
                message.headers(),
            )
            if isinstance(rows, list) and rows and rows[0].get("decode_error"):
                continue
            taken.append((live, rows, run, stamp_ms))
        if not taken:
            return
        with self._lock:
            for live, rows, run, stamp_ms in taken:
                live.add(rows, run, stamp_ms)
            self.messages += len(taken)
