"""A rank's Python stacks on request from outside, into a file: a thread first, a signal last.

When a run hangs, the host's agent (:mod:`rlpulse.producers.delivery.stacks`) asks each rank
process of the run for its stacks. No ptrace is needed. Two ways, in this order:

- A thread of the process (``rlpulse-stacks``) waits on a FIFO beside the process's stack
  file (:func:`~rlpulse.schemas.stacks.request_path`); a byte written there makes it write
  every other thread's stack from ``sys._current_frames()``, under the GIL. A main thread
  blocked in a collective (NCCL, gloo, a TCPStore wait) has released the GIL, so this
  answers at once.
- ``faulthandler`` on a signal, for a process whose GIL is held by a thread stuck in C (the
  thread cannot answer then). The agent sends it only when the thread has not answered within
  half the capture's wait: ``faulthandler`` reads the other threads' frames without the GIL,
  and with threads running Python it crashed 3 of 128 busy processes (a segfault in
  ``dump_traceback``, measured in ``benchmarks/fleet.py``); with the GIL held by a stuck
  thread, no frame moves while it reads.

The signal (``agent.stacks_signal``, default ``SIGRTMIN+3``) is registered only when it has
no handler yet: ``chain=True`` over SIGUSR1's default action would kill the process, and
Lightning's SIGUSR1 handler requeues Slurm jobs. A taken signal is left alone, with one
warning naming the setting. One registration per process, whatever its number of ranks; a
forked child registers again, with a file and a thread of its own.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Final

from rlpulse.schemas.stacks import request_path

__all__ = ["DEFAULT_SIGNAL", "StackDump", "enable_stack_dumps", "signal_number", "write_stacks"]

log = logging.getLogger(__name__)

DEFAULT_SIGNAL: Final = "SIGRTMIN+3"
"""A real-time signal: no library or launcher gives it a meaning."""
OFF: Final = "off"
STACKS_DIRECTORY: Final = "stacks"
"""Under the agent's directory: one file per rank process."""


@dataclass(frozen=True)
class StackDump:
    """Where this process writes its stacks, and on which signal."""

    signum: int
    path: Path
    pid: int


_lock = threading.Lock()
_dump: StackDump | None = None
_file: IO[bytes] | None = None  # kept open: faulthandler writes to its descriptor
_warned: set[int] = set()


def signal_number(name: str) -> int | None:
    """``SIGRTMIN+3``, ``SIGUSR2``, ``40`` -> the signal's number; ``off`` -> None.

    Raises ValueError for a name that is no signal here.
    """
    text = name.strip().upper()
    if text == OFF.upper():
        return None
    if text.isdigit():
        number = int(text)
    elif text.startswith("SIGRTMIN"):
        offset = text.removeprefix("SIGRTMIN").replace(" ", "")
        number = signal.SIGRTMIN + (int(offset) if offset else 0)
    elif text.startswith("SIGRTMAX"):
        offset = text.removeprefix("SIGRTMAX").replace(" ", "")
        number = signal.SIGRTMAX + (int(offset) if offset else 0)
    else:
        try:
            number = int(signal.Signals[text if text.startswith("SIG") else f"SIG{text}"])
        except KeyError:
            raise ValueError(f"no signal called {name!r}") from None
    if not 0 < number < signal.NSIG or number in (signal.SIGKILL, signal.SIGSTOP):
        raise ValueError(f"signal {name!r} ({number}) cannot carry a stack dump")
    return number


def enable_stack_dumps(name: str, directory: Path) -> StackDump | None:
    """Register ``faulthandler`` on signal ``name`` (once per process), writing under ``directory``.

    None when the setting is ``off``, the signal has a handler already (warned once) or the
    file cannot be made (warned once): training goes on without stacks from outside.
    """
    global _dump, _file
    try:
        signum = signal_number(name)
    except ValueError as exc:
        _warn_once(-1, "rlpulse: agent.stacks_signal: %s; stacks cannot be taken from outside", exc)
        return None
    if signum is None:
        return None
    with _lock:
        pid = os.getpid()
        if _dump is not None and _dump.pid == pid and _dump.signum == signum:
            return _dump
        current = signal.getsignal(signum)  # faulthandler's own registration does not show
        if current not in (signal.SIG_DFL, None):
            _warn_once(
                signum,
                "rlpulse: signal %s already has a handler (%r): the host agent cannot take "
                "this process's stacks; set agent.stacks_signal to a free signal",
                name,
                current,
            )
            return None
        try:
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = directory / f"{pid}.stacks"
            opened = open(path, "ab", buffering=0)  # noqa: SIM115  # kept open for the handler
        except OSError as exc:
            _warn_once(signum, "rlpulse: %s: stacks cannot be taken from outside", exc)
            return None
        faulthandler.register(signum, file=opened, all_threads=True, chain=False)
        if _file is not None:
            _file.close()
        _file, _dump = opened, StackDump(signum, path, pid)
        _listen(request_path(path), opened)
        return _dump


def write_stacks(out: IO[bytes]) -> None:
    """Write every thread's stack but the caller's, in faulthandler's format, in one write."""
    own = threading.get_ident()
    blocks = []
    for ident, top in sys._current_frames().items():
        if ident == own:
            continue
        lines = [f"Thread 0x{ident:016x} (most recent call first):"]
        frame: FrameType | None = top
        while frame is not None:
            code = frame.f_code
            lines.append(f'  File "{code.co_filename}", line {frame.f_lineno} in {code.co_name}')
            frame = frame.f_back
        blocks.append("\n".join(lines))
    out.write(("\n\n".join(blocks) + "\n\n").encode(errors="replace"))


def _listen(fifo: Path, out: IO[bytes]) -> None:
    """Start the thread that answers the agent's requests on ``fifo``.

    The FIFO is made anew (a pid may be reused). Without it the agent's signal still works.
    """
    try:
        fifo.unlink(missing_ok=True)
        os.mkfifo(fifo, 0o600)
        fd = os.open(fifo, os.O_RDWR)  # a writer of its own: reads wait, never see an end
    except OSError as exc:
        _warn_once(-2, "rlpulse: %s: stacks are taken by signal only", exc)
        return
    threading.Thread(target=_answer, args=(fd, out), name="rlpulse-stacks", daemon=True).start()


def _answer(fd: int, out: IO[bytes]) -> None:
    while True:
        try:
            if not os.read(fd, 64):
                return
            write_stacks(out)
        except (OSError, ValueError):  # the file was closed: a newer registration took over
            os.close(fd)
            return


def _warn_once(key: int, message: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)
