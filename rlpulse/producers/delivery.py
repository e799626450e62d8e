"""The background half of an EventLogger: delivery reports, the spool and its replay.

When an event counts as undeliverable (and is spooled), exactly:

- librdkafka reported a failed delivery: the broker could not be reached for
  ``message.timeout.ms`` (``producer.delivery_timeout_s``), or another
  transport or broker error. Events the broker refuses as malformed (too large,
  invalid record) are never spooled — a replay could not fix them — and count as
  dropped;
- ``produce()`` raised: the local queue is full (``BufferError``) or librdkafka
  refused to queue it;
- ``close()``: what is still queued after the flush timeout is purged, and the
  purge reports spool it;
- and every event logged while the logger is in *spool mode* (below).

Order. The joiner expects each producer's events in step order (it refuses an event
for a step it already released without retaining it), so spooled events must not be
overtaken by younger ones. The first undeliverable event switches the logger to spool
mode: librdkafka's queue is purged (its events, all younger, are spooled too) and
``log()`` hands every new event to this thread instead of librdkafka — still no disk
I/O in ``log()``. The spool is written in ``seq`` order and replayed file by file,
oldest first, once the broker is reachable again (a delivery or a metadata probe, with
back-off); a file whose replay did not fully succeed is kept and replayed whole later
(consumers drop the duplicates by (producer_id, seq)). When the last file is
delivered, the events held meanwhile are produced and the logger is live again.

A daemon thread does all this: it waits in ``poll`` for delivery reports (no busy
loop), writes the spool, replays it, and adopts the spool files that dead producers
left in the same run directory (see :mod:`rlpulse.producers.spool`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from rlpulse.oncelog import WarnOnce
from rlpulse.producers.spool import Spool, SpoolClaim, SpooledEvent, read_spool_file, spool_files
from rlpulse.transport.topics import missing_topic, topic_exists

log = logging.getLogger(__name__)

POLL_S = 0.2
"""Longest wait for delivery reports; also how soon the thread sees work and stop."""
PROBE_TIMEOUT_S = 2.0
TOPIC_CHECK_S = 0.5
"""How long the thread asks, once, whether a topic whose events timed out exists."""
FIRST_PROBE_PAUSE_S = 1.0
MAX_PROBE_PAUSE_S = 5.0
ORPHAN_SCAN_S = 30.0
REPLAY_QUEUE_LIMIT = 50_000
"""No replay batch starts while librdkafka's queue holds more events than this."""
HOLD_WHILE_REPLAYING = 10_000
"""Events logged during a replay stay in memory up to this many, then go to disk."""
BACKLOG_MAX = 100_000
"""Events waiting for the spool; beyond it ``log()`` drops events (counted) rather than block."""
SPOOL_CHUNK = 64
"""Events written per spool write; the thread lets the training loop run between chunks."""
_CLOSE_POLL_S = 0.05
_JOIN_S = PROBE_TIMEOUT_S + 1.0

PERMANENT_ERRORS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError._INVALID_ARG,
        KafkaError._BAD_MSG,
    }
)
"""Delivery errors that reject the event itself: sending it again cannot succeed."""
_TOPIC_UNKNOWN = frozenset(
    {KafkaError._MSG_TIMED_OUT, KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART}
)
"""Delivery errors behind which may be a topic that does not exist (auto-create off)."""


def undeliverable(error: KafkaError) -> bool:
    """Whether a failed delivery is transport trouble (spool the event), not a refused event."""
    return error.code() not in PERMANENT_ERRORS


@dataclass
class DeliveryCounts:
    """What happened to a logger's events after ``log()`` returned."""

    delivered: int = 0
    """Events the broker acknowledged without going through the spool."""
    spooled: int = 0
    """Events written to the spool."""
    replayed: int = 0
    """Spooled events (this producer's or a dead one's) delivered from the spool."""
    dropped: int = 0
    """Events lost: refused by the broker, spool full or unwritable, or backlog full."""


@dataclass
class _Batch:
    """One spool file being replayed."""

    path: Path
    claim: SpoolClaim | None
    """The dead producer's claim, or None for this producer's own file."""
    outstanding: int = 0
    failed: int = 0


@dataclass
class _Health:
    """Whether the broker looks reachable, from delivery reports and metadata probes."""

    ok: bool = False
    next_probe: float = 0.0
    pause: float = FIRST_PROBE_PAUSE_S


