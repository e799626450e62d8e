"""The archiver's writer thread: flushes written one after the other, behind the consumer.

:class:`FlushWriter` runs write jobs (one per flush) on one background thread, first in,
first out, so that the archiver decodes the next messages while Parquet is written. At most
``depth`` jobs wait; submitting more blocks until the thread catches up, which keeps memory
bounded. Order is what keeps the archive correct (:mod:`rlpulse.archive.layout`): a
partition resumes after its newest flush, so a flush renamed after an earlier one of its
partition failed would hide the failed one's records. Hence, after a job fails, the thread
runs no later job (it drops them); the failure is raised to the caller at its next
:meth:`~FlushWriter.submit`, :meth:`~FlushWriter.check` or :meth:`~FlushWriter.wait`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Final

__all__ = ["DEPTH", "FlushWriter", "Job"]

Job = Callable[[], None]
"""One flush to write: it raises if the flush could not be written."""
DEPTH: Final = 2
"""Jobs that may wait for the writer thread (besides the one it is running)."""


class FlushWriter:
    """Runs write jobs on one thread, in the order submitted; stops at the first failure.

    :meth:`start` the thread, :meth:`submit` jobs, :meth:`wait` where what was submitted must
    be on disk, :meth:`close` at the end. Submit, wait and close from one thread.
    """

    def __init__(self, depth: int = DEPTH, name: str = "rlpulse-archive-writer") -> None:
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=depth)
        self._name = name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def error(self) -> BaseException | None:
        """What the failed job raised; None while every job ran."""
        return self._error

    def start(self) -> None:
        """Start the thread (a daemon: an exiting process does not wait for it)."""
        if self._thread is not None:
            raise RuntimeError("the flush writer is started already")
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job`` behind the others; blocks while ``depth`` jobs wait.

        Raises what an earlier job raised, instead of queueing ``job``.
        """
        if self._thread is None:
            raise RuntimeError("the flush writer is not running")
        self.check()
        self._jobs.put(job)

    def check(self) -> None:
        """Raise what a job raised, if one failed."""
        if self._error is not None:
            raise self._error

    def wait(self) -> None:
        """Return when every job submitted has run; raise what a job raised, if one failed."""
        self._jobs.join()
        self.check()

    def close(self) -> None:
        """Let the queued jobs run (none after a failure), stop the thread and join it.

        Does not raise a job's failure: :meth:`wait` first for that.
        """
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._jobs.put(None)
        thread.join()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                if self._error is None:  # after a failure, later jobs are dropped unrun
                    job()
            except BaseException as exc:  # whatever it is, the submitting thread raises it
                self._error = exc
            finally:
                self._jobs.task_done()
