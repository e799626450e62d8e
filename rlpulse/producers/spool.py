"""The spool: events that could not be delivered, kept on local disk until they can be.

Layout, one directory per run (:func:`run_spool_dir`)::

    <run dir>/<producer_id>.000001.jsonl   JSON Lines, one event per line, rotated by size
    <run dir>/<producer_id>.lock           flock(2)-ed by the process that writes or replays
                                           that producer's files

A line is ``{"v": 1, "topic", "producer_id", "seq", "key", "value"}``: key and value
are the exact Kafka key and Avro bytes, in base64, so a replay sends the original
event with its original ``producer_id`` and ``seq`` and consumers that drop duplicates
by that pair make any replay idempotent. ``producer_id`` and ``seq`` are repeated in
clear for people and tools. Each write ends with a ``write(2)`` of whole lines, so a
killed process leaves at most a truncated last line (skipped, with a warning).

A producer's lock is held by its process for as long as it spools, and the kernel
drops it when the process dies, however it dies: whoever can take the lock of a
producer (``claim``) may replay and delete its files — its own process, a later
process of the same run, or ``rlpulse replay``.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from rlpulse.settings import Settings

log = logging.getLogger(__name__)

LINE_VERSION = 1
SUFFIX = ".jsonl"
LOCK_SUFFIX = ".lock"
_FILE_NAME = re.compile(r"^(?P<producer>[A-Za-z0-9_-]+)\.(?P<index>\d{6})\.jsonl$")
_NOT_PATH_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def run_spool_dir(settings: Settings, run_id: str) -> Path:
    """The directory where ``run_id``'s undeliverable events are spooled.

    Characters other than letters, digits, ``.``, ``_`` and ``-`` in the run id become
    ``_``, so any run id is one safe directory name under ``settings.spool_root``.
    """
    name = _NOT_PATH_CHARS.sub("_", run_id).lstrip(".") or "_"
    return settings.spool_root / name


@dataclass(frozen=True, slots=True)
class SpooledEvent:
    """One event as it is spooled: where it goes, its bytes, and its identity."""

    topic: str
    key: bytes | None
    value: bytes
    producer_id: str
    seq: int

    def to_line(self) -> bytes:
        """The event as one JSON Lines line (with its newline)."""
        record = {
            "v": LINE_VERSION,
            "topic": self.topic,
            "producer_id": self.producer_id,
            "seq": self.seq,
            "key": None if self.key is None else base64.b64encode(self.key).decode(),
            "value": base64.b64encode(self.value).decode(),
        }
        return json.dumps(record, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> SpooledEvent:
        """Parse one line; ``ValueError``, ``KeyError`` or ``TypeError`` if it is not one."""
        record: dict[str, Any] = json.loads(line)
        if record.get("v") != LINE_VERSION:
            raise ValueError(f"unknown spool line version {record.get('v')!r}")
        key = record["key"]
        return cls(
            topic=str(record["topic"]),
            key=None if key is None else base64.b64decode(key, validate=True),
            value=base64.b64decode(record["value"], validate=True),
            producer_id=str(record["producer_id"]),
            seq=int(record["seq"]),
        )


def spool_file_name(producer_id: str, index: int) -> str:
    """The name of a producer's ``index``-th spool file."""
    return f"{producer_id}.{index:06d}{SUFFIX}"


def read_spool_file(path: Path) -> tuple[list[SpooledEvent], int]:
    """Return the events of one spool file and how many lines were unreadable (and skipped)."""
    events: list[SpooledEvent] = []
    bad = 0
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                events.append(SpooledEvent.from_line(line))
            except (ValueError, KeyError, TypeError) as exc:
                bad += 1
                log.warning("%s:%d: skipping an unreadable spool line: %s", path, number, exc)
    return events, bad


def spool_files(directory: Path) -> dict[tuple[Path, str], list[Path]]:
    """Every spool file under ``directory`` (recursively), by (its directory, producer id).

    Files are listed oldest first. A directory that does not exist has none.
    """
    found: dict[tuple[Path, str], list[Path]] = {}
    if not directory.is_dir():
        return found
    for path in sorted(directory.rglob(f"*{SUFFIX}")):
        match = _FILE_NAME.match(path.name)
        if match is not None and path.is_file():
            found.setdefault((path.parent, match["producer"]), []).append(path)
    return found