class DeliveryPump:
    """Serves one producer's delivery reports in a daemon thread; spools and replays.

    ``order_lock`` is the logger's lock, held by ``log()`` while it produces or hands
    an event over, so that switching between live and spool mode cannot reorder events.
    """

    def __init__(
        self,
        producer: Producer,
        spool: Spool,
        topic: str,
        producer_id: str,
        label: str,
        order_lock: threading.RLock,
    ) -> None:
        self.producer = producer
        self.spool = spool
        self.counts = DeliveryCounts()
        self.spooling = False
        """Spool mode: ``log()`` must give events to :meth:`hold`, not to librdkafka."""
        self.sent = 0
        """Events handed to librdkafka live (not replayed); counted under ``order_lock``."""
        self._reported = 0
        self._topic = topic
        self._producer_id = producer_id
        self._label = label
        self._order_lock = order_lock
        self._lock = threading.Lock()
        self._backlog: deque[SpooledEvent] = deque()
        self._purge_requested = False
        self._health = _Health()
        self._batch: _Batch | None = None
        self._orphans: dict[tuple[Path, str], SpoolClaim] = {}
        self._next_scan = 0.0
        self._closing = False
        self._stopping = threading.Event()
        self._warn = WarnOnce(log)
        self._unexplained: str | None = None
        self._thread = threading.Thread(target=self._run, name=f"rlpulse-{label}", daemon=True)
        self._thread.start()

    @property
    def backlog(self) -> int:
        """Events held in memory for the spool."""
        return len(self._backlog)

    @property
    def in_memory(self) -> int:
        """Events in librdkafka's queue (sent live or replayed) or held for the spool.

        Counted from this pump's own reports: ``len(producer)`` would also count
        librdkafka's requests and its error events not yet served by ``poll()``.
        """
        with self._lock:
            batch = self._batch
            queued = self.sent - self._reported + (batch.outstanding if batch else 0)
        return queued + len(self._backlog)

    # -- called by the logger and by librdkafka ---------------------------------------

    def report(self, seq: int, error: KafkaError | None, message: Message) -> None:
        """Delivery report of this producer's event ``seq`` (bound with ``functools.partial``)."""
        with self._lock:
            self._reported += 1
            if error is None:
                self.counts.delivered += 1
        if error is None:
            self._health.ok = True
            return
        if not undeliverable(error):
            self._refused(error)
            return
        self._enter_spool_mode(error.str(), topic_unknown=error.code() in _TOPIC_UNKNOWN)
        self.hold(
            SpooledEvent(
                message.topic() or self._topic,
                message.key(),
                message.value() or b"",
                self._producer_id,
                seq,
            )
        )

    def hold(self, event: SpooledEvent) -> None:
        """Keep ``event`` for the spool (spool mode); never blocks, drops beyond a bound."""
        if len(self._backlog) < BACKLOG_MAX:
            self._backlog.append(event)
            return
        with self._lock:
            self.counts.dropped += 1
        self._warn(
            "backlog-full",
            "%s: %d events are waiting for the spool; dropping events (see dropped)",
            self._label,
            BACKLOG_MAX,
        )

    def overflow(self, event: SpooledEvent, why: str) -> None:
        """Take an event ``produce()`` refused (``why``): spool mode from now on."""
        self._enter_spool_mode(why)
        self.hold(event)

    def close(self, timeout_s: float) -> int:
        """Stop the thread; for up to ``timeout_s``, replay the spool and flush; spool the rest.

        Returns how many events were spooled (or dropped) during the close.
        """
        deadline = time.monotonic() + timeout_s
        self._closing = True
        self._stopping.set()
        if self._thread is not threading.current_thread():
            self._thread.join(_JOIN_S)
        with self._lock:
            before = self.counts.spooled + self.counts.dropped
        self._replay_until(deadline)
        if self.producer.flush(max(0.0, deadline - time.monotonic())):
            self._purge_requested = True
            self._serve_purge()
        self._drain()
        self._explain_spooling()
        self._finish_batch()
        for claim in self._orphans.values():
            claim.release()
        self._orphans.clear()
        self.spool.close()
        with self._lock:
            return self.counts.spooled + self.counts.dropped - before

    # -- spool mode -------------------------------------------------------------------

    def _enter_spool_mode(self, why: str, *, topic_unknown: bool = False) -> None:
        with self._order_lock:  # no log() between the switch and the purge request
            self._health.ok = False
            if self.spooling:
                return
            self.spooling = True
            self._purge_requested = True
        if topic_unknown and not self._warn.seen("spool-mode"):
            self._unexplained = why  # the thread asks whether the topic exists, then says
            return
        self._warn_spooling(why)

    def _warn_spooling(self, why: str) -> None:
        self._warn(
            "spool-mode",
            "%s: events cannot be delivered (%s); spooling them to %s until the broker is back",
            self._label,
            why,
            self.spool.directory,
        )

    def _explain_spooling(self) -> None:
        """Say why spooling began: after a timeout, whether the topic exists is asked first.

        Asked here, in the pump's thread, not in a delivery report callback.
        """
        why, self._unexplained = self._unexplained, None
        if why is None:
            return
        if topic_exists(self.producer, self._topic, TOPIC_CHECK_S) is not False:
            self._warn_spooling(why)  # no answer, or the topic is there: the error says it
            return
        self._warn(
            "spool-mode",
            "%s: events cannot be delivered: %s; spooling them to %s until the topic exists",
            self._label,
            missing_topic(self._topic),
            self.spool.directory,
        )

    def _serve_purge(self) -> None:
        """Fail everything queued at once (younger than what failed), and spool it now."""
        if not self._purge_requested:
            return
        self._purge_requested = False
        self.producer.purge()
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while self.producer.poll(0) and time.monotonic() < deadline:
            pass  # serve the purge reports before anything else is written

    def _drain(self) -> None:
        """Write what is held to the spool in ``seq`` order, in chunks."""
        if not self._backlog:
            return
        events = [self._backlog.popleft() for _ in range(len(self._backlog))]
        events.sort(key=lambda e: (e.producer_id, e.seq))
        for start in range(0, len(events), SPOOL_CHUNK):
            self._write(events[start : start + SPOOL_CHUNK])
            time.sleep(0)  # hand the GIL to a waiting log() call between chunks

    def _write(self, events: list[SpooledEvent]) -> None:
        try:
            written = self.spool.write(events)
        except OSError as exc:
            written = 0
            self._warn("spool-write", "%s: cannot write the spool: %s", self._label, exc)
        else:
            if written < len(events):
                self._warn(
                    "spool-full",
                    "%s: spool %s is full (%d bytes); dropping events",
                    self._label,
                    self.spool.directory,
                    self.spool.max_bytes,
                )
        with self._lock:
            self.counts.spooled += written
            self.counts.dropped += len(events) - written

    def _go_live(self) -> None:
        """Produce what was held during the replay, in order, and leave spool mode."""
        with self._order_lock:
            held = sorted(self._backlog, key=lambda e: e.seq)
            self._backlog.clear()
            for index, event in enumerate(held):
                self.sent += 1
                try:
                    self.producer.produce(
                        event.topic,
                        event.value,
                        event.key,
                        on_delivery=partial(self.report, event.seq),
                    )
                except (BufferError, KafkaException):
                    self.sent -= 1
                    self._backlog.extend(held[index:])  # still spooling; these go to disk
                    return
            self.spooling = False
        log.info("%s: spool replayed; events go to the broker directly again", self._label)

    def _refused(self, error: KafkaError) -> None:
        with self._lock:
            self.counts.dropped += 1
        self._warn(
            f"refused-{error.name()}",
            "%s: the broker refused an event (%s); it is dropped",
            self._label,
            error.str(),
        )

    # -- the thread -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.producer.poll(POLL_S)
                self._serve_purge()
                self._replay_tick(time.monotonic())
                if not self._health.ok or len(self._backlog) > HOLD_WHILE_REPLAYING:
                    self._drain()
                self._explain_spooling()
            except Exception:  # keep serving reports whatever one step did
                log.exception("%s: delivery thread error; continuing", self._label)
                self._stopping.wait(POLL_S)

    # -- replay -----------------------------------------------------------------------

    def _replay_tick(self, now: float) -> None:
        """Finish the batch in flight, or replay the next file, or go live, if reachable."""
        if self._batch is not None:
            if self._batch.outstanding == 0:
                self._finish_batch()
            return
        if not self._closing and now >= self._next_scan:
            self._next_scan = now + ORPHAN_SCAN_S
            self._adopt_orphans()
        if not (self.spooling or self.spool.size or self._orphans):
            return
        if not self._broker_reachable(now) or len(self.producer) > REPLAY_QUEUE_LIMIT:
            return
        found = self._next_file()
        if found is not None:
            self._start_batch(*found)
        elif self.spooling:
            self._go_live()

    def _replay_until(self, deadline: float) -> None:
        """At close: replay this producer's spool in the caller's thread while time remains."""
        while time.monotonic() < deadline:
            self.producer.poll(_CLOSE_POLL_S)
            self._serve_purge()
            now = time.monotonic()
            if self._batch is None:
                if not (self.spooling or self.spool.size):
                    return
                if not self._broker_reachable(now):
                    if self._health.next_probe >= deadline:
                        return
                    continue
            self._replay_tick(now)

    def _adopt_orphans(self) -> None:
        """Claim the spool files of producers in this run directory whose process is gone."""
        for directory, producer_id in spool_files(self.spool.directory):
            if producer_id == self._producer_id or (directory, producer_id) in self._orphans:
                continue
            claim = SpoolClaim.take(directory, producer_id)
            if claim is not None:
                log.info("%s: replaying the spool of dead producer %s", self._label, producer_id)
                self._orphans[(directory, producer_id)] = claim

    def _broker_reachable(self, now: float) -> bool:
        """True after a delivery succeeded, or a metadata probe (with back-off) found the topic."""
        health = self._health
        if health.ok:
            health.pause = FIRST_PROBE_PAUSE_S
            return True
        if now < health.next_probe:
            return False
        try:
            metadata = self.producer.list_topics(self._topic, timeout=PROBE_TIMEOUT_S)
            topic = metadata.topics.get(self._topic)
            health.ok = topic is not None and topic.error is None and bool(topic.partitions)
        except KafkaException:
            health.ok = False
        if not health.ok:
            health.next_probe = time.monotonic() + health.pause
            health.pause = min(health.pause * 2, MAX_PROBE_PAUSE_S)
        return health.ok

    def _next_file(self) -> tuple[Path, SpoolClaim | None] | None:
        """The oldest spool file of this producer (closing the open one), else of an orphan."""
        if self.spool.size and not self.spool.closed_files():
            self.spool.rotate()  # what is held meanwhile is younger: it waits in memory
        own = self.spool.closed_files()
        if own:
            return own[0], None
        if self._closing:
            return None
        for key, claim in list(self._orphans.items()):
            files = claim.files()
            if files:
                return files[0], claim
            claim.release()
            del self._orphans[key]
        return None

    def _start_batch(self, path: Path, claim: SpoolClaim | None) -> None:
        try:
            events, _bad = read_spool_file(path)
        except OSError as exc:
            self._warn("spool-read", "%s: cannot read %s: %s", self._label, path, exc)
            return
        batch = _Batch(path, claim)
        self._batch = batch
        for event in events:
            with self._lock:
                batch.outstanding += 1
            try:
                self.producer.produce(
                    event.topic,
                    key=event.key,
                    value=event.value,
                    on_delivery=partial(self._report_replayed, batch),
                )
            except (BufferError, KafkaException):
                with self._lock:
                    batch.outstanding -= 1
                    batch.failed += 1  # the file is kept and replayed again later
                break

    def _report_replayed(self, batch: _Batch, error: KafkaError | None, _message: Message) -> None:
        with self._lock:
            batch.outstanding -= 1
            if error is None:
                self.counts.replayed += 1
            elif undeliverable(error):
                batch.failed += 1
        if error is None:
            self._health.ok = True
        elif undeliverable(error):
            self._health.ok = False
        else:
            self._refused(error)

    def _finish_batch(self) -> None:
        """Delete a replayed file once all its events were delivered; keep it otherwise."""
        batch = self._batch
        if batch is None or batch.outstanding:
            return
        self._batch = None
        if batch.failed:
            log.debug("%s: %d events of %s not replayed yet", self._label, batch.failed, batch.path)
        elif batch.claim is None:
            self.spool.remove(batch.path)
        else:
            batch.path.unlink(missing_ok=True)
