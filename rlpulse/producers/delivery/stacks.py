"""The host agent's part of ``capture_stacks``: signal the run's rank processes, ship their stacks.

A :class:`StackTaker` thread of the agent reads the control topic (from its end when the
agent starts; the partitions of every run it serves) and acts on each ``capture_stacks``
command for a run it serves, once per command id; where signing is on, only on a command
signed with the key. For each rank process of the run on this host (the processes that wrote
the logs the agent serves or served) it:

- asks the process once, whatever its number of ranks (:mod:`rlpulse.producers.caller.stacks`):
  a byte on its FIFO, which a thread of the process answers under the GIL; where that thread
  has not answered within half the action's ``wait_s`` (a thread stuck in C holds the GIL), or
  the process has no FIFO, the signal it registered (its ``meta.json`` says which) has
  ``faulthandler`` write the stacks. It waits until the process's stack file has grown and
  stopped growing, at most ``wait_s``;
- ships one log record per rank to the logs topic (:mod:`rlpulse.schemas.stacks`): the dump with the
  thread that made the rank's logger (its training loop) first, the rank's last step (its
  newest event in the write-ahead log), the host and pid, the command id and an ``outcome``:
  ``stacks`` (with ``via``: ``thread`` or ``signal``); ``gone`` (the process no longer exists,
  or its pid now names a process that started after the rank's logs were made: that one is
  never signalled; a record at ERROR); ``silent`` (alive, but no dump within ``wait_s``);
  ``unregistered`` (it registered no signal).

All processes are signalled first, then waited for together: a capture costs one ``wait_s``
at most, however many processes are silent.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from confluent_kafka import OFFSET_END, Consumer, KafkaException, Producer, TopicPartition

from rlpulse.producers.delivery.wal import EVENT, LogMeta, WalReader, position, segments
from rlpulse.schemas.codec import Codec
from rlpulse.schemas.exceptions import DecodeError
from rlpulse.schemas.records import ControlCommand, LogBatch, LogEntry
from rlpulse.schemas.signing import signature_problem
from rlpulse.schemas.stacks import STACKS_LOGGER, parse_dump, render, request_path
from rlpulse.transport.bootstrap import pid_alive, process_started_ns

__all__ = ["RankProcess", "StackTaker", "processes_of", "stack_records", "take_stacks"]

log = logging.getLogger(__name__)

DEFAULT_WAIT_S: Final = 10.0
_SETTLE_S: Final = 0.1  # a dump is whole once its file stopped growing for this long
_LOOK_S: Final = 0.02
_POLL_S: Final = 1.0
_KEPT_IDS: Final = 1024
_CLOCK_SLACK_NS: Final = 2_000_000_000  # a process's start time is known to about a second


@dataclass
class RankProcess:
    """One rank process of a run on this host: its pid, how it dumps, and its ranks' logs."""

    pid: int
    signum: int | None
    path: Path | None
    logs: list[LogMeta] = field(default_factory=list)
    outcome: str = "unregistered"
    text: str = ""
    via: str = ""
    """How the stacks were asked for: ``thread`` (its FIFO) or ``signal`` (faulthandler)."""
    _start: int = 0
    _signal_at: float | None = None
    _pidfd: int | None = None


def processes_of(run_id: str, logs: Iterable[LogMeta]) -> list[RankProcess]:
    """The rank processes that wrote logs of ``run_id``, one per pid, in pid order."""
    found: dict[int, RankProcess] = {}
    for meta in logs:
        if meta.run_id != run_id or meta.pid is None:
            continue
        path = None if meta.stacks_file is None else Path(meta.stacks_file)
        process = found.setdefault(meta.pid, RankProcess(meta.pid, meta.stacks_signal, path))
        if not any(known.directory == meta.directory for known in process.logs):
            process.logs.append(meta)
    return [found[pid] for pid in sorted(found)]


def take_stacks(processes: Sequence[RankProcess], wait_s: float) -> None:
    """Ask every process once, then wait (at most ``wait_s``) for all their dumps.

    A process whose thread has not answered within half of ``wait_s`` is sent its signal.
    """
    try:
        _ask_and_wait(processes, wait_s)
    finally:
        for process in processes:
            if process._pidfd is not None:
                os.close(process._pidfd)
                process._pidfd = None


