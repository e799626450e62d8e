"""The write-ahead log: what a producer accepted is on local disk before ``log()`` returns.

Every event and text log record that ``log()`` or the logging handler accepts is appended
here, in ``seq`` order, before the call returns; the host's agent
(:mod:`rlpulse.producers.delivery.agent`), another process, reads it back from here, sends it,
and records what Kafka acknowledged. A frame written to the memory-mapped segment is in the
operating system's page cache, so it survives the process being killed (SIGKILL, the OOM
killer) — not the machine losing power. The agent sends a dead writer's frames as it sends a
live one's, and removes the log once its writer is gone and every frame arrived.

Layout, one directory per producer under its run's directory of its host (:func:`run_wal_dir`;
the root is :func:`~rlpulse.producers.delivery.spool_root.resolve_spool_root`'s)::

    <spool root>/<run>/<host>/<producer_id>/lock flock(2)-ed by the process that writes
                                                 this log (the kernel drops it when that
                                                 process dies: the writer is gone)
                                     ship.lock   flock(2)-ed by the process that sends it
                                                 (an agent, ``rlpulse spool send``), whose
                                                 pid it holds: one sender per log
                                     meta.json   the run, the producer, the host and
                                                 process that write it, the two topics,
                                                 the agent that serves it, the protocol,
                                                 when it was made
                                     source      the bytes every LogBatch of the producer
                                                 starts with (its shared fields); in a
                                                 samples log ``source-3`` and ``source-4``,
                                                 the heads of its SampleBatches and
                                                 SampleTextBatches
                                     acked       what Kafka holds: the position up to which
                                                 every frame was delivered, per topic the
                                                 partition and offset of the last delivery,
                                                 and the counts the writer shows its caller
                                     000001.wal  segments of ``segment_bytes``, reserved on
                                                 disk when made (no SIGBUS on a full disk)

A frame is a header ``<length u32, crc32 u32, kind u8, seq i64>`` and ``length`` bytes of
payload: a TrainerEvent's single-object encoding (kind 1) or a log record's LogEntry body
(kind 2, :meth:`~rlpulse.producers.encoding.logs.LogEncoder.entry`); in a producer's samples
log, a rollout sample's SampleEntry (kind 3) or a chosen sample's SampleTextEntry body (kind
4, :mod:`rlpulse.producers.encoding.samples`). The CRC covers the kind,
the seq and the payload (protocols 1 and 2: the payload only). The payload is written first, then
the CRC, kind and seq, the length last: a frame cut by a kill, or read by another process
while it is being written (a length seen before the kind and seq were), reads as the end of
the log.
A zero length ends a segment's frames. A position is ``segment << 40 | offset``.

The protocol (:data:`PROTOCOL`, written in ``meta.json``) names the frame kinds a log may
hold. A reader of an older protocol leaves a log of a newer one alone, and stops before a
frame whose kind it does not know: it never sends past it nor deletes it
(:data:`KNOWN_KINDS`).

The log takes at most ``max_bytes`` of disk: when a new segment would pass it, the record
is not written and counted as dropped (the newest go; what is on disk stays). The sender
deletes a segment once every frame in it was delivered (never the newest one of a live
writer); the writer counts its segments again from the disk before it calls itself full.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import re
import struct
import sys
import zlib
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, NamedTuple

__all__ = [
    "BATCHED_KINDS",
    "EVENT",
    "EVENTS_PROTOCOL",
    "KNOWN_KINDS",
    "LOG",
    "PROTOCOL",
    "SAMPLE",
    "SAMPLE_TEXT",
    "SHIP_LOCK_NAME",
    "AckFile",
    "AckState",
    "Frame",
    "LogMeta",
    "WalClaim",
    "WalReader",
    "WalWriter",
    "claim_held",
    "logs_in",
    "logs_under",
    "path_name",
    "position",
    "read_source",
    "run_wal_dir",
    "segment_of",
    "source_name",
    "try_lock_shared",
    "unsent_frames",
]

EVENT: Final = 1
"""Frame kind: a TrainerEvent, single-object encoded (sent as one message to the events topic)."""
LOG: Final = 2
"""Frame kind: a LogEntry's Avro body (sent in LogBatch messages to the logs topic)."""
SAMPLE: Final = 3
"""Frame kind: a SampleEntry's Avro body (sent in SampleBatch messages to the samples topic)."""
SAMPLE_TEXT: Final = 4
"""Frame kind: a SampleTextEntry's Avro body (in SampleTextBatch messages to the texts topic)."""
PROTOCOL: Final = 4
"""The newest write-ahead log protocol this release reads and writes: 4 adds the frame kinds
:data:`SAMPLE` and :data:`SAMPLE_TEXT`, which only a producer's samples log holds; 3: frame
kinds :data:`EVENT` and :data:`LOG`, a log served by the host's agent, a CRC over kind, seq
and payload (2: the CRC covers the payload only; 1: that too, and the writing process sent
its own log, which carries no protocol in ``meta.json``)."""
EVENTS_PROTOCOL: Final = 3
"""The protocol a log of events and log records says it follows: theirs has not changed, so
an agent of the release before samples (protocol 3) still sends it during an upgrade. Only a
samples log, which such an agent leaves alone, says :data:`PROTOCOL`."""
KNOWN_KINDS: Final = frozenset({EVENT, LOG, SAMPLE, SAMPLE_TEXT})
"""The frame kinds of :data:`PROTOCOL`: a reader stops before any other."""
BATCHED_KINDS: Final = frozenset({LOG, SAMPLE, SAMPLE_TEXT})
"""Kinds whose consecutive frames travel together, behind the head their ``source`` file holds."""

