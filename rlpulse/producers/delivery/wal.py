"""The write-ahead log: what a producer accepted is on local disk before ``log()`` returns.

Every event and text log record that ``log()`` or the logging handler accepts is appended
here, in ``seq`` order, before the call returns; rlpulse's sender thread reads it back from
here, sends it, and records what Kafka acknowledged. A frame written to the memory-mapped
segment is in the operating system's page cache, so it survives the process being killed
(SIGKILL, the OOM killer) — not the machine losing power. What a dead process left is sent
by the next process of the same run on the host, or by ``rlpulse replay``
(:mod:`rlpulse.producers.delivery.sender`, :mod:`rlpulse.producers.delivery.replay`).

Layout, one directory per producer under its run's directory of its host (:func:`run_wal_dir`;
the root is :func:`~rlpulse.producers.delivery.spool_root.resolve_spool_root`'s)::

    <spool root>/<run>/<host>/<producer_id>/lock flock(2)-ed by the process that writes
                                                 or sends this log (the kernel drops it
                                                 when that process dies)
                                     meta.json   the run, the producer, the host and
                                                 process that write it, the two topics,
                                                 when it was made
                                     source      the bytes every LogBatch of the producer
                                                 starts with (its shared fields)
                                     acked       what Kafka holds: the position up to which
                                                 every frame was delivered, and per topic the
                                                 partition and offset of the last delivery
                                     000001.wal  segments of ``segment_bytes``, reserved on
                                                 disk when made (no SIGBUS on a full disk)

A frame is a header ``<length u32, crc32 u32, kind u8, seq i64>`` and ``length`` bytes of
payload: a TrainerEvent's single-object encoding (kind 1) or a log record's LogEntry body
(kind 2, :meth:`~rlpulse.producers.encoding.logs.LogEncoder.entry`). The payload is written
before the header, and the CRC covers the payload, so a frame cut by a kill reads as the end of
the log.
A zero length ends a segment's frames. A position is ``segment << 40 | offset``.

The log takes at most ``max_bytes`` of disk: when a new segment would pass it, the record
is not written and counted as dropped (the newest go; what is on disk stays). The sender
deletes a segment once every frame in it was delivered.
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, NamedTuple

__all__ = [
    "EVENT",
    "LOG",
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
    "position",
    "read_source",
    "run_wal_dir",
    "segment_of",
    "unsent_frames",
]

EVENT: Final = 1
"""Frame kind: a TrainerEvent, single-object encoded (sent as one message to the events topic)."""
LOG: Final = 2
"""Frame kind: a LogEntry's Avro body (sent in LogBatch messages to the logs topic)."""

HEADER: Final = struct.Struct("<IIBq")
SEGMENT_SUFFIX: Final = ".wal"
LOCK_NAME: Final = "lock"
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
    return root / _path_name(run_id) / _path_name(host)


def _path_name(text: str) -> str:
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

    def write(self) -> None:
        """Write ``meta.json`` into the log's directory (atomically)."""
        document = {
            "v": 2,
            "run_id": self.run_id,
            "producer_id": self.producer_id,
            "host": self.host,
            "pid": self.pid,
            "events_topic": self.events_topic,
            "logs_topic": self.logs_topic,
            "created_ns": self.created_ns,
        }
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
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None


class WalClaim:
    """The exclusive right to write or send one producer's log, held by ``flock(2)``.

    It ends with the process that holds it, however that process ends. :meth:`take`
    returns None while a live process holds it.
    """

    def __init__(self, directory: Path, handle: IO[bytes]) -> None:
        self.directory = directory
        self._handle: IO[bytes] | None = handle

    @classmethod
    def take(cls, directory: Path) -> WalClaim | None:
        """Claim the log in ``directory`` (made if missing), or None if a live process has it."""
        directory.mkdir(parents=True, exist_ok=True)
        handle = (directory / LOCK_NAME).open("ab")
        if not _try_lock(handle):
            handle.close()
            return None
        return cls(directory, handle)

    @property
    def held(self) -> bool:
        """Whether :meth:`release` has not run yet."""
        return self._handle is not None

    def release(self, delete: bool = False) -> None:
        """Give the claim up; with ``delete``, remove the whole log first (all was delivered)."""
        if self._handle is None:
            return
        if delete:
            for entry in list(os.scandir(self.directory)):
                if entry.name != LOCK_NAME:
                    os.unlink(entry.path)
            with contextlib.suppress(OSError):
                os.unlink(self.directory / LOCK_NAME)
                self.directory.rmdir()
                self.directory.parent.rmdir()  # the host's, then the run's, once empty
                self.directory.parent.parent.rmdir()
        self._handle.close()  # closing the descriptor drops the flock
        self._handle = None


