"""The indexer: log records and step summaries into OpenSearch or Elasticsearch, once each.

One process is one member of the consumer group ``<prefix>-index``; Kafka spreads the
partitions of ``<prefix>.logs`` and ``<prefix>.steps`` over the members (run more processes
for more throughput). It gathers the documents of what it reads (:mod:`.documents`) and sends
them as one ``_bulk`` request when ``bulk_max_docs`` or ``bulk_max_bytes`` is reached or the
oldest waited ``bulk_max_wait_s``.

One request is in flight at a time, on a thread of its own, while the next one's documents
are decoded and built: the engine's work and the indexer's overlap.

Nothing lost, nothing twice. Offsets are committed only after the response of a request
says where every one of its documents went: landed, or refused for good (then the document
goes to the dead-letter topic with the engine's reason, and that is delivered first), and
requests are committed in the order they were read. Documents the engine could not take now
(429, 5xx, a connection refused or timed out) are sent again after a pause that doubles up
to ``retry_max_s``; the next request waits, and nothing beyond it is read meanwhile: a slow
or absent cluster holds the indexer back, and Kafka keeps the rest. Once a request is not
all in (stopped while the engine was away), no later one commits: it would pass over it. A
LogBatch whose records fill several requests is committed with the last of them. A crash
anywhere (SIGKILL mid-request included) makes the next member read again from the last
commit; the documents it indexes again keep their ids (:mod:`.documents`) and so overwrite
themselves.

A message that does not decode is counted and skipped (the archive keeps its bytes). At
start the indexer creates the topics no worker has created yet (as the archiver does) and
installs its index templates (:mod:`.template`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from opensearchpy import OpenSearch
from opensearchpy.exceptions import ConnectionError as SearchConnectionError
from opensearchpy.exceptions import TransportError as SearchTransportError

from rlpulse.diagnostics import WarnOnce
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.exceptions import SchemaError
from rlpulse.schemas.topics import REASON_HEADER, SOURCE_HEADER, Topics
from rlpulse.settings import Settings
from rlpulse.streams.indexer.bulk import BulkOutcome, read_bulk_response, retryable_status
from rlpulse.streams.indexer.documents import (
    Document,
    IndexNames,
    log_batch_documents,
    sample_text_documents,
    summary_document,
)
from rlpulse.streams.indexer.exceptions import IndexerError
from rlpulse.streams.indexer.template import templates
from rlpulse.transport.backoff import Backoff
from rlpulse.transport.clients import is_fatal, new_producer
from rlpulse.transport.group import Fetching, join_group
from rlpulse.transport.readiness import Deadline, wait_for_kafka
from rlpulse.transport.topics import ensure_topics_for_reader

__all__ = ["Indexer", "IndexerCounts"]

log = logging.getLogger(__name__)
Say = Callable[[str], None]
Refused = list[tuple[int, str]]
"""Documents the engine refused for good: position in their request, and the reason."""
POLL_S = 0.2
CONSUME_MAX = 500
FIRST_RETRY_S = 0.5
WAIT_FOR_SEARCH_MAX_S = 5.0
"""The longest pause between tries while waiting at start for the engine to answer."""
REPORT_S = 60.0
"""How often a busy indexer says how it goes."""
DLQ_TIMEOUT_S = 30.0
REJECTED = "rejected"
"""The kind of a dead letter's reason for a document the search engine refused."""
METADATA_REFRESH_S = 10.0
"""How soon the consumer finds a topic that was created after it started."""
FETCHING = Fetching(min_bytes=64 * 1024, wait_max_ms=100, metadata_refresh_s=METADATA_REFRESH_S)


@dataclass
class IndexerCounts:
    """What one indexer process did."""

    documents: int = 0
    """Documents that landed (created or updated)."""
    updated: int = 0
    """Of those, documents that were there already: records indexed again after a restart."""
    rejected: int = 0
    """Documents the engine refused for good: sent to the dead-letter topic."""
    undecodable: int = 0
    """Messages that did not decode (skipped)."""
    requests: int = 0
    """``_bulk`` requests answered."""
    retries: int = 0
    """Requests that had to be sent again (in whole or in part)."""


