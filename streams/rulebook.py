"""The rule set a worker evaluates, and the two ways a new version reaches it.

A :class:`RuleBook` holds the current :class:`~rlpulse.rules.evaluator.RuleEngine`
and swaps it in one assignment when a new, valid rules text arrives. The engine
keeps every rule's state under that rule's version, so a swap keeps the windows,
counts and cooldowns of the rules whose definition did not change and starts the
changed ones afresh. An invalid text is refused: the running rules stay, the
refusal is logged with every problem, and counted.

New texts come from the compacted rules topic (:class:`RulesTopicFollower`, the way
every worker of a deployment gets the same rules) or, for a single local worker
started with ``--rules FILE``, from that file when it changes or on SIGHUP
(:class:`RulesFileWatcher`).
"""

from __future__ import annotations

import hashlib
import logging
import signal
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from rlpulse.rules.evaluator import RuleEngine
from rlpulse.rules.exceptions import RulesFileError
from rlpulse.rules.loader import parse_rules
from rlpulse.rules.model import RuleSet

log = logging.getLogger(__name__)

RULES_KEY = b"rules"
"""Key of the one rule set per deployment on the compacted rules topic."""

Counter = Callable[[str], None]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class RuleBook:
    """The current rule engine of a worker; replaced atomically by :meth:`offer`."""

    def __init__(self, ruleset: RuleSet, origin: str, on_outcome: Counter | None = None) -> None:
        self._engine = RuleEngine(ruleset)
        self.origin = origin
        self._digest: str | None = None
        self.on_outcome: Counter = on_outcome or (lambda _outcome: None)
        self._lock = threading.Lock()

    @property
    def engine(self) -> RuleEngine:
        """The engine to evaluate the next summary with."""
        return self._engine

    def offer(self, text: str, origin: str) -> bool:
        """Validate ``text`` and, if it is valid and new, make it the current rule set.

        Returns whether the rules changed. Never raises for a bad text.
        """
        digest = _digest(text)
        with self._lock:
            if digest == self._digest:
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

    def refuse(self, origin: str, reason: str) -> None:
        """Log and count a rules text that could not be used; the current rules stay."""
        log.error("refused rules from %s; keeping %s:\n%s", origin, self.origin, reason)
        self.on_outcome("refused")


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
            try:
                text = self.path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                self.book.refuse(str(self.path), f"cannot read it: {exc}")
                continue
            self.book.offer(text, str(self.path))


class RulesTopicFollower:
    """Feeds every rules text published on the rules topic into a :class:`RuleBook`.

    Every worker reads the whole (single-partition, compacted) topic itself, outside
    any consumer group, so each one ends at the same, latest rule set.
    """

    def __init__(self, book: RuleBook, bootstrap: str, topic: str) -> None:
        self.book = book
        self.topic = topic
        config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": f"rlpulse-rules-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "logger": logging.getLogger("rlpulse.librdkafka"),
        }
        self._consumer = Consumer(config)
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._end_offset = 0
        self._thread = threading.Thread(target=self._run, name="rules-topic", daemon=True)

    def start(self) -> None:
        """Start following the topic from its beginning."""
        _low, self._end_offset = self._consumer.get_watermark_offsets(
            TopicPartition(self.topic, 0), timeout=10
        )
        if self._end_offset == 0:
            self._caught_up.set()
        self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        self._thread.start()

    def _take(self, key: bytes | None, value: bytes | None, origin: str) -> None:
        if key != RULES_KEY or value is None:
            return
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            self.book.refuse(origin, "not UTF-8 text")
            return
        self.book.offer(text, origin)

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
