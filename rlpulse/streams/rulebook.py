"""The rule set a worker evaluates, and the two ways a new version reaches it.

A :class:`RuleBook` holds the current :class:`~rlpulse.rules.evaluator.RuleEngine`
and swaps it in one assignment when a new, valid rules text arrives. The engine
keeps every rule's state under that rule's version, so a swap keeps the windows,
counts and cooldowns of the rules whose definition did not change and starts the
changed ones afresh. A text that is not valid UTF-8, larger than
``worker.rules_max_bytes`` or not a valid rules file is refused: the running rules stay,
the refusal is logged with every problem, and counted by its reason (:data:`REFUSALS`).

New texts come from the compacted rules topic (:class:`RulesTopicFollower`, the way
every worker of a deployment gets the same rules) or, for a single local worker
started with ``--rules FILE``, from that file when it changes or on SIGHUP
(:class:`RulesFileWatcher`); :func:`rule_book` picks one for the ``rules`` setting.

The follower reads the topic with its own confluent-kafka consumer rather than a faust
agent: every worker must read the whole topic from its start (outside the consumer group
that splits the runs), and before the worker joins that group, so that the first summary
is already judged by the published rules.
"""

from __future__ import annotations

import hashlib
import logging
import signal
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from rlpulse.rules.evaluator import RuleEngine
from rlpulse.rules.exceptions import RulesFileError
from rlpulse.rules.loader import load_preset, load_rules_source, parse_rules
from rlpulse.rules.model import RuleSet
from rlpulse.schemas.topics import RULES_KEY, Topics
from rlpulse.settings import Settings
from rlpulse.transport.clients import new_consumer
from rlpulse.transport.exceptions import TransportError
from rlpulse.transport.readiness import Deadline, retry_until
from rlpulse.transport.roles import rules_group_prefix

__all__ = [
    "REFUSALS",
    "RULES_FROM_TOPIC",
    "RuleBook",
    "RulesFileWatcher",
    "RulesTopicFollower",
    "rule_book",
]

log = logging.getLogger(__name__)

RULES_FROM_TOPIC = "topic"
"""The ``rules`` setting that means: follow the rules topic."""

Counter = Callable[[str], None]