@dataclass
class _Bulk:
    """The documents gathered for the next request, and the offsets they complete."""

    documents: list[Document] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    """Where each document was read: ``topic/partition/offset`` (a dead letter's header)."""
    size: int = 0
    started: float = 0.0
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    """The next offset of each partition once the request's documents are in."""

    def add(self, document: Document, source: str) -> None:
        if not self.documents:
            self.started = time.monotonic()
        self.documents.append(document)
        self.sources.append(source)
        self.size += len(document.body) + len(document.index) + len(document.id) + 40


class Indexer:
    """One indexer process: call :meth:`run` (blocks), :meth:`stop` from a signal handler.

    ``url`` is the search engine's REST API (``http://host:9200``; user and password may be in
    it); ``client`` replaces the OpenSearch client built from it.
    """

    def __init__(
        self,
        settings: Settings,
        url: str,
        say: Say | None = None,
        client: OpenSearch | None = None,
    ) -> None:
        index = settings.index
        self.settings = settings
        self.url = url
        self.topics = Topics(settings.prefix)
        self.names = IndexNames(settings.index_prefix)
        self.codec = default_codec()
        self.counts = IndexerCounts()
        self.client = client or OpenSearch(
            hosts=[url], timeout=index.request_timeout_s, max_retries=0, retry_on_timeout=False
        )
        self._say = say or log.info
        self._stop = threading.Event()
        self._consumer: Consumer | None = None
        self._bulk = _Bulk()
        self._requests = ThreadPoolExecutor(1, thread_name_prefix="rlpulse-index-bulk")
        self._in_flight: tuple[_Bulk, Future[Refused | None]] | None = None
        self._broken = False
        """A request was not all in (stopped, or the engine refused it whole): commit no more."""
        self._warn = WarnOnce(log)
        self._next_report = time.monotonic() + REPORT_S
        self._reported = 0

    def stop(self) -> None:
        """Ask :meth:`run` to send what it holds (if the engine takes it) and return."""
        self._stop.set()

    # -- start-up -------------------------------------------------------------------------------

    def _wait_for_search(self, deadline: Deadline) -> str:
        """Block until the engine answers; its name and version. Raises at the deadline."""
        pauses, announced = Backoff(FIRST_RETRY_S, WAIT_FOR_SEARCH_MAX_S), False
        while True:
            try:
                info = self.client.info()
                version = info.get("version", {})
                return f"{version.get('distribution', 'elasticsearch')} {version.get('number')}"
            except (SearchConnectionError, SearchTransportError) as exc:
                status = getattr(exc, "status_code", None)
                if isinstance(status, int) and not retryable_status(status):
                    raise IndexerError(f"{self.url} refused the indexer: {_why(exc)}") from None
                if deadline.passed():
                    raise IndexerError(
                        f"no search engine answered at {self.url} within "
                        f"{deadline.seconds:.0f} s ({_why(exc)}); start one (`rlpulse search "
                        "up` runs a local OpenSearch) or set opensearch_url"
                    ) from None
                if not announced:
                    self._say(f"waiting for the search engine at {self.url} ({_why(exc)})")
                    announced = True
            time.sleep(min(pauses.next(), deadline.left()))

    def _install_templates(self) -> None:
        index = self.settings.index
        for name, body in templates(self.names, index.shards, index.replicas).items():
            try:
                self.client.indices.put_index_template(name=name, body=body)
            except (SearchConnectionError, SearchTransportError) as exc:
                raise IndexerError(
                    f"could not install index template {name}: {_why(exc)}"
                ) from None

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> IndexerCounts:
        """Index until :meth:`stop`; send what is gathered, commit, leave the group."""
        index = self.settings.index
        deadline = Deadline(index.startup_timeout_s)
        wait_for_kafka(self.settings, deadline, self._say)
        ensure_topics_for_reader(self.settings, deadline.left(), METADATA_REFRESH_S, self._say)
        engine = self._wait_for_search(deadline)
        self._install_templates()
        self._say(
            f"indexing into {engine} at {self.url}: {self.names.pattern('logs')}, "
            f"{self.names.pattern('steps')}"
            + (f", {self.names.pattern('sample-texts')}" if index.sample_texts else "")
        )
        topics = [self.topics.logs, self.topics.steps]
        if index.sample_texts:
            topics.append(self.topics.sample_texts)
        consumer = self._consumer = join_group(
            self.settings,
            self.settings.index_group,
            "indexer",
            topics,
            index,
            FETCHING,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        try:
            while not self._stop.is_set():
                self._take_all(consumer.consume(CONSUME_MAX, POLL_S))
                bulk = self._bulk
                if bulk.offsets and (
                    not bulk.documents  # only undecodable messages: commit past them
                    or self._full()
                    or time.monotonic() - bulk.started >= index.bulk_max_wait_s
                ):
                    self._send()
                elif self._in_flight is not None and self._in_flight[1].done():
                    self._settle()  # commit now, not with the next request
                self._report()
        finally:
            try:
                if self._bulk.offsets:
                    self._send()
                self._settle()
            finally:
                self._requests.shutdown(wait=True)
                consumer.close()
                self._consumer = None
        return self.counts

    def _take_all(self, messages: list[Message]) -> None:
        """Turn messages into documents of the next request; send each request that fills."""
        names, codec, logs = self.names, self.codec, self.topics.logs
        texts = self.topics.sample_texts
        for message in messages:
            error = message.error()
            if error is not None and is_fatal(error):
                self._bulk = _Bulk()  # another member may own the partitions: send nothing
                raise IndexerError(
                    f"indexer: fatal Kafka error: {error.str()} (two indexers with one "
                    "index.instance_id fence each other); restarted, an indexer resumes from "
                    "its last commit"
                )
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    self._warn(str(error.code()), "indexer: Kafka error %s", error.str())
                continue
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            if topic is None or partition is None or offset is None:
                continue
            source = f"{topic}/{partition}/{offset}"
            try:
                value = message.value() or b""
                if topic == logs:
                    documents = log_batch_documents(names, codec.decode_log_batch(value))
                elif topic == texts:
                    documents = sample_text_documents(names, codec.decode_sample_text_batch(value))
                else:
                    documents = [summary_document(names, codec.decode_summary(value))]
            except (SchemaError, ValueError, KeyError) as exc:
                self.counts.undecodable += 1
                self._warn("undecodable", "indexer: skipped a message at %s: %s", source, exc)
                documents = []
            for document in documents:  # a LogBatch may fill several requests
                if self._full() and not self._send():
                    return  # stopped: nothing after the last commit counts as read
                self._bulk.add(document, source)
            # The message is done once the request holding its last document is in.
            self._bulk.offsets[(topic, partition)] = offset + 1

    def _full(self) -> bool:
        bulk, index = self._bulk, self.settings.index
        return len(bulk.documents) >= index.bulk_max_docs or bulk.size >= index.bulk_max_bytes

    def _send(self) -> bool:
        """Hand the gathered documents to the request thread, once the request in flight is in.

        Returns False when stopped before that (nothing more is committed: the next member
        reads it again).
        """
        if not self._settle():
            return False
        bulk, self._bulk = self._bulk, _Bulk()
        self._in_flight = (bulk, self._requests.submit(self._deliver, bulk))
        return True

    def _settle(self) -> bool:
        """Wait for the request in flight: dead-letter what was refused, then commit.

        False when stopped (or failed) before every document of it was in: from then on
        nothing is committed, since a later request's offsets would pass over it.
        """
        if self._in_flight is None:
            return not self._broken
        bulk, future = self._in_flight
        self._in_flight = None
        self._broken = True  # until this request is known to be in
        refused = future.result()
        if refused is None:
            return False
        if refused:
            self._dead_letters(bulk, refused)
        self._commit(bulk.offsets)
        self._broken = False
        return True

    def _deliver(self, bulk: _Bulk) -> Refused | None:
        """On the request thread: send until each document landed or was refused for good.

        Returns the refused ones (position, reason); None when stopped before all were in.
        """
        todo = list(range(len(bulk.documents)))
        refused: Refused = []
        pauses = Backoff(FIRST_RETRY_S, self.settings.index.retry_max_s)
        while todo:
            outcome = self._request(bulk, todo)
            if outcome is not None:
                self.counts.requests += 1
                self.counts.documents += outcome.created + outcome.updated
                self.counts.updated += outcome.updated
                refused += outcome.rejected
                todo = outcome.retry
                if not todo:
                    break
                self._warn(
                    "retry-items",
                    "indexer: the search engine could not take %d document(s) now; sending "
                    "them again",
                    len(todo),
                )
            self.counts.retries += 1
            if self._stop.wait(pauses.next()):
                return None
        return refused

    def _request(self, bulk: _Bulk, todo: list[int]) -> BulkOutcome | None:
        """One ``_bulk`` request of the documents at ``todo``: its outcome, or None to retry."""
        body = b"".join(bulk.documents[position].bulk_lines() for position in todo)
        try:
            response = self.client.bulk(body=body)
        except (SearchConnectionError, SearchTransportError) as exc:
            status = getattr(exc, "status_code", None)
            if isinstance(status, int) and not retryable_status(status):
                raise IndexerError(
                    f"the search engine refused a _bulk request: {_why(exc)}"
                ) from None
            self._warn(
                "bulk-failed",
                "indexer: _bulk request to %s failed (%s); retrying (documents wait in "
                "Kafka meanwhile)",
                self.url,
                _why(exc),
            )
            return None
        return read_bulk_response(response, todo)

    def _dead_letters(self, bulk: _Bulk, rejected: Refused) -> None:
        """Send each refused document to the dead-letter topic with its reason; wait for them."""
        producer = new_producer(self.settings, "indexer dead letters")
        cut = self.settings.worker.max_reason_bytes
        for position, reason in rejected:
            document = bulk.documents[position]
            self._warn("rejected", "indexer: the search engine refused a document: %s", reason)
            why = f"{REJECTED}: the search engine refused it: {reason}".encode()[:cut]
            producer.produce(
                self.topics.dlq,
                document.body,
                document.run_id.encode(),
                headers=[
                    (REASON_HEADER, why),
                    (SOURCE_HEADER, bulk.sources[position].encode()),
                ],
            )
        left = producer.flush(DLQ_TIMEOUT_S)
        if left:
            raise IndexerError(
                f"{left} refused document(s) could not be sent to {self.topics.dlq}; stopping "
                "before committing past them"
            )
        self.counts.rejected += len(rejected)

    def _commit(self, offsets: dict[tuple[str, int], int]) -> None:
        if not offsets or self._consumer is None:
            return
        try:
            self._consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                asynchronous=False,
            )
        except KafkaException as exc:  # e.g. the partitions moved on: their new owner re-reads
            self._warn("commit", "indexer: could not commit offsets: %s", exc)

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._say(f"indexing {len(partitions)} partition(s)")

    def _on_revoke(self, _consumer: Consumer, _partitions: list[TopicPartition]) -> None:
        """Still ours until this returns: send what is gathered so that its offsets commit."""
        sent = self._send() if self._bulk.offsets else True
        if not (self._settle() and sent):
            self._bulk = _Bulk()

    def _on_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Another member may own them already: drop what was gathered (it re-reads them).

        A request in flight still completes; its commit fails, and its documents, indexed
        again by the new owner, overwrite themselves.
        """
        self._bulk = _Bulk()
        self._say(
            f"lost {len(partitions)} partition(s) (session timeout); their new owner indexes them"
        )

    def _report(self) -> None:
        now = time.monotonic()
        if now < self._next_report:
            return
        self._next_report = now + REPORT_S
        done = self.counts.documents
        if done != self._reported:
            self._say(
                f"indexed {done} documents ({(done - self._reported) / REPORT_S:.0f}/s over the "
                f"last {REPORT_S:.0f} s), {self.counts.rejected} refused"
            )
            self._reported = done


def _why(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]
