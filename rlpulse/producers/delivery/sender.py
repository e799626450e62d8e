"""rlpulse's sender thread: one logger's write-ahead log to Kafka, and what dead ones left.

``log()`` and the logging handler only append to the write-ahead log
(:mod:`rlpulse.producers.delivery.wal`) and hand the frame over (a deque, so that this thread
need not read the log back while all goes well); this thread does the rest, off the training
thread.
It wakes for an event at once (the control loop waits for those), every
``producer.batch_linger_ms`` while records come, and at once for the first record after a
quiet spell; each time it serves the producer's delivery reports and lets each log's
:class:`~rlpulse.producers.delivery.shipper.LogShipper` send what is new.

It also sends the logs that dead producers of the same run on this host left, which the
logger's adoption thread claims and hands over (:meth:`WalSender.adopt`,
:mod:`rlpulse.producers.delivery.adoption`): with their producers' own ids, after reading back what
already arrived; each is deleted once delivered whole. :meth:`WalSender.close` waits for
them too.

The Kafka producer is used by this thread only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Final

from confluent_kafka import Consumer, KafkaError, Producer

from rlpulse.oncelog import WarnOnce
from rlpulse.producers.delivery.adoption import DeadLog, DeadLogs
from rlpulse.producers.delivery.shipper import LogShipper, ShipperCounts
from rlpulse.producers.delivery.wal import Frame, WalWriter
from rlpulse.transport.topics import missing_topic, topic_exists

__all__ = ["WalSender"]

log = logging.getLogger(__name__)

IDLE_WAIT_S: Final = 1.0
"""Longest sleep while nothing is appended or in flight (an append wakes the thread)."""
_JOIN_MARGIN_S: Final = 3.0


class WalSender:
    """Sends one logger's write-ahead log (and dead producers' of its run) from its thread.

    ``new_consumer`` makes the consumer a read-back uses. Counts of the logger's own records
    are in :attr:`counts`; of adopted logs' records, :attr:`replayed`.
    """

    def __init__(
        self,
        producer: Producer,
        writer: WalWriter,
        new_consumer: Callable[[], Consumer],
        *,
        linger_s: float,
        batch_max_bytes: int,
        label: str,
    ) -> None:
        self.producer = producer
        self.writer = writer
        self.sleeping = False
        """Whether the thread sleeps for long: the next append should :meth:`wake` it."""
        self.replayed = 0
        """Records of dead producers' logs this thread sent (or found already sent)."""
        self._new_consumer = new_consumer
        self._linger_s = linger_s
        self._batch_max_bytes = batch_max_bytes
        self._label = label
        self._own = LogShipper(
            writer.meta, new_consumer, batch_max_bytes=batch_max_bytes, writer=writer
        )
        self._dead = DeadLogs(new_consumer, batch_max_bytes, label)
        self._handed_dead: deque[DeadLog] = deque()
        self._dead_left: list[tuple[Path, int, str | None]] = []
        self._wake = threading.Event()
        self._progress = threading.Condition()
        self._stopping = threading.Event()
        self._deadline: float | None = None
        self._warn = WarnOnce(log)
        self._thread = threading.Thread(target=self._run, name=f"rlpulse-{label}", daemon=True)
        self._thread.start()

    @property
    def handed(self) -> deque[Frame]:
        """Where the logger hands each frame it appended (the sender need not read it back)."""
        return self._own.handed

    @property
    def counts(self) -> ShipperCounts:
        """What happened to the logger's own records."""
        return self._own.counts

    # -- called by the logger -----------------------------------------------------------

    def wake(self) -> None:
        """Look for new frames now (an event was appended, or a record after a quiet spell).

        Already woken and not yet looking: the coming look finds these frames too, so the
        (dearer) ``set`` is skipped.
        """
        self.sleeping = False
        if not self._wake.is_set():
            self._wake.set()

    def adopt(self, dead: DeadLog) -> None:
        """Send a dead producer's log this process claimed (any thread); :meth:`close` waits."""
        self._handed_dead.append(dead)
        self.wake()

    @property
    def adopted(self) -> set[Path]:
        """The dead producers' logs handed over and not yet delivered whole."""
        return {dead.meta.directory for dead in self._handed_dead} | self._dead.directories

    @property
    def pending(self) -> int:
        """The logger's frames Kafka has not acknowledged yet."""
        return self.writer.frames - self._own.acked_frames

    @property
    def adopted_left(self) -> list[tuple[Path, int, str | None]]:
        """After :meth:`close`: each adopted log it kept, its records left and why (or None)."""
        return list(self._dead_left)

    def wait_delivered(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` until every frame appended so far arrived.

        Returns how many of those frames have not arrived; frames appended meanwhile (by
        another thread: system metrics, a log handler) are not waited for nor counted.
        """
        target = self.writer.frames
        deadline = time.monotonic() + timeout_s
        self.wake()
        with self._progress:
            while self._own.acked_frames < target and self._thread.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._progress.wait(min(left, 0.05))
        return max(target - self._own.acked_frames, 0)

    def close(self, timeout_s: float) -> int:
        """Send for up to ``timeout_s`` more, stop the thread; return the own frames left.

        Adopted logs are sent within the same time (what is left of them:
        :attr:`adopted_left`). What was not sent stays in its write-ahead log for the next
        process of the run on this host or ``rlpulse replay``; a log delivered whole is deleted.
        """
        self._deadline = time.monotonic() + timeout_s
        self.wake()
        self._thread.join(timeout_s + _JOIN_MARGIN_S)
        self._stopping.set()
        self.wake()
        self._thread.join(_JOIN_MARGIN_S)
        return self.pending

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                if self._tick():
                    break
            except Exception:  # keep sending whatever one step did
                log.exception("%s: sender thread error; continuing", self._label)
                self._stopping.wait(self._linger_s)
        self._finish()

    def _tick(self) -> bool:
        """One look: serve reports, let every log send; True when closing is done."""
        self.sleeping = True  # before the look: an append after it wakes the thread
        dead = self._dead
        if self._own.idle and dead.idle and not self._handed_dead and self._deadline is None:
            self._wake.wait(IDLE_WAIT_S)
        else:
            self._wake.wait(self._linger_s)
        self._wake.clear()
        self.sleeping = False
        self.producer.poll(0)
        was_failing = self._own.failing
        if self._own.step(self.producer):
            with self._progress:
                self._progress.notify_all()
        self._say_how_it_goes(was_failing)
        while self._handed_dead:
            dead.add(self._handed_dead.popleft())
        if not dead.idle:
            self.replayed += dead.step(self.producer)
        if self._deadline is None:
            return False
        finished = self._own.delivered_all and dead.idle and not self._handed_dead
        return finished or time.monotonic() >= self._deadline

    def _say_how_it_goes(self, was_failing: bool) -> None:
        """One warning when the own log's delivery fails, one line when it goes again."""
        own = self._own
        if own.failing and not was_failing:
            why = own.last_error or "delivery failed"
            wait = "are sent when Kafka takes them"
            topic = own.meta.events_topic
            timed_out = own.last_code == KafkaError._MSG_TIMED_OUT
            if timed_out and topic_exists(self.producer, topic, 0.5) is False:
                why, wait = missing_topic(topic), "until the topic exists"
            self._warn(
                "undeliverable",
                "%s: records cannot be delivered: %s; they wait in the write-ahead log %s %s",
                self._label,
                why,
                own.directory,
                wait,
            )
        elif was_failing and not own.failing:
            log.info("%s: Kafka takes records again; sending what waited", self._label)

    def _finish(self) -> None:
        """Leave: purge what is queued, keep what was not delivered, delete what was."""
        self.producer.purge()
        self.producer.poll(0)
        own = self._own
        own.settle()
        delivered = own.delivered_all
        self.writer.close()
        own.close(delete=False)
        if self.writer.claim is not None:
            self.writer.claim.release(delete=delivered)
        while self._handed_dead:
            self._dead.add(self._handed_dead.popleft())
        self._dead_left = self._dead.close()
        with self._progress:
            self._progress.notify_all()