def claim_held(directory: Path) -> bool | None:
    """Whether a live process holds the claim of the log in ``directory``; None: no log there.

    A shared lock attempt, given up at once: nothing is made or changed, and two lookers do
    not stand in each other's way, but a process that tries to claim the log in that instant
    (a logger of the run looking for dead producers' logs) finds it held and passes it by
    until its next look.
    """
    try:
        descriptor = os.open(directory / LOCK_NAME, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return not _try_lock_shared(descriptor)
    finally:
        os.close(descriptor)  # drops the shared lock, if it was taken


if sys.platform == "win32":  # pragma: no cover - no flock; one process per directory

    def _try_lock(handle: IO[bytes]) -> bool:
        return True

    def _try_lock_shared(descriptor: int) -> bool:
        return True

else:
    import fcntl

    def _try_lock(handle: IO[bytes]) -> bool:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _try_lock_shared(descriptor: int) -> bool:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def logs_under(root: Path) -> list[Path]:
    """Every producer log with a segment under ``root`` (a log, a run's or the spool root).

    Only logs with a segment count: a writer makes its first segment after taking its claim,
    so a directory without one may be a live writer that has not taken its claim yet.
    """
    if not root.is_dir():
        return []
    return sorted({path.parent for path in root.rglob(f"*{SEGMENT_SUFFIX}") if path.is_file()})


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


def read_source(directory: Path) -> bytes | None:
    """The shared head of the producer's LogBatches, or None if it never wrote a record."""
    try:
        return (directory / SOURCE_NAME).read_bytes()
    except FileNotFoundError:
        return None


class WalWriter:
    """Appends frames to one producer's log (the caller holds the producer's lock).

    Construction does no I/O; the directory, the claim and the first segment are made with
    the first frame. ``end`` is the position after the last complete frame: a reader in
    another thread may read every frame before it.
    """

    def __init__(self, meta: LogMeta, segment_bytes: int, max_bytes: int) -> None:
        self.meta = meta
        self.directory = meta.directory
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self.claim: WalClaim | None = None
        self.start = 0
        """The position of the last frame appended."""
        self.end = 0
        """The position after the last complete frame (0: nothing written yet)."""
        self.frames = 0
        """Frames appended by this writer."""
        self.live: set[int] = set()
        """Segments on disk (the sender removes delivered ones with :meth:`remove`)."""
        self.source: bytes | None = None
        """The shared head of the producer's LogBatches once :meth:`write_source` was given it:
        this process's sender builds batches from it without reading the file back."""
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
        HEADER.pack_into(data, offset, len(payload), zlib.crc32(payload), kind, seq)
        self._offset = end = start + len(payload)
        segment = self._segment << _OFFSET_BITS  # position(), inline: this is the hot path
        self.start = segment | offset
        self.end = segment | end
        self.frames += 1
        return True

    def write_source(self, head: bytes) -> None:
        """Write the shared head of the producer's LogBatches (once, before its first record).

        The file is for whoever sends the log after this process; this process keeps the
        bytes in :attr:`source`.
        """
        self.source = head
        self._claimed()
        path = self.directory / SOURCE_NAME
        if not path.exists():
            temporary = path.with_name(SOURCE_NAME + ".tmp")
            temporary.write_bytes(head)
            os.replace(temporary, path)

    def remove(self, segment: int) -> None:
        """Delete a segment every frame of which was delivered (not the one being written)."""
        if segment == self._segment:
            return
        self.live.discard(segment)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / _segment_name(segment))

    def close(self) -> None:
        """Unmap the segment being written (the files stay)."""
        if self._map is not None:
            self._map.close()
            self._map = None

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
        self.close()
        self._map = mapped
        self._segment = segment
        self._offset = 0
        self.live.add(segment)
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

    The sender reads a live log up to its writer's :attr:`WalWriter.end`; a recovery reads a
    dead producer's log to its first frame that is not whole.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._maps: dict[int, mmap.mmap] = {}

    def frames(self, start: int, end: int | None = None) -> Iterator[Frame]:
        """The frames from position ``start``, in order, up to ``end`` if given.

        With ``end`` (a live writer's, in this process) every frame before it is whole, and
        CRCs are not checked. Without it, it stops at the first frame that is not whole in
        the last segment (the end of a log whose writer died). A missing segment (deleted once
        delivered) is skipped.
        """
        verify = end is None
        segment, offset = segment_of(start), start & _OFFSET_MASK
        while True:
            data = self._mapped(segment)
            if data is not None:
                limit = len(data)
                if end is not None and segment == segment_of(end):
                    limit = end & _OFFSET_MASK
                while offset + HEADER.size <= limit:
                    size, crc, kind, seq = HEADER.unpack_from(data, offset)
                    first = offset + HEADER.size
                    if size == 0 or first + size > limit:
                        break
                    payload = data[first : first + size]
                    if verify and zlib.crc32(payload) != crc:
                        break
                    base = segment << _OFFSET_BITS
                    yield Frame(base | offset, base | (first + size), kind, seq, payload)
                    offset = first + size
            if end is not None:
                if segment >= segment_of(end):
                    return
                segment += 1
            else:
                later = [n for n in segments(self.directory) if n > segment]
                if not later:
                    return
                segment = later[0]
            offset = 0

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