HEADER: Final = struct.Struct("<IIBq")
_LENGTH: Final = struct.Struct("<I")
_CRC_KIND_SEQ: Final = struct.Struct("<IBq")
_KIND_SEQ: Final = struct.Struct("<Bq")
_KIND_SEQ_AT: Final = 8
"""Where the kind and seq start in a header (the CRC covers them since protocol 3)."""
SEGMENT_SUFFIX: Final = ".wal"
LOCK_NAME: Final = "lock"
SHIP_LOCK_NAME: Final = "ship.lock"
SOURCE_NAME: Final = "source"
ACKED_NAME: Final = "acked"
META_NAME: Final = "meta.json"
_OFFSET_BITS: Final = 40
_OFFSET_MASK: Final = (1 << _OFFSET_BITS) - 1


_NOT_PATH_CHARS: Final = re.compile(r"[^A-Za-z0-9._-]")


def run_wal_dir(root: Path, run_id: str, host: str) -> Path:
    """The directory of ``run_id``'s write-ahead logs written on ``host`` (one per producer).

    A host's logs have a directory of their own, so that on a spool that several hosts share
    no process looks at (or locks) another host's logs. Characters other than letters,
    digits, ``.``, ``_`` and ``-`` in the run id and the host become ``_``: each is one safe
    directory name.
    """
    return root / path_name(run_id) / path_name(host)


def path_name(text: str) -> str:
    """``text`` as one safe directory name (see :func:`run_wal_dir`)."""
    return _NOT_PATH_CHARS.sub("_", text).lstrip(".") or "_"


def position(segment: int, offset: int) -> int:
    """The position of byte ``offset`` of segment ``segment``."""
    return segment << _OFFSET_BITS | offset


def segment_of(at: int) -> int:
    """The segment number of a position."""
    return at >> _OFFSET_BITS


def _segment_name(segment: int) -> str:
    return f"{segment:06d}{SEGMENT_SUFFIX}"


