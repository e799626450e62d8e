"""The host's agent: one process that sends every write-ahead log of its host to Kafka.

``rlpulse agent`` (:class:`HostAgent`) serves the logs of one user, spool root, host and
cluster (:mod:`rlpulse.producers.delivery.agent_place`): every log whose ``meta.json`` names its
key, plus logs of an earlier release whose writer is gone. It sends them with one pair of
producers (:class:`~rlpulse.producers.delivery.shipper.Producers`), each log through its
:class:`~rlpulse.producers.delivery.shipper.LogShipper`, so every record reaches its topic once
(by ``(producer id, seq)``, reading the topics back after a failure). The training processes
only append; none holds a producer.

How it learns of new frames: a writer that finds the agent asleep wakes it through a FIFO
(:class:`~rlpulse.producers.delivery.agent_place.AgentBell`); the agent looks at every log it
serves each time it wakes: at once for an event, at the end of a log's linger while it holds
log records, and when delivery reports come (a thread per producer waits for them in
librdkafka and wakes the loop: nothing spins while messages wait for Kafka). Asleep, it
looks every ``agent.look_interval_s`` (a wake lost to a race costs that much) and lists the
spool every ``agent.rescan_s`` for logs no writer told it of.

A writer's log is served while the writer lives (its ``flock`` on ``lock``) and after: the
agent checks every ``agent.check_interval_s`` which writers are gone, sends what their logs
still hold and deletes each once every frame arrived. So a killed rank's last records reach
Kafka without a successor. A log of a newer protocol, or frames of a kind this release does
not know, are left in place.

It exits after ``agent.idle_exit_s`` with no live writer and nothing unsent (while Kafka is
out of reach it keeps what it could not send and keeps trying), and on SIGTERM or SIGINT
after sending for at most ``agent.stop_timeout_s`` (what is left waits in the logs for the
next agent or ``rlpulse spool send``).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import select
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from confluent_kafka import Consumer, KafkaError, KafkaException

from rlpulse.producers.delivery.agent_place import (
    AGENTS_DIR,
    AWAKE,
    LINGERING,
    SLEEPING,
    AgentPlace,
    read_json,
    write_json,
)
from rlpulse.producers.delivery.clock import ClockOffset
from rlpulse.producers.delivery.shipper import LogShipper, Producers
from rlpulse.producers.delivery.stacks import StackTaker
from rlpulse.producers.delivery.wal import (
    LOCK_NAME,
    PROTOCOL,
    SHIP_LOCK_NAME,
    LogMeta,
    WalClaim,
    claim_held,
    logs_in,
    path_name,
)
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.transport.clients import ClientDiagnostics, new_consumer, trainer_producer
from rlpulse.transport.roles import control_group_prefix
from rlpulse.transport.topics import missing_topic, topic_exists

__all__ = ["AGENT_VERSION", "HostAgent", "Served"]

log = logging.getLogger(__name__)

AGENT_VERSION: Final = 1
"""The version of this agent's ``agent.json`` and ``status.json``."""
STATUS_EVERY_S: Final = 2.0
"""How often the agent looks for trouble to report (``status.json`` is written on a change)."""
STATUS_WRITE_S: Final = 30.0
"""How often ``status.json`` is written even when nothing changed (its ``updated_ns``)."""
GATHER_S: Final = 0.002
"""After a wake, how long the agent lets the burst it belongs to gather (the ranks of a step
log within milliseconds, delivery reports come in bunches): one look serves them all.
librdkafka holds a message ``producer.linger_ms`` (5 ms) anyway."""
_LOCK_TRIES_S: Final = 1.0
FINISHED_KEPT: Final = 4096
"""Logs sent whole and deleted that a stack capture still reports (their process is gone)."""


@dataclass
class Served:
    """A log the agent sends, and whether its writer is still alive."""

    shipper: LogShipper
    writer_alive: bool = True

    @property
    def meta(self) -> LogMeta:
        """The log's ``meta.json``."""
        return self.shipper.meta


@dataclass
class _Passed:
    """Logs the agent looked at and will not serve, and why (each said once)."""

    reasons: dict[Path, str] = field(default_factory=dict)