def unsent_frames(directory: Path) -> int:
    """How many frames of the log in ``directory`` lie after its acknowledged position."""
    reader = WalReader(directory)
    try:
        return sum(1 for _ in reader.frames(AckFile.read(directory).position))
    finally:
        reader.close()


_ACKED: Final = struct.Struct("<4sIqqiqiqI")
_ACKED_MAGIC: Final = b"RPWA"
_ACKED_SLOT: Final = 64


@dataclass
class AckState:
    """What Kafka acknowledged of one producer's log (the ``acked`` file).

    ``position``: every frame before it was delivered. ``events``/``logs``: the partition
    and offset of the last delivered message of each topic (-1, -1: none yet), where a
    reader of the topic starts looking for what a dead process may have sent after it.
    ``created_ns``: when the log was made (a bound for that search when nothing was acked).
    """

    position: int = 0
    created_ns: int = 0
    events: tuple[int, int] = (-1, -1)
    logs: tuple[int, int] = (-1, -1)


class AckFile:
    """The ``acked`` file: two slots written in turn, each with a generation and a CRC.

    A kill in the middle of a write can spoil only the slot being written; :meth:`read`
    takes the valid slot with the newest generation.
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

    def write(self, state: AckState) -> None:
        """Record ``state`` (a store into the mapped file: no system call)."""
        if self._map is None:
            self._open(state)
        assert self._map is not None
        self._generation += 1
        slot = _ACKED_SLOT * (self._generation % 2)
        body = _ACKED.pack(
            _ACKED_MAGIC, self._generation, state.position, state.created_ns,
            *state.events, *state.logs, 0,
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
    """The valid slot of an ``acked`` file with the newest generation, if any."""
    best: tuple[int, AckState] | None = None
    for slot in (0, _ACKED_SLOT):
        found = _unpack(data[slot : slot + _ACKED.size])
        if found is not None and (best is None or found[0] > best[0]):
            best = found
    return best


def _unpack(data: bytes) -> tuple[int, AckState] | None:
    if len(data) < _ACKED.size:
        return None
    magic, generation, at, created, ev_p, ev_o, log_p, log_o, crc = _ACKED.unpack(data)
    if magic != _ACKED_MAGIC or zlib.crc32(data[: _ACKED.size - 4]) != crc:
        return None
    return generation, AckState(at, created, (ev_p, ev_o), (log_p, log_o))