def segments(directory: Path) -> list[int]:
    """The numbers of the segments in ``directory``, ascending."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            stem, dot, suffix = entry.name.partition(".")
            if dot and "." + suffix == SEGMENT_SUFFIX and stem.isdigit():
                found.append(int(stem))
    return sorted(found)


class Frame(NamedTuple):
    """One frame read back: where it starts and ends, its kind, seq and payload."""

    start: int
    end: int
    kind: int
    seq: int
    payload: bytes


@dataclass(frozen=True)
class LogMeta:
    """Who wrote a log and where its frames go: what a sender needs besides the frames."""

    directory: Path
    run_id: str
    """The key of every message (the run id)."""
    producer_id: str
    events_topic: str
    logs_topic: str
    created_ns: int
    host: str | None = None
    """The host whose process wrote the log (None: a log of an earlier release)."""
    pid: int | None = None
    """The process that wrote the log (None: a log of an earlier release)."""
    agent: str | None = None
    """The key of the host agent that serves the log
    (:class:`~rlpulse.producers.delivery.agent_place.AgentPlace`; None: a log of an earlier
    release, which its own process sent)."""
    protocol: int = PROTOCOL
    """The write-ahead log protocol its frames follow (:data:`PROTOCOL`; a ``meta.json``
    without one is of protocol 1)."""
    rank: int | None = None
    """The rank that writes it (None: a log of an earlier release)."""
    attempt: int | None = None
    """Its run attempt (None: a log of an earlier release)."""
    thread: int | None = None
    """The ident of the thread that made the logger: the training loop's, listed first in a
    stack dump."""
    stacks_signal: int | None = None
    """The signal on which the writing process dumps its stacks (None: it does not)."""
    stacks_file: str | None = None
    """The file the writing process dumps its stacks to."""
    samples_topic: str | None = None
    """Where a samples log's :data:`SAMPLE` frames go (None: an events log)."""
    sample_texts_topic: str | None = None
    """Where a samples log's :data:`SAMPLE_TEXT` frames go (None: an events log)."""

    def topics(self) -> dict[int, str]:
        """The topic of each frame kind this log may hold."""
        if self.samples_topic is None or self.sample_texts_topic is None:
            return {EVENT: self.events_topic, LOG: self.logs_topic}
        return {SAMPLE: self.samples_topic, SAMPLE_TEXT: self.sample_texts_topic}

    def write(self) -> None:
        """Write ``meta.json`` into the log's directory (atomically)."""
        document = {
            "v": 3,
            "run_id": self.run_id,
            "producer_id": self.producer_id,
            "host": self.host,
            "pid": self.pid,
            "events_topic": self.events_topic,
            "logs_topic": self.logs_topic,
            "created_ns": self.created_ns,
            "agent": self.agent,
            "protocol": self.protocol,
            "rank": self.rank,
            "attempt": self.attempt,
            "thread": self.thread,
            "stacks_signal": self.stacks_signal,
            "stacks_file": self.stacks_file,
        }
        if self.samples_topic is not None:
            document["samples_topic"] = self.samples_topic
            document["sample_texts_topic"] = self.sample_texts_topic
        path = self.directory / META_NAME
        temporary = path.with_name(META_NAME + ".tmp")
        temporary.write_text(json.dumps(document))
        os.replace(temporary, path)

    @classmethod
    def read(cls, directory: Path) -> LogMeta | None:
        """The meta of the log in ``directory``; None if it has none or it is unreadable."""
        try:
            document = json.loads((directory / META_NAME).read_text())
            return cls(
                directory,
                str(document["run_id"]),
                str(document["producer_id"]),
                str(document["events_topic"]),
                str(document["logs_topic"]),
                int(document["created_ns"]),
                None if document.get("host") is None else str(document["host"]),
                None if document.get("pid") is None else int(document["pid"]),
                None if document.get("agent") is None else str(document["agent"]),
                int(document.get("protocol", 1)),
                _optional_int(document.get("rank")),
                _optional_int(document.get("attempt")),
                _optional_int(document.get("thread")),
                _optional_int(document.get("stacks_signal")),
                None if document.get("stacks_file") is None else str(document["stacks_file"]),
                _optional_str(document.get("samples_topic")),
                _optional_str(document.get("sample_texts_topic")),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


def _optional_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


class WalClaim:
    """The exclusive right to write (``lock``) or to send (``ship.lock``) one log, by ``flock(2)``.

    It ends with the process that holds it, however that process ends. :meth:`take`
    returns None while a live process holds it. A sender's claim holds its pid in the file,
    so that ``rlpulse spool list`` can say which process sends the log.
    """

    def __init__(self, directory: Path, handle: IO[bytes], name: str = LOCK_NAME) -> None:
        self.directory = directory
        self.name = name
        self._handle: IO[bytes] | None = handle

    @classmethod
    def take(cls, directory: Path, name: str = LOCK_NAME) -> WalClaim | None:
        """Claim the log in ``directory`` (made if missing), or None if a live process has it."""
        directory.mkdir(parents=True, exist_ok=True)
        handle = (directory / name).open("ab")
        if not _try_lock(handle):
            handle.close()
            return None
        if name != LOCK_NAME:  # appends go to the end: after the truncation, the start
            handle.truncate(0)
            handle.write(str(os.getpid()).encode())
            handle.flush()
        return cls(directory, handle, name)

    @property
    def held(self) -> bool:
        """Whether :meth:`release` has not run yet."""
        return self._handle is not None

    def release(self, delete: bool = False) -> None:
        """Give the claim up; with ``delete``, remove the whole log first (all was delivered)."""
        if self._handle is None:
            return
        if delete:
            remove_log(self.directory)
        self._handle.close()  # closing the descriptor drops the flock
        self._handle = None


def remove_log(directory: Path) -> None:
    """Delete a log's files and directory, then its host's and run's directories once empty."""
    with contextlib.suppress(FileNotFoundError):
        for entry in list(os.scandir(directory)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
    with contextlib.suppress(OSError):
        directory.rmdir()
        directory.parent.rmdir()  # the host's, then the run's, once empty
        directory.parent.parent.rmdir()


def sender_pid(directory: Path) -> int | None:
    """The pid a sender's claim of the log in ``directory`` recorded (held or not), or None."""
    try:
        text = (directory / SHIP_LOCK_NAME).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def claim_held(directory: Path, name: str = LOCK_NAME) -> bool | None:
    """Whether a live process holds the claim ``name`` of the log in ``directory``.

    None: no such lock file there. A shared lock attempt, given up at once: nothing is made
    or changed, and two lookers do not stand in each other's way, but a process that tries
    to claim the log in that instant finds it held and passes it by until its next look.
    """
    try:
        descriptor = os.open(directory / name, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return not try_lock_shared(descriptor)
    finally:
        os.close(descriptor)  # drops the shared lock, if it was taken


if sys.platform == "win32":  # pragma: no cover - no flock; one process per directory

    def _try_lock(handle: IO[bytes]) -> bool:
        return True

    def try_lock_shared(descriptor: int) -> bool:
        """Always True: without flock a lock file's holder cannot be seen."""
        return True

else:
    import fcntl

    def _try_lock(handle: IO[bytes]) -> bool:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def try_lock_shared(descriptor: int) -> bool:
        """Take a shared lock on ``descriptor`` without waiting; False if one is held exclusively.

        Closing the descriptor drops the lock.
        """
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def logs_under(root: Path) -> list[Path]:
    """Every producer log with a segment under ``root`` (a log, a run's or the spool root).

    Only logs with a segment count: a writer makes its first segment after taking its claim,
    so a directory without one may be a live writer that has not taken its claim yet. A
    directory the host's agent deletes during the walk is left out, not an error: the walk
    is a look while the agent works (``os.walk`` passes over what vanished under it).
    """
    found: set[Path] = set()
    for directory, _, files in os.walk(root):
        if any(name.endswith(SEGMENT_SUFFIX) for name in files):
            found.add(Path(directory))
    return sorted(found)


def logs_in(directory: Path) -> list[Path]:
    """The producer logs directly in ``directory`` (a run's directory of one host), sorted.

    A directory listing and one per log: what looking for dead producers of a run costs on a
    host. Only logs with a segment count (see :func:`logs_under`).
    """
    try:
        entries = [entry for entry in os.scandir(directory) if entry.is_dir()]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(Path(entry.path) for entry in entries if segments(Path(entry.path)))


def source_name(kind: int) -> str:
    """The file holding the shared head of the batches of frames of ``kind``."""
    return SOURCE_NAME if kind == LOG else f"{SOURCE_NAME}-{kind}"


def read_source(directory: Path, kind: int = LOG) -> bytes | None:
    """The shared head of the producer's batches of ``kind``; None if it wrote none of them."""
    try:
        return (directory / source_name(kind)).read_bytes()
    except FileNotFoundError:
        return None


class WalWriter:
    """Appends frames to one producer's log (the caller holds the producer's lock).

    Construction does no I/O; the directory, the claim and the first segment are made with
    the first frame, and then ``on_first_segment`` is called (the host's agent is told of the
    new log). ``end`` is the position after the last complete frame.
    """

    def __init__(
        self,
        meta: LogMeta,
        segment_bytes: int,
        max_bytes: int,
        on_first_segment: Callable[[], None] | None = None,
    ) -> None:
        self.meta = meta
        self.directory = meta.directory
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self.claim: WalClaim | None = None
        self.end = 0
        """The position after the last complete frame (0: nothing written yet)."""
        self.frames = 0
        """Frames appended by this writer."""
        self.live: set[int] = set()
        """Segments on disk, as this writer last knew them (the sender deletes delivered ones;
        the writer lists them again before it calls itself full)."""
        self._on_first_segment = on_first_segment
        self._map: mmap.mmap | None = None
        self._segment = 0
        self._offset = 0

    def append(self, kind: int, seq: int, payload: bytes) -> bool:
        """Append one frame; False if the log is at ``max_bytes`` (the frame is not written).

        Raises ``OSError`` when the disk refuses (the caller counts the record as dropped).
        """
        size = HEADER.size + len(payload)
        full = self._map is None or self._offset + size > self.segment_bytes
        if full and not self._next_segment(size):
            return False
        data, offset = self._map, self._offset
        assert data is not None
        start = offset + HEADER.size
        data[start : start + len(payload)] = payload
        crc = zlib.crc32(payload, zlib.crc32(_KIND_SEQ.pack(kind, seq)))
        _CRC_KIND_SEQ.pack_into(data, offset + 4, crc, kind, seq)
        _LENGTH.pack_into(data, offset, len(payload))  # last: a reader takes it as the commit
        self._offset = end = start + len(payload)
        self.end = self._segment << _OFFSET_BITS | end  # position(), inline: the hot path
        self.frames += 1
        return True

    def write_source(self, head: bytes, kind: int = LOG) -> None:
        """Write the shared head of the producer's batches of ``kind`` (once, before the first).

        Whoever sends the log builds the batches from it.
        """
        self._claimed()
        path = self.directory / source_name(kind)
        if not path.exists():
            temporary = path.with_name(path.name + ".tmp")
            temporary.write_bytes(head)
            os.replace(temporary, path)

    def close(self) -> None:
        """Unmap the segment being written and give up the claim (the files stay)."""
        if self._map is not None:
            self._map.close()
            self._map = None
        if self.claim is not None:
            self.claim.release()

    def _claimed(self) -> WalClaim:
        if self.claim is None:
            claim = WalClaim.take(self.directory)
            if claim is None:
                raise OSError(f"{self.directory}: another process holds this producer's log")
            self.meta.write()
            self.claim = claim
        return self.claim

    def _next_segment(self, size: int) -> bool:
        if (len(self.live) + 1) * self.segment_bytes > self.max_bytes:
            self.live = {n for n in segments(self.directory) if n <= self._segment}
            if (len(self.live) + 1) * self.segment_bytes > self.max_bytes:
                return False
        self._claimed()
        segment = self._segment + 1
        path = self.directory / _segment_name(segment)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            length = max(self.segment_bytes, size)
            _reserve(descriptor, length)
            mapped = mmap.mmap(descriptor, length)
        except OSError:
            os.close(descriptor)
            path.unlink(missing_ok=True)
            raise
        os.close(descriptor)
        if self._map is not None:
            self._map.close()
        self._map = mapped
        self._segment = segment
        self._offset = 0
        self.live.add(segment)
        if segment == 1 and self._on_first_segment is not None:
            self._on_first_segment()
        return True


def _reserve(descriptor: int, length: int) -> None:
    """Make the file ``length`` bytes long with its blocks reserved.

    Writes into its mapping then cannot fail for want of space (which would be a SIGBUS).
    Where the filesystem cannot reserve blocks, the file is made sparse instead.
    """
    try:
        os.posix_fallocate(descriptor, 0, length)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL):
            raise
        os.ftruncate(descriptor, length)


class WalReader:
    """Reads one producer's log back, frame by frame; keeps its segments mapped between reads.

    The writer may be alive in another process: every frame's CRC is checked, and the
    frames stop at the first one that is not whole (being written, or cut by a kill).
    """

    def __init__(self, directory: Path, protocol: int = PROTOCOL) -> None:
        self.directory = directory
        self.protocol = protocol
        """The protocol of the log's frames (its ``meta.json``'s): what their CRC covers."""
        self._prefix = f"{directory}{os.sep}"  # the segments' paths, without pathlib per look
        self._maps: dict[int, mmap.mmap] = {}

    def frames(self, start: int) -> Iterator[Frame]:
        """The whole frames from position ``start``, in order.

        In the last segment they stop at the first frame that is not whole. A segment is left
        for the next one once that exists, after its tail is read once more: its writer
        finished it before making the next, and a frame read as not whole just before may
        have been finished since. A missing segment (deleted once delivered) is skipped.
        """
        segment, offset = segment_of(start), start & _OFFSET_MASK
        with_header = self.protocol >= 3
        while True:
            data = self._mapped(segment)
            if data is not None:
                offset = yield from _whole_frames(segment, data, offset, with_header)
                if not os.path.exists(f"{self._prefix}{segment + 1:06d}{SEGMENT_SUFFIX}"):
                    return
                offset = yield from _whole_frames(segment, data, offset, with_header)
                segment, offset = segment + 1, 0
                continue
            following = next((n for n in segments(self.directory) if n > segment), None)
            if following is None:
                return
            segment, offset = following, 0

    def forget(self, segment: int) -> None:
        """Unmap a segment (it was deleted)."""
        mapped = self._maps.pop(segment, None)
        if mapped is not None:
            mapped.close()

    def close(self) -> None:
        """Unmap every segment."""
        for segment in list(self._maps):
            self.forget(segment)

    def _mapped(self, segment: int) -> mmap.mmap | None:
        found = self._maps.get(segment)
        if found is not None:
            return found
        try:
            handle = open(self.directory / _segment_name(segment), "rb")  # noqa: SIM115
        except FileNotFoundError:
            return None
        with handle:
            length = os.fstat(handle.fileno()).st_size
            if length == 0:
                return None
            mapped = mmap.mmap(handle.fileno(), length, access=mmap.ACCESS_READ)
        self._maps[segment] = mapped
        return mapped


def _whole_frames(
    segment: int, data: mmap.mmap, offset: int, with_header: bool
) -> Generator[Frame, None, int]:
    """The whole frames of a mapped segment from ``offset``; returns where they stop.

    ``with_header``: the CRC covers the kind and seq too (protocol 3).
    """
    limit = len(data)
    base = segment << _OFFSET_BITS
    while offset + HEADER.size <= limit:
        size, crc, kind, seq = HEADER.unpack_from(data, offset)
        first = offset + HEADER.size
        if size == 0 or first + size > limit:
            break
        payload = data[first : first + size]
        start = zlib.crc32(data[offset + _KIND_SEQ_AT : first]) if with_header else 0
        if zlib.crc32(payload, start) != crc:
            break
        yield Frame(base | offset, base | (first + size), kind, seq, payload)
        offset = first + size
    return offset


def unsent_frames(directory: Path) -> int:
    """How many frames of the log in ``directory`` lie after its acknowledged position."""
    meta = LogMeta.read(directory)
    reader = WalReader(directory, PROTOCOL if meta is None else meta.protocol)
    try:
        return sum(1 for _ in reader.frames(AckFile.read(directory).position))
    finally:
        reader.close()


_ACKED: Final = struct.Struct("<4sIqqiqiqqqqqqI")
_ACKED_MAGIC: Final = b"RPW2"
_ACKED_SLOT: Final = 128
_ACKED_V1: Final = struct.Struct("<4sIqqiqiqI")
_ACKED_V1_MAGIC: Final = b"RPWA"
_ACKED_V1_SLOT: Final = 64


@dataclass
class AckState:
    """What Kafka acknowledged of one producer's log (the ``acked`` file).

    ``position``: every frame before it was delivered. ``events``/``logs``: the partition
    and offset of the last delivered message of each of the log's two topics (-1, -1: none
    yet), where a reader of the topic starts looking for what a dead process may have sent
    after it; in a samples log they hold the samples' and the texts' topics
    (:meth:`last_of`).
    ``created_ns``: when the log was made (a bound for that search when nothing was acked).
    The counts are of the frames before ``position``, so the writer can show its caller
    what happened to its records (a file of an earlier release has none).
    """

    position: int = 0
    created_ns: int = 0
    events: tuple[int, int] = (-1, -1)
    logs: tuple[int, int] = (-1, -1)
    frames: int = 0
    """Frames done with: delivered, found on their topic, or dropped."""
    delivered: int = 0
    """Records Kafka acknowledged on their first delivery."""
    resent: int = 0
    """Records whose first delivery failed, sent again after a read-back."""
    found: int = 0
    """Records a read-back found on their topic (not sent again)."""
    dropped: int = 0
    """Records the broker refused as malformed (never resent)."""

    def last_of(self, kind: int) -> tuple[int, int]:
        """The partition and offset of the last delivered message of ``kind``'s topic."""
        return self.events if kind in _FIRST_TOPIC_KINDS else self.logs

    def delivered_at(self, kind: int, partition: int, offset: int) -> None:
        """Record the last delivered message of ``kind``'s topic."""
        if kind in _FIRST_TOPIC_KINDS:
            self.events = (partition, offset)
        else:
            self.logs = (partition, offset)


_FIRST_TOPIC_KINDS: Final = frozenset({EVENT, SAMPLE})
"""Kinds whose last delivery an ``acked`` file keeps in its first slot (the rest: the second)."""


class AckFile:
    """The ``acked`` file: two slots written in turn, each with a generation and a CRC.

    A kill in the middle of a write can spoil only the slot being written; :meth:`read`
    takes the valid slot with the newest generation. Only the process that sends the log
    writes it; its writer reads it to know what arrived.
    """

    def __init__(self, directory: Path) -> None:
        self.path = directory / ACKED_NAME
        self._map: mmap.mmap | None = None
        self._generation = 0

    @classmethod
    def read(cls, directory: Path) -> AckState:
        """The state recorded in ``directory`` (an empty state if there is none)."""
        try:
            data = (directory / ACKED_NAME).read_bytes()
        except FileNotFoundError:
            return AckState()
        newest = _newest(data)
        return newest[1] if newest is not None else AckState()

    @classmethod
    def exists(cls, directory: Path) -> bool:
        """Whether a sender ever began on the log (it writes the file before it sends)."""
        return (directory / ACKED_NAME).exists()

    def write(self, state: AckState) -> None:
        """Record ``state`` (a store into the mapped file: no system call)."""
        if self._map is None:
            self._open(state)
        assert self._map is not None
        self._generation += 1
        slot = _ACKED_SLOT * (self._generation % 2)
        body = _ACKED.pack(
            _ACKED_MAGIC, self._generation, state.position, state.created_ns,
            *state.events, *state.logs, state.frames, state.delivered, state.resent,
            state.found, state.dropped, 0,
        )  # fmt: skip
        crc = zlib.crc32(body[:-4])
        self._map[slot : slot + _ACKED.size] = body[:-4] + crc.to_bytes(4, "little")

    def close(self) -> None:
        """Unmap the file."""
        if self._map is not None:
            self._map.close()
            self._map = None

    def _open(self, state: AckState) -> None:
        try:
            newest = _newest(self.path.read_bytes())
        except FileNotFoundError:
            newest = None
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(descriptor, 0, 2 * _ACKED_SLOT)
            self._map = mmap.mmap(descriptor, 2 * _ACKED_SLOT)
        finally:
            os.close(descriptor)
        if newest is not None:
            self._generation = newest[0]
            state.created_ns = state.created_ns or newest[1].created_ns


def _newest(data: bytes) -> tuple[int, AckState] | None:
    """The valid slot of an ``acked`` file with the newest generation, if any.

    A file of an earlier release (64-byte slots, no counts) is read too.
    """
    best: tuple[int, AckState] | None = None
    for slot in (0, _ACKED_SLOT):
        found = _unpack(data[slot : slot + _ACKED.size])
        if found is not None and (best is None or found[0] > best[0]):
            best = found
    if best is not None:
        return best
    for slot in (0, _ACKED_V1_SLOT):
        found = _unpack_v1(data[slot : slot + _ACKED_V1.size])
        if found is not None and (best is None or found[0] > best[0]):
            best = found
    return best


def _unpack(data: bytes) -> tuple[int, AckState] | None:
    if len(data) < _ACKED.size:
        return None
    magic, generation, at, created, ev_p, ev_o, log_p, log_o, *counts, crc = _ACKED.unpack(data)
    if magic != _ACKED_MAGIC or zlib.crc32(data[: _ACKED.size - 4]) != crc:
        return None
    return generation, AckState(at, created, (ev_p, ev_o), (log_p, log_o), *counts)


def _unpack_v1(data: bytes) -> tuple[int, AckState] | None:
    if len(data) < _ACKED_V1.size:
        return None
    magic, generation, at, created, ev_p, ev_o, log_p, log_o, crc = _ACKED_V1.unpack(data)
    if magic != _ACKED_V1_MAGIC or zlib.crc32(data[: _ACKED_V1.size - 4]) != crc:
        return None
    return generation, AckState(at, created, (ev_p, ev_o), (log_p, log_o))