class HostAgent:
    """Sends every write-ahead log of its place (see the module docstring).

    Build it in the process that runs it; :meth:`run` takes the agent's lock and loops until
    it is idle or stopped. :meth:`stop` (any thread, a signal handler) makes it drain.
    """

    def __init__(self, settings: Settings, place: AgentPlace) -> None:
        self.settings = settings
        self.place = place
        self.served: dict[Path, Served] = {}
        self.clock = ClockOffset()
        self.problem: str | None = None
        """The trouble the agent has now, in one sentence (None: none)."""
        self.started_ns = time.time_ns()
        self._passed = _Passed()
        self._stop = threading.Event()
        self._producers: Producers | None = None
        self._diagnostics = ClientDiagnostics(f"agent of {place.host}", settings)
        self._read_back_diagnostics = ClientDiagnostics(f"read-back of {place.host}", settings)
        self._claim: WalClaim | None = None
        self._stacks: StackTaker | None = None
        self._finished: deque[LogMeta] = deque(maxlen=FINISHED_KEPT)
        self._ear: int | None = None
        self._reports_r: int | None = None
        self._reports_w: int | None = None
        self._state: mmap.mmap | None = None
        self._status_logs: set[Path] = set()
        self._status_at = -STATUS_WRITE_S
        self._pending_lines = b""
        agent = settings.agent
        self._linger_s = settings.producer.batch_linger_ms / 1000
        self._idle_exit_s = agent.idle_exit_s
        self._check_s = agent.check_interval_s
        self._look_s = agent.look_interval_s
        self._rescan_s = agent.rescan_s

    # -- lifetime -----------------------------------------------------------------------

    def take_place(self) -> int | None:
        """Take the agent's lock; None when done, else the pid of the agent that holds it.

        A checker's shared lock is held for an instant: the lock is tried for a second.
        """
        self.place.make()
        deadline = time.monotonic() + _LOCK_TRIES_S
        while True:
            claim = WalClaim.take(self.place.directory, self.place.lock.name)
            if claim is not None:
                self._claim = claim
                return None
            if time.monotonic() >= deadline:
                holder = (read_json(self.place.info) or {}).get("pid")
                return holder if isinstance(holder, int) else -1
            time.sleep(0.05)

    def check_clients(self) -> None:
        """Build a producer once and drop it: a setting librdkafka refuses raises here.

        It raises ``ClientConfigError`` in the process that starts the agent, which says so
        to the rank, not in the detached agent.
        """
        producer = trainer_producer(self.settings, f"agent of {self.place.host} (check)")
        del producer  # destroyed now: its threads end before the agent is forked

    def stop(self) -> None:
        """Drain and exit (SIGTERM, SIGINT): send for at most ``agent.stop_timeout_s``."""
        self._stop.set()
        if self._ear is not None:
            with contextlib.suppress(OSError):
                fd = os.open(self.place.wake, os.O_WRONLY | os.O_NONBLOCK)
                os.write(fd, b"\n")
                os.close(fd)

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the agent (it drains first); SIGHUP is ignored."""
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, lambda _signum, _frame: self.stop())
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def run(self) -> int:
        """Serve until idle or stopped; returns the process's exit status (0)."""
        if self._claim is None:
            holder = self.take_place()
            if holder is not None:
                log.info("an agent (pid %s) already serves %s", holder, self.place.directory)
                return 0
        self._open_ear()
        write_json(
            self.place.info,
            {
                "v": AGENT_VERSION,
                "pid": os.getpid(),
                "started_ns": self.started_ns,
                "protocol": PROTOCOL,
                **self.place.describe(),
            },
        )
        log.info(
            "agent %d serves %s on %s for %s (prefix %s), protocol %d",
            os.getpid(),
            self.place.spool_root,
            self.place.host,
            self.place.bootstrap,
            self.place.prefix,
            PROTOCOL,
        )
        self._connect()
        try:
            self._loop()
        finally:
            self._leave()
        return 0

    def _connect(self) -> None:
        """Connect both producers before the first message (Kafka down: 2 s more at start).

        The first deliveries' round trips then measure the clock, not the connection.
        """
        producers = self._producers_now()
        for producer in (producers.events, producers.logs):
            with contextlib.suppress(KafkaException):
                producer.list_topics(f"{self.place.prefix}.events", timeout=1.0)
        if self.settings.agent.stacks_signal.strip().lower() == "off":
            return  # no stacks from outside: no control topic to read
        self._stacks = StackTaker(
            host=self.place.host,
            control_topic=Topics(prefix=self.place.prefix).control,
            codec=default_codec(),
            signing_key=self.settings.security.signing_key(),
            logs=self._known_logs,
            new_consumer=self._control_consumer,
            producer=lambda: producers.logs,
        )
        self._stacks.start()

    def _known_logs(self) -> list[LogMeta]:
        """The logs served now and those finished lately (another thread asks: copies)."""
        while True:
            try:
                served = [each.shipper.meta for each in list(self.served.values())]
                return [*served, *list(self._finished)]
            except RuntimeError:  # changed while copied
                continue

    def _control_consumer(self) -> Consumer:
        group = f"{control_group_prefix(self.settings.prefix)}stacks"
        # A fetch waits for a command up to 5 s (it answers as soon as one arrives): an idle
        # agent sends a fetch every 5 s, not every 0.5 s; hundreds of agents share a broker.
        idle_fetch = {"fetch.wait.max.ms": 5000}
        return new_consumer(self.settings, group, f"stacks of {self.place.host}", idle_fetch)

    # -- the loop -----------------------------------------------------------------------

    def _loop(self) -> None:
        now = time.monotonic()
        next_scan = next_check = next_status = now
        last_busy = now
        stop_by: float | None = None
        while True:
            now = time.monotonic()
            if now >= next_scan:
                self._discover()
                next_scan = now + self._rescan_s
            if now >= next_check:
                self._check_writers()
                next_check = now + self._check_s
            stopping = self._stop.is_set()
            if stopping and stop_by is None:
                stop_by = now + self.settings.agent.stop_timeout_s
                log.info("stopping: sending what is left for up to %g s", stop_by - now)
            self._step(now, flush=stopping)
            self._finish_done()
            if now >= next_status:
                self._report()
                next_status = now + STATUS_EVERY_S
            if self._busy():
                last_busy = now
            if stop_by is not None:
                if self._drained() or now >= stop_by:
                    return
            elif self._idle_exit_s and now - last_busy >= self._idle_exit_s:
                self._discover()
                if not self._busy():
                    log.info("idle for %g s: no live writer, nothing unsent", self._idle_exit_s)
                    return
                last_busy = now
            self._sleep(now, min(next_scan, next_check, next_status))

    def _sleep(self, now: float, next_task: float) -> None:
        """Sleep until a wake (a writer's, a delivery report's), the next due linger or task."""
        assert self._state is not None
        due = min(
            (at for served in self.served.values() if (at := served.shipper.due_at) is not None),
            default=None,
        )
        mode = SLEEPING if due is None else LINGERING
        self._state[0] = mode
        if self._step(time.monotonic(), flush=False):  # frames appended before the byte was set
            self._state[0] = AWAKE
            return
        if mode == SLEEPING:
            due = min(
                (at for s in self.served.values() if (at := s.shipper.due_at) is not None),
                default=None,
            )
            if due is not None:
                self._state[0] = LINGERING
        until = min(next_task, now + self._look_s if due is None else due)
        self._wait(max(0.0, until - time.monotonic()))
        self._state[0] = AWAKE

    def _step(self, now: float, flush: bool) -> bool:
        """Let every log settle what arrived and send; True if anything was produced."""
        producers = self._producers_now()
        sent = False
        for served in self.served.values():
            try:
                sent = served.shipper.step(producers, now, flush) or sent
            except Exception:  # one log's trouble must not stop the others
                log.exception("%s: sending failed; trying again", served.meta.directory)
        return sent

    def _busy(self) -> bool:
        """Whether the agent serves a log: a live writer's, or one with frames left to send.

        A log whose writer is gone is deleted once every frame arrived, and one it cannot
        read further is let go (:meth:`_finish_done`): what stays is unsent.
        """
        return bool(self.served)

    def _drained(self) -> bool:
        return all(
            served.shipper.delivered_all or served.shipper.stuck for served in self.served.values()
        )

    # -- the logs -----------------------------------------------------------------------

    def _discover(self, paths: list[Path] | None = None) -> None:
        """Serve the logs under the spool root (or ``paths``) that are this agent's."""
        for path in self._logs_of_this_host() if paths is None else paths:
            if path in self.served or path in self._passed.reasons:
                continue
            self._consider(path)

    def _logs_of_this_host(self) -> Iterator[Path]:
        host = path_name(self.place.host)
        try:
            runs = [entry.path for entry in os.scandir(self.place.spool_root) if entry.is_dir()]
        except OSError:
            return
        for run in runs:
            if Path(run).name == AGENTS_DIR:
                continue
            yield from logs_in(Path(run) / host)

    def _consider(self, path: Path) -> None:
        meta = LogMeta.read(path)
        if meta is None:
            return  # a writer that has not written it yet, or not a log: looked at again later
        why = self._not_ours(meta)
        if why is not None:
            self._pass(path, why)
            return
        if meta.agent is None and claim_held(path, LOCK_NAME):
            return  # an earlier release's process, alive, sends its log itself
        claim = WalClaim.take(path, SHIP_LOCK_NAME)
        if claim is None:
            return  # another sender (``rlpulse spool send``) has it now: looked at again later
        shipper = LogShipper(
            meta,
            claim,
            batch_max_bytes=self.settings.logging.batch_max_bytes,
            linger_s=self._linger_s,
            clock=self.clock,
        )
        alive = claim_held(path, LOCK_NAME) is True
        self.served[path] = Served(shipper, alive)
        log.info(
            "serving %s (run %s, producer %s, writer %s)",
            path,
            meta.run_id,
            meta.producer_id,
            f"pid {meta.pid} alive" if alive else "gone",
        )

    def _not_ours(self, meta: LogMeta) -> str | None:
        """Why this agent leaves the log alone; None if it is this agent's to send."""
        if meta.host is not None and meta.host != self.place.host:
            return f"written on {meta.host}"
        if meta.protocol > PROTOCOL:
            return (
                f"protocol {meta.protocol}, newer than this agent's {PROTOCOL}: left for a "
                "newer rlpulse"
            )
        if meta.agent is not None and meta.agent != self.place.key:
            return f"served by agent {meta.agent}"
        topics = (f"{self.place.prefix}.events", f"{self.place.prefix}.logs")
        if meta.agent is None and (meta.events_topic, meta.logs_topic) != topics:
            return f"for {meta.events_topic}, not this agent's prefix"
        return None

    def _pass(self, path: Path, why: str) -> None:
        self._passed.reasons[path] = why
        level = logging.WARNING if why.startswith("protocol") else logging.DEBUG
        log.log(level, "leaving %s alone: %s", path, why)

    def _check_writers(self, paths: list[Path] | None = None) -> None:
        """Note the writers that are gone (of ``paths``, or of every log served)."""
        for path in self.served if paths is None else paths:
            served = self.served.get(path)
            if served is not None and served.writer_alive and not claim_held(path, LOCK_NAME):
                served.writer_alive = False
                log.info("writer of %s (pid %s) is gone", path, served.meta.pid)

    def _finish_done(self) -> None:
        """Delete each log whose writer is gone and whose every frame arrived."""
        for path, served in list(self.served.items()):
            if served.writer_alive:
                continue
            shipper = served.shipper
            if shipper.delivered_all:
                state = shipper.state
                shipper.close(delete=True)
                del self.served[path]
                self._finished.append(shipper.meta)  # a capture still names its process
                log.info(
                    "sent %s whole (%d record(s); %d found on the topics already); deleted",
                    path,
                    state.delivered + state.resent,
                    state.found,
                )
            elif shipper.stuck:
                shipper.close(delete=False)
                del self.served[path]
                self._passed.reasons[path] = f"frame kind {shipper.unknown_kind} unknown"

    # -- Kafka --------------------------------------------------------------------------

    def _producers_now(self) -> Producers:
        if self._producers is None:
            label = f"agent of {self.place.host}"
            self._producers = Producers(
                trainer_producer(self.settings, f"{label} (events)", self._diagnostics),
                trainer_producer(self.settings, f"{label} (logs)", self._diagnostics),
                self._read_back_consumer,
            )
            self._producers.report_in_background(self._reports_arrived)
        return self._producers

    def _read_back_consumer(self) -> Consumer:
        group = f"{control_group_prefix(self.settings.prefix)}readback"
        return new_consumer(
            self.settings,
            group,
            f"read-back of {self.place.host}",
            diagnostics=self._read_back_diagnostics,
        )

    def _report(self) -> None:
        """Say a new trouble once (and its end), and write ``status.json``."""
        failing = next((served for served in self.served.values() if served.shipper.failing), None)
        problem = None
        if failing is not None:
            shipper = failing.shipper
            why = shipper.last_error or "delivery failed"
            if shipper.last_code == KafkaError._MSG_TIMED_OUT and self._producers is not None:
                topic = shipper.meta.events_topic
                if topic_exists(self._producers.events, topic, 0.5) is False:
                    why = missing_topic(topic)
            cause = self._diagnostics.cause()
            problem = f"records cannot be delivered: {why}" + (f" ({cause})" if cause else "")
        changed = problem != self.problem
        if changed:
            if problem is not None:
                log.warning("%s; they wait in the write-ahead logs", problem)
            elif self.problem is not None:
                log.info("Kafka takes records again; sending what waited")
            self.problem = problem
        served = set(self.served)
        now = time.monotonic()
        if changed or served != self._status_logs or now - self._status_at >= STATUS_WRITE_S:
            write_json(self.place.status, self.status())
            self._status_logs, self._status_at = served, now

    def status(self) -> dict[str, object]:
        """What the agent serves now (``status.json``)."""
        return {
            "v": AGENT_VERSION,
            "pid": os.getpid(),
            "updated_ns": time.time_ns(),
            "problem": self.problem,
            "clock_offset_ns": self.clock.offset_ns,
            "clock_error_ns": self.clock.error_ns,
            "logs": [
                {
                    "path": str(path),
                    "run_id": served.meta.run_id,
                    "producer_id": served.meta.producer_id,
                    "writer_alive": served.writer_alive,
                    "frames_done": served.shipper.state.frames,
                    "failing": served.shipper.failing,
                }
                for path, served in self.served.items()
            ],
        }

    # -- the wake -----------------------------------------------------------------------

    def _reports_arrived(self) -> None:
        """A report thread served delivery reports: wake the loop to settle them."""
        if self._reports_w is not None:
            with contextlib.suppress(BlockingIOError):
                os.write(self._reports_w, b"\n")

    def _open_ear(self) -> None:
        self._reports_r, self._reports_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._ear = os.open(self.place.wake, os.O_RDWR | os.O_NONBLOCK)
        descriptor = os.open(self.place.state, os.O_RDWR)
        try:
            self._state = mmap.mmap(descriptor, 64)
        finally:
            os.close(descriptor)
        self._state[0] = AWAKE

    def _wait(self, timeout_s: float) -> None:
        """Wait for a wake (or ``timeout_s``); take the logs new writers announced."""
        assert self._ear is not None and self._reports_r is not None
        if timeout_s > 0:
            ready, _, _ = select.select([self._ear, self._reports_r], [], [], timeout_s)
            if ready and self._state is not None:
                self._state[0] = AWAKE  # the burst's other records need not wake it again
                time.sleep(GATHER_S)
        with contextlib.suppress(BlockingIOError):
            os.read(self._reports_r, 65536)
        chunks = [self._pending_lines]
        while True:
            try:
                chunk = os.read(self._ear, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        data = b"".join(chunks)
        lines = data.split(b"\n")
        self._pending_lines = lines.pop()
        announced = [Path(os.fsdecode(line[1:])) for line in lines if line.startswith(b"+")]
        if announced:
            self._discover(announced)
        closed = [Path(os.fsdecode(line[1:])) for line in lines if line.startswith(b"-")]
        if closed:
            self._check_writers(closed)

    def _leave(self) -> None:
        """Release every log (what was not sent stays), then the agent's lock."""
        if self._stacks is not None:
            self._stacks.stop()
            self._stacks = None
        if self._producers is not None:
            self._producers.purge()
            self._producers.close()
        kept = 0
        for served in self.served.values():
            served.shipper.settle()
            if not served.writer_alive and served.shipper.delivered_all:
                served.shipper.close(delete=True)
                continue
            if not served.shipper.delivered_all:
                kept += 1
            served.shipper.close(delete=False)
        if kept:
            log.warning(
                "%d log(s) still hold records Kafka has not acknowledged; the next agent on "
                "this host, or `rlpulse spool send`, sends them",
                kept,
            )
        self.served.clear()
        self._report_final()
        for descriptor in (self._ear, self._reports_r, self._reports_w):
            if descriptor is not None:
                os.close(descriptor)
        self._ear = self._reports_r = self._reports_w = None
        if self._claim is not None:
            self._claim.release()
            self._claim = None
        log.info("agent %d exits", os.getpid())

    def _report_final(self) -> None:
        with contextlib.suppress(OSError):
            write_json(self.place.status, {**self.status(), "exited_ns": time.time_ns()})