def _ask_and_wait(processes: Sequence[RankProcess], wait_s: float) -> None:
    waiting: list[RankProcess] = []
    now = time.monotonic()
    for process in processes:
        process._pidfd = _pidfd(process.pid)
        if not pid_alive(process.pid) or _reused(process):
            process.outcome = "gone"
            continue
        if process.signum is None or process.path is None:
            process.outcome = "unregistered"
            continue
        process._start = _size(process.path)
        if _ask(process.path):
            process.via, process._signal_at = "thread", now + wait_s / 2
        elif not _signal(process):
            continue
        process.outcome = "silent"
        waiting.append(process)
    deadline = time.monotonic() + wait_s
    sizes = {process.pid: (process._start, time.monotonic()) for process in waiting}
    while waiting and time.monotonic() < deadline:
        time.sleep(_LOOK_S)
        for process in list(waiting):
            assert process.path is not None
            size, since = sizes[process.pid]
            now_size = _size(process.path)
            if now_size != size:
                sizes[process.pid] = (now_size, time.monotonic())
            elif size > process._start and time.monotonic() - since >= _SETTLE_S:
                process.text = _read(process.path, process._start, size)
                process.outcome = "stacks"
                waiting.remove(process)
            elif process._signal_at is not None and time.monotonic() >= process._signal_at:
                process._signal_at = None
                if not _signal(process):
                    waiting.remove(process)
    for process in waiting:
        if not pid_alive(process.pid):
            process.outcome = "gone"