INVALID, TOO_LARGE, NOT_UTF8, UNREADABLE = "invalid", "too_large", "not_utf8", "unreadable"
REFUSALS = (INVALID, TOO_LARGE, NOT_UTF8, UNREADABLE)
"""Why a rules text is refused: it does not validate, is too large, is not UTF-8 text, or
(a rules file) cannot be read."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class RuleBook:
    """The current rule engine of a worker; replaced atomically by :meth:`offer`.

    ``on_outcome`` is told ``loaded`` or ``refused`` for every text offered, ``on_refusal``
    the reason of each refusal (one of :data:`REFUSALS`).
    """

    def __init__(
        self,
        ruleset: RuleSet,
        origin: str,
        on_outcome: Counter | None = None,
        *,
        max_bytes: int | None = None,
        on_refusal: Counter | None = None,
    ) -> None:
        self._engine = RuleEngine(ruleset)
        self.origin = origin
        self.max_bytes = max_bytes
        self._digest: str | None = None
        self.on_outcome: Counter = on_outcome or (lambda _outcome: None)
        self.on_refusal: Counter = on_refusal or (lambda _reason: None)
        self._lock = threading.Lock()

    @property
    def engine(self) -> RuleEngine:
        """The engine to evaluate the next summary with."""
        return self._engine

    def offer_bytes(self, data: bytes, origin: str) -> bool:
        """:meth:`offer` the UTF-8 text ``data``, refusing it if it is too large or not UTF-8."""
        if self.max_bytes is not None and len(data) > self.max_bytes:
            self.refuse(
                origin,
                f"{len(data)} bytes or more, larger than worker.rules_max_bytes ({self.max_bytes})",
                TOO_LARGE,
            )
            return False
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.refuse(origin, f"not UTF-8 text: {exc}", NOT_UTF8)
            return False
        return self.offer(text, origin)

    def offer(self, text: str, origin: str) -> bool:
        """Validate ``text`` and, if it is valid and new, make it the current rule set.

        Returns whether the rules changed. Never raises for a bad text.
        """
        digest = _digest(text)
        with self._lock:
            if digest == self._digest:
                return False
            if self.max_bytes is not None and len(text.encode()) > self.max_bytes:
                self.refuse(
                    origin, f"larger than worker.rules_max_bytes ({self.max_bytes})", TOO_LARGE
                )
                return False
            try:
                ruleset = parse_rules(text, origin)
            except RulesFileError as exc:
                self.refuse(origin, str(exc))
                return False
            old = {rule.id: rule.version for rule in self._engine.rules}
            self._engine = RuleEngine(ruleset)
            self._digest, self.origin = digest, origin
        changed = sorted(r.id for r in ruleset.rules if old.get(r.id) != r.version)
        log.warning(
            "rules from %s now in force: %d rules, changed or new: %s",
            origin,
            len(ruleset.rules),
            ", ".join(changed) or "none",
        )
        self.on_outcome("loaded")
        return True

    def refuse(self, origin: str, reason: str, kind: str = INVALID) -> None:
        """Log and count (as ``kind``) a rules text that could not be used; the rules stay."""
        log.error("refused rules from %s (%s); keeping %s:\n%s", origin, kind, self.origin, reason)
        self.on_outcome("refused")
        self.on_refusal(kind)


class RulesFileWatcher:
    """Reloads a rules file into a :class:`RuleBook` when it changes, and on SIGHUP."""

    def __init__(self, book: RuleBook, path: Path, interval_s: float = 1.0) -> None:
        self.book = book
        self.path = path
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._seen: tuple[int, int] | None = self._stamp()
        self._thread = threading.Thread(target=self._run, name="rules-file", daemon=True)

    def start(self, handle_sighup: bool = True) -> None:
        """Start polling; with ``handle_sighup``, SIGHUP forces a reload (main thread only)."""
        if handle_sighup:
            signal.signal(signal.SIGHUP, lambda _sig, _frame: self._wake.set())
        self._thread.start()

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()
        self._wake.set()

    def _stamp(self) -> tuple[int, int] | None:
        try:
            stat = self.path.stat()
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def _run(self) -> None:
        while not self._stop.is_set():
            forced = self._wake.wait(self.interval_s)
            self._wake.clear()
            stamp = self._stamp()
            if stamp is None or (stamp == self._seen and not forced):
                continue
            self._seen = stamp
            limit = self.book.max_bytes
            try:
                with self.path.open("rb") as file:
                    data = file.read() if limit is None else file.read(limit + 1)
            except OSError as exc:
                self.book.refuse(str(self.path), f"cannot read it: {exc}", UNREADABLE)
                continue
            self.book.offer_bytes(data, str(self.path))


class RulesTopicFollower:
    """Feeds every rules text published on the rules topic into a :class:`RuleBook`.

    Every worker reads the whole (single-partition, compacted) topic itself, outside
    any consumer group, so each one ends at the same, latest rule set.
    """

    def __init__(self, book: RuleBook, settings: Settings) -> None:
        self.book = book
        self.settings = settings
        self.topic = Topics(settings.prefix).rules
        self._consumer = new_consumer(
            settings, rules_group_prefix(settings.prefix) + uuid.uuid4().hex, "rules topic follower"
        )
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._end_offset = 0
        self._thread = threading.Thread(target=self._run, name="rules-topic", daemon=True)

    def start(self, deadline: Deadline | None = None) -> None:
        """Start following the topic from its beginning.

        Finding the topic's end retries until ``deadline`` (default 30 s) while the broker
        is still electing the topic's leader; each try asks a new client, so a leader that
        moved (a broker died) is looked up afresh rather than read from a stale cache.
        """

        def end_offset() -> int:
            probe = new_consumer(
                self.settings,
                rules_group_prefix(self.settings.prefix) + uuid.uuid4().hex,
                "rules topic probe",
            )
            try:
                _low, high = probe.get_watermark_offsets(
                    TopicPartition(self.topic, 0), timeout=5, cached=False
                )
            except KafkaException as exc:
                raise TransportError(f"{self.topic}: {exc}") from exc
            finally:
                probe.close()
            return int(high)

        self._end_offset = retry_until(
            deadline or Deadline(30.0), end_offset, f"the end of {self.topic}", log.warning
        )
        if self._end_offset == 0:
            self._caught_up.set()
        self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        self._thread.start()

    def _take(self, key: bytes | None, value: bytes | None, origin: str) -> None:
        if key != RULES_KEY or value is None:
            return
        self.book.offer_bytes(value, origin)

    def wait_caught_up(self, timeout_s: float) -> bool:
        """Block until what the topic held at start has been read (or ``timeout_s`` passed)."""
        return self._caught_up.wait(timeout_s)

    def stop(self) -> None:
        """Stop following and close the consumer."""
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                message = self._consumer.poll(0.5)
                if message is None or message.error() is not None:
                    continue
                offset = message.offset() or 0
                self._take(message.key(), message.value(), f"{self.topic}@{offset}")
                if offset + 1 >= self._end_offset:
                    self._caught_up.set()
        finally:
            self._consumer.close()


def rule_book(settings: Settings) -> tuple[RuleBook, Callable[[Deadline], None]]:
    """The worker's rule book for the ``worker.rules`` setting, and how to start following it.

    ``topic``: the rules published on ``<prefix>.rules`` (the seed preset until one is);
    a file: that file, reloaded when it changes and on SIGHUP; else a preset name. Raises
    :class:`~rlpulse.rules.exceptions.RulesError` for a file or preset that does not load.
    """
    source = settings.worker.rules
    limit = settings.worker.rules_max_bytes
    if source == RULES_FROM_TOPIC:
        book = RuleBook(
            load_preset("seed"), "<preset seed, until rules are published>", max_bytes=limit
        )
        follower = RulesTopicFollower(book, settings)

        def follow_topic(deadline: Deadline) -> None:
            follower.start(deadline)
            if not follower.wait_caught_up(timeout_s=max(1.0, min(15.0, deadline.left()))):
                log.warning(
                    "rules topic not read to its end in 15 s; starting with %s", book.origin
                )

        return book, follow_topic
    book = RuleBook(load_rules_source(source), source, max_bytes=limit)
    path = Path(source)
    if not path.exists():
        return book, lambda _deadline: None
    watcher = RulesFileWatcher(book, path)
    return book, lambda _deadline: watcher.start()
