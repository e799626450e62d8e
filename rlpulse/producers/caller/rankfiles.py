"""One rank's local copy of its events and log records: ``<log_dir>/<component>_rank<N>.jsonl``.

The layout is :mod:`rlpulse.schemas.jsonl`'s (``rlpulse aggregate`` and ``rlpulse rules
backtest`` read these files, and ``rlpulse diagnose --log-dir`` their log records): a
metrics event is a line with ``stage``, ``step``, ``rank``, its metrics at the top level,
``timestamp_ns``, ``hostname``, ``pid``, ``run_id`` and ``attempt``; a log record is a line
with ``"kind": "log"`` and the fields of a :class:`~rlpulse.schemas.records.LogRecord`
(level, logger, message, exception, trace id, host IP...), which the metrics readers skip.

A metrics line is :func:`~rlpulse.schemas.jsonl.metrics_line`'s, the same as
:class:`~rlpulse.schemas.jsonl.RankLogWriter` writes, by the same rules: a line that
:class:`~rlpulse.schemas.jsonl.RankLogWriter` would refuse with ``ValueError`` (a metric named
like one of the line's own fields) is left out here, counted in :attr:`RankFileSink.refused`
with one warning, because ``log()`` never raises; the event itself is sent.

The training thread only hands a line over (:meth:`RankFileSink.put`, no I/O, never
blocks); a daemon thread turns lines into JSON, appends them, and flushes after each batch
so that a tailing shipper (Fluent Bit) sees them within a fraction of a second. When the
file would pass ``rotation_bytes`` it is renamed to ``<name>.jsonl.<UTC time>`` (no longer
matching ``*.jsonl``, so shippers and readers of live files do not read it twice) and a new
one is started; rotated files older than ``retention_s`` (by modification time, which is
when they were rotated) are deleted at each rotation, at start and every minute. Lines
beyond ``queue_max`` waiting for the thread are dropped and counted in :attr:`dropped`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from rlpulse.schemas.jsonl import rank_log_path

__all__ = ["RankFileSink", "rotated_files"]

log = logging.getLogger(__name__)

SWEEP_S: Final = 60.0
"""How often the writer deletes rotated files past their retention."""
WAKE_S: Final = 0.2
"""Longest the writer waits before it looks for lines again."""
_STAMP = "%Y%m%dT%H%M%S.%fZ"
_ROTATED = re.compile(r"\.jsonl\.\d{8}T\d{6}\.\d{6}Z(?:-\d+)?$")


def rotated_files(live: Path) -> list[Path]:
    """The rotated files of the live file ``live``, oldest first."""
    if not live.parent.is_dir():
        return []
    prefix = live.name + "."
    found = [
        path
        for path in live.parent.iterdir()
        if path.name.startswith(prefix) and _ROTATED.search(path.name)
    ]
    return sorted(found, key=_rotation_order)


def _rotation_order(path: Path) -> tuple[str, int]:
    """Rotated files sort by their time, then by the serial that keeps equal times apart."""
    stamp, _, serial = path.name.rpartition(".")[2].partition("-")
    return stamp, int(serial or 0)


class RankFileSink:
    """Writes one rank's lines from a daemon thread, with rotation and retention (see above).

    Construction does no I/O; the directory and the file are made with the first line.
    ``clock`` (seconds since the epoch) decides what is past its retention; tests pass one.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        component: str,
        rank: int,
        *,
        rotation_bytes: int,
        retention_s: float,
        queue_max: int = 100_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = rank_log_path(directory, component, rank)
        self.rotation_bytes = rotation_bytes
        self.retention_s = retention_s
        self.queue_max = queue_max
        self.dropped = 0
        """Lines dropped because ``queue_max`` lines were waiting already."""
        self.refused = 0
        """Metrics lines the layout cannot hold (a metric named like one of the line's own
        fields: :func:`~rlpulse.schemas.jsonl.metrics_line`), never handed over: its logger
        counts them here and warns once."""
        self.written = 0
        """Lines written to the file."""
        self.deleted: list[Path] = []
        """Rotated files this sink deleted after their retention."""
        self._clock = clock
        self._lines: deque[dict[str, Any]] = deque()
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._closing = False
        self._file: Any = None
        self._size = 0
        self._next_sweep = 0.0
        self._busy = False
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def put(self, line: dict[str, Any]) -> None:
        """Hand one line (a JSON-serialisable dict) to the writer; never blocks."""
        if len(self._lines) >= self.queue_max:
            self.dropped += 1
            return
        self._lines.append(line)
        if self._thread is None:
            self._start()
        self._wake.set()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait up to ``timeout_s`` until every line handed over is written; True if so."""
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        with self._idle:
            while self._lines or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    return not self._lines
                self._idle.wait(min(left, WAKE_S))
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is waiting (up to ``timeout_s``), stop the thread and close the file."""
        self.flush(timeout_s)
        self._closing = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def sweep(self) -> list[Path]:
        """Delete the rotated files past their retention now; returns them."""
        cutoff = self._clock() - self.retention_s
        gone = []
        for path in rotated_files(self.path):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    gone.append(path)
            except FileNotFoundError:
                continue
        self.deleted += gone
        return gone

    # -- the writer thread ----------------------------------------------------------------

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"rlpulse-rankfile-{self.path.name}", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            self._wake.wait(WAKE_S)
            self._wake.clear()
            try:
                self._write_waiting()
                if self._clock() >= self._next_sweep:
                    self._next_sweep = self._clock() + SWEEP_S
                    self.sweep()
            except OSError as exc:
                log.warning("cannot write %s: %s; its lines are dropped", self.path, exc)
                self.dropped += len(self._lines)
                self._lines.clear()
            finally:
                with self._idle:
                    self._busy = False
                    self._idle.notify_all()
            if self._closing and not self._lines:
                break
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()

    def _write_waiting(self) -> None:
        lines = self._lines
        if not lines:
            return
        with self._idle:
            self._busy = True
        if self._file is None:
            self._open()
        chunk: list[str] = []
        while lines:
            text = json.dumps(lines.popleft(), separators=(",", ":"), default=str) + "\n"
            size = len(text.encode()) if not text.isascii() else len(text)
            if self._size and self._size + size > self.rotation_bytes:
                self._file.write("".join(chunk))
                chunk.clear()
                self._rotate()
            chunk.append(text)
            self._size += size
            self.written += 1
        self._file.write("".join(chunk))
        self._file.flush()

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._size = self._file.tell()

    def _rotate(self) -> None:
        self._file.close()
        stamp = datetime.datetime.fromtimestamp(self._clock(), datetime.UTC).strftime(_STAMP)
        target = self.path.with_name(f"{self.path.name}.{stamp}")
        serial = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.{stamp}-{serial}")
            serial += 1
        os.replace(self.path, target)
        self._file = self.path.open("a", encoding="utf-8")
        self._size = 0
        self.sweep()