class SpoolClaim:
    """The exclusive right to write, replay and delete one producer's spool files.

    Backed by ``flock(2)`` on ``<directory>/<producer_id>.lock``, so it ends with
    the process that holds it. Use :meth:`take` for a claim that may be refused.
    """

    def __init__(self, directory: Path, producer_id: str, handle: IO[bytes]) -> None:
        self.directory = directory
        self.producer_id = producer_id
        self._handle: IO[bytes] | None = handle

    @property
    def lock_path(self) -> Path:
        """The lock file."""
        return self.directory / f"{self.producer_id}{LOCK_SUFFIX}"

    @classmethod
    def take(cls, directory: Path, producer_id: str) -> SpoolClaim | None:
        """Claim ``producer_id``'s files, or return None if a live process holds them."""
        directory.mkdir(parents=True, exist_ok=True)
        handle = (directory / f"{producer_id}{LOCK_SUFFIX}").open("ab")
        if not _try_lock(handle):
            handle.close()
            return None
        return cls(directory, producer_id, handle)

    def files(self) -> list[Path]:
        """The producer's spool files, oldest first."""
        return spool_files(self.directory).get((self.directory, self.producer_id), [])

    def release(self) -> None:
        """Give the claim up; the lock file goes too when no spool file of the producer is left."""
        if self._handle is None:
            return
        if not self.files():
            self.lock_path.unlink(missing_ok=True)
        self._handle.close()  # closing the descriptor drops the flock
        self._handle = None


if sys.platform == "win32":  # pragma: no cover - no flock; one process per spool directory

    def _try_lock(handle: IO[bytes]) -> bool:
        return True

else:
    import fcntl

    def _try_lock(handle: IO[bytes]) -> bool:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


class Spool:
    """One producer's spool: appends events to size-rotated files, counts their bytes.

    Nothing touches the disk until the first :meth:`write`; that takes the
    producer's :class:`SpoolClaim`. Thread-safe.
    """

    def __init__(
        self, directory: Path, producer_id: str, *, file_bytes: int, max_bytes: int
    ) -> None:
        self.directory = directory
        self.producer_id = producer_id
        self.file_bytes = file_bytes
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._claim: SpoolClaim | None = None
        self._file: IO[bytes] | None = None
        self._file_path: Path | None = None
        self._file_size = 0
        self._index = 0
        self._sizes: dict[Path, int] = {}

    @property
    def size(self) -> int:
        """Bytes in this producer's spool files."""
        return sum(self._sizes.values())

    def write(self, events: Iterable[SpooledEvent]) -> int:
        """Append ``events``; return how many were written (the rest would pass ``max_bytes``).

        Raises ``OSError`` if the disk refuses.
        """
        lines = [event.to_line() for event in events]
        if not lines:
            return 0
        with self._lock:
            room = self.max_bytes - self.size
            taken: list[bytes] = []
            for line in lines:
                if len(line) > room:
                    break
                taken.append(line)
                room -= len(line)
            pending = taken
            while pending:
                handle, path = self._writable()
                fit = _fitting(pending, self.file_bytes - self._file_size)
                handle.write(b"".join(pending[:fit]))
                handle.flush()  # one write(2): a kill leaves at most a cut last line
                self._file_size += sum(map(len, pending[:fit]))
                self._sizes[path] = self._file_size
                pending = pending[fit:]
                if self._file_size >= self.file_bytes:
                    self._close_file()
            return len(taken)

    def rotate(self) -> None:
        """Close the file being written, so that every spooled event is in a closed file."""
        with self._lock:
            self._close_file()

    def closed_files(self) -> list[Path]:
        """The files of this spool no longer written to, oldest first."""
        with self._lock:
            return sorted(p for p in self._sizes if p != self._file_path)

    def remove(self, path: Path) -> None:
        """Delete a closed spool file (its events were delivered or spooled again)."""
        with self._lock:
            path.unlink(missing_ok=True)
            self._sizes.pop(path, None)

    def close(self) -> None:
        """Close the current file and give the claim up (files with events stay)."""
        with self._lock:
            self._close_file()
            if self._claim is not None:
                self._claim.release()
                self._claim = None

    def _writable(self) -> tuple[IO[bytes], Path]:
        if self._claim is None:
            claim = SpoolClaim.take(self.directory, self.producer_id)
            if claim is None:
                raise OSError(f"{self.directory}: spool of producer {self.producer_id} is locked")
            self._claim = claim
        if self._file is None or self._file_path is None:
            self._index += 1
            path = self.directory / spool_file_name(self.producer_id, self._index)
            self._file = path.open("ab")
            self._file_path = path
            self._file_size = 0
        return self._file, self._file_path

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._file_path is not None and not self._sizes.get(self._file_path):
            self._file_path.unlink(missing_ok=True)
            self._sizes.pop(self._file_path, None)
        self._file = None
        self._file_path = None
        self._file_size = 0


def _fitting(lines: list[bytes], room: int) -> int:
    """How many of ``lines`` fit in ``room`` bytes; at least one (a file holds any line)."""
    count = 0
    for line in lines:
        room -= len(line)
        if count and room < 0:
            break
        count += 1
    return count
