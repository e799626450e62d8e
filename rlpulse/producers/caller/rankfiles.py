"""One rank's local copy of its events and log records: ``<log_dir>/<component>_rank<N>.jsonl``.

The layout is :mod:`rlpulse.schemas.jsonl`'s (``rlpulse aggregate`` and ``rlpulse rules
backtest`` read these files, and ``rlpulse diagnose --log-dir`` their log records): a
metrics event is a line with ``stage``, ``step``, ``rank``, its metrics at the top level,
``timestamp_ns``, ``hostname``, ``pid``, ``run_id`` and ``attempt``; a log record is a line
with ``"kind": "log"`` and the fields of a :class:`~rlpulse.schemas.records.LogRecord`
(level, logger, message, exception, trace id, host IP...), which the metrics readers skip.

A metrics line is :func:`~rlpulse.schemas.jsonl.metrics_line`'s, by its rules: a line that
:meth:`~rlpulse.schemas.jsonl.RankLogWriter.write` would refuse with ``ValueError`` (a metric
named like one of the line's own fields) is left out here, counted in
:attr:`RankFileSink.refused` with one warning, because ``log()`` never raises; the event
itself is sent.

The training thread only hands a line over (:meth:`RankFileSink.put`, no I/O, never
blocks); a daemon thread hands the lines waiting to the layout's one writer,
:class:`~rlpulse.schemas.jsonl.RankLogWriter`, which turns them into JSON, appends them and
flushes after each batch, so that a tailing shipper (Fluent Bit) sees them within a fraction
of a second. The writer rotates the file at ``rotation_bytes`` (to ``<name>.jsonl.<UTC
time>``, no longer matching ``*.jsonl``) and deletes rotated files older than ``retention_s``
(by modification time, which is when they were rotated) at each rotation; the thread sweeps
them at start and every minute too. Lines beyond ``queue_max`` waiting for the thread are
dropped and counted in :attr:`dropped`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from rlpulse.schemas.jsonl import RankLogWriter, rank_log_path, rotated_files

__all__ = ["RankFileSink", "rotated_files"]

log = logging.getLogger(__name__)

SWEEP_S: Final = 60.0
"""How often the writer deletes rotated files past their retention."""
WAKE_S: Final = 0.2
"""Longest the writer waits before it looks for lines again."""


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
        self.directory = directory
        self.component = component
        self.rank = rank
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
        self._clock = clock
        self._lines: deque[dict[str, Any]] = deque()
        self._wake = threading.Event()
        self._idle = threading.Condition()
        self._closing = False
        self._writer: RankLogWriter | None = None
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

    @property
    def deleted(self) -> list[Path]:
        """Rotated files deleted after their retention."""
        return [] if self._writer is None else self._writer.deleted

    def sweep(self) -> list[Path]:
        """Delete the rotated files past their retention now; returns them."""
        return [] if self._writer is None else self._writer.sweep()

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
        if self._writer is not None:
            with contextlib.suppress(OSError):
                self._writer.close()

    def _write_waiting(self) -> None:
        lines = self._lines
        if not lines:
            return
        with self._idle:
            self._busy = True
        if self._writer is None:
            self._writer = RankLogWriter(
                self.directory,
                self.component,
                self.rank,
                rotation_bytes=self.rotation_bytes,
                retention_s=self.retention_s,
                clock=self._clock,
            )
        batch = [lines.popleft() for _ in range(len(lines))]
        try:
            self.written += self._writer.write_lines(batch)
        except OSError:
            self.dropped += len(batch)
            raise