def _pidfd(pid: int) -> int | None:
    """A descriptor of the process ``pid`` names now, to signal that one and no later one."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:  # gone, or no pidfd (Linux before 5.3)
        return None


def _reused(process: RankProcess) -> bool:
    """Whether the pid names a process started after the rank's logs were made: not the rank.

    Pids wrap (at 32,768 on a default Linux), so a rank that died long ago may share its number
    with a live process; that one must not get the signal, whose default action ends it.
    """
    started = process_started_ns(process.pid)
    made = min((meta.created_ns for meta in process.logs), default=None)
    return started is not None and made is not None and started > made + _CLOCK_SLACK_NS


def _ask(stacks_file: Path) -> bool:
    """Write the request byte to the process's FIFO; False where none listens there."""
    try:
        fd = os.open(request_path(stacks_file), os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no FIFO (a rank of an older release), no reader, not ours
        return False
    try:
        os.write(fd, b"s")
        return True
    except OSError as exc:  # full: requests wait there already
        return exc.errno == errno.EAGAIN
    finally:
        os.close(fd)


def _signal(process: RankProcess) -> bool:
    """Send the process its registered signal; False (outcome said) where it cannot be."""
    assert process.signum is not None
    process.via = "signal"
    try:
        if process._pidfd is not None:
            signal.pidfd_send_signal(process._pidfd, process.signum)
        else:
            os.kill(process.pid, process.signum)
    except ProcessLookupError:
        process.outcome = "gone"
        return False
    except PermissionError:
        process.outcome, process.text = "refused", "the agent may not signal this process"
        return False
    return True


def last_step(meta: LogMeta, codec: Codec) -> int:
    """The step of the newest event in the log's newest segment (-1: none there).

    Only that event is decoded: a rank's steps only grow, and a capture over a host's ranks
    must not decode every event of their logs while the host is busy.
    """
    newest = max(segments(meta.directory), default=None)
    if newest is None:
        return -1
    reader = WalReader(meta.directory, meta.protocol)
    payload: bytes | None = None
    try:
        for frame in reader.frames(position(newest, 0)):
            if frame.kind == EVENT:
                payload = frame.payload
    except (OSError, ValueError):
        pass
    finally:
        reader.close()
    return -1 if payload is None else _event_step(codec, payload)


def _event_step(codec: Codec, payload: bytes) -> int:
    try:
        return int(codec.decode_event(payload)["step"])
    except DecodeError:
        return -1


def stack_records(
    process: RankProcess, command: ControlCommand, host: str, codec: Codec
) -> list[tuple[LogMeta, bytes]]:
    """One LogBatch (encoded) per rank of ``process``: its stacks, or why there are none."""
    threads = parse_dump(process.text) if process.outcome == "stacks" else []
    records = []
    for meta in process.logs:
        rank = -1 if meta.rank is None else meta.rank
        if process.outcome == "stacks":
            loop = next((t for t in threads if t.ident == meta.thread), None)
            message = render(threads, meta.thread)
            top = loop or (threads[0] if threads else None)
            level, levelno = "WARNING", 30
        else:
            message = {
                "gone": f"rank {rank} (pid {process.pid} on {host}): its process is gone",
                "silent": (
                    f"rank {rank} (pid {process.pid} on {host}): alive, but wrote no stacks in time"
                ),
                "unregistered": (
                    f"rank {rank} (pid {process.pid} on {host}): registered no stack signal "
                    "(agent.stacks_signal off, or the signal was taken)"
                ),
                "refused": f"rank {rank} (pid {process.pid} on {host}): {process.text}",
            }[process.outcome]
            top = None
            level, levelno = "ERROR", 40
        fields = {
            "command_id": command["command_id"],
            "outcome": process.outcome,
            "pid": str(process.pid),
            "host": host,
        }
        if top is not None:
            fields["top_frame"] = top.top
            fields["via"] = process.via
        entry: LogEntry = {
            "seq": 0,
            "timestamp_ns": time.time_ns(),
            "step": last_step(meta, codec),
            "stage": "stacks",
            "level": level,
            "levelno": levelno,
            "logger": STACKS_LOGGER,
            "message": message,
            "exception": None,
            "trace_id": None,
            "fields": fields,
            "sample_rate": 1.0,
            "sampled_out": {},
        }
        batch: LogBatch = {
            "run_id": meta.run_id,
            "attempt": command["attempt"] if meta.attempt is None else meta.attempt,
            "rank": rank,
            "tags": {},
            "hostname": host,
            "host_ip": "",
            "pid": process.pid,
            "producer_id": f"{meta.producer_id}/stacks/{command['command_id']}",
            "entries": [entry],
        }
        records.append((meta, codec.encode("LogBatch", batch)))
    return records


class StackTaker(threading.Thread):
    """The agent's thread that answers ``capture_stacks`` commands for the runs it serves."""

    def __init__(
        self,
        *,
        host: str,
        control_topic: str,
        codec: Codec,
        signing_key: bytes | None,
        logs: Callable[[], Sequence[LogMeta]],
        new_consumer: Callable[[], Consumer],
        producer: Callable[[], Producer],
    ) -> None:
        super().__init__(name="rlpulse-stacks", daemon=True)
        self.host = host
        self.control_topic = control_topic
        self.codec = codec
        self.signing_key = signing_key
        self._logs = logs
        self._new_consumer = new_consumer
        self._producer = producer
        self._stopping = threading.Event()
        self._done: list[str] = []
        self.captures = 0
        """Commands answered so far."""

    def stop(self) -> None:
        """End the thread (within a poll) and wait for it."""
        self._stopping.set()
        if self.is_alive():
            self.join(_POLL_S + DEFAULT_WAIT_S)

    def run(self) -> None:
        """Read the control topic until stopped; answer each capture_stacks command."""
        try:
            consumer = self._new_consumer()
        except KafkaException as exc:
            log.warning("stacks: cannot read %s: %s", self.control_topic, exc)
            return
        try:
            self._follow(consumer)
        except Exception:  # the agent ships logs without it
            log.exception("stacks: the control reader failed; capture_stacks is not answered")
        finally:
            consumer.close()

    def _follow(self, consumer: Consumer) -> None:
        partitions = None
        while partitions is None and not self._stopping.is_set():
            try:
                metadata = consumer.list_topics(self.control_topic, timeout=5.0)
                topic = metadata.topics.get(self.control_topic)
                if topic is not None and topic.error is None and topic.partitions:
                    partitions = sorted(topic.partitions)
            except KafkaException:
                pass
            if partitions is None:
                self._stopping.wait(2.0)
        if partitions is None:
            return
        consumer.assign([TopicPartition(self.control_topic, p, OFFSET_END) for p in partitions])
        while not self._stopping.is_set():
            message = consumer.poll(_POLL_S)
            if message is None or message.error() is not None:
                continue
            try:
                command = self.codec.decode_command(message.value() or b"")
            except DecodeError:
                continue
            if any(action["type"] == "capture_stacks" for action in command["actions"]):
                self.answer(command)

    def answer(self, command: ControlCommand) -> None:
        """Capture the stacks of ``command``'s run on this host, if this agent serves it."""
        if command["command_id"] in self._done or command.get("dry_run"):
            return
        logs = self._logs()
        processes = processes_of(command["run_id"], logs)
        if not processes:
            return
        if self.signing_key is not None:
            problem = signature_problem(command, self.signing_key, self.codec)
            if problem is not None:
                log.warning("stacks: command %s refused: %s", command["command_id"], problem)
                return
        self._done = [*self._done, command["command_id"]][-_KEPT_IDS:]
        wait_s = next(
            (
                float(action["params"].get("wait_s") or DEFAULT_WAIT_S)
                for action in command["actions"]
                if action["type"] == "capture_stacks"
            ),
            DEFAULT_WAIT_S,
        )
        started = time.monotonic()
        take_stacks(processes, wait_s)
        producer = self._producer()
        for process in processes:
            for meta, value in stack_records(process, command, self.host, self.codec):
                producer.produce(meta.logs_topic, value=value, key=meta.run_id.encode())
        producer.flush(30.0)
        self.captures += 1
        outcomes = [process.outcome for process in processes]
        log.info(
            "stacks of run %s for command %s: %s in %.2f s",
            command["run_id"],
            command["command_id"],
            ", ".join(f"{outcomes.count(o)} {o}" for o in sorted(set(outcomes))),
            time.monotonic() - started,
        )


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read(path: Path, start: int, end: int) -> str:
    with path.open("rb") as opened:
        opened.seek(start)
        return opened.read(end - start).decode(errors="replace")
