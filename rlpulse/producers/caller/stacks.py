"""A rank's Python stacks on request from outside: ``faulthandler`` on a signal, into a file.

When a run hangs, the host's agent (:mod:`rlpulse.producers.delivery.stacks`) sends each rank
process of the run this signal; ``faulthandler`` then writes every thread's stack to the
process's file, from C, even while the main thread is blocked in a collective (NCCL, gloo).
No ptrace is needed.

The signal (``agent.stacks_signal``, default ``SIGRTMIN+3``) is registered only when it has
no handler yet: ``chain=True`` over SIGUSR1's default action would kill the process, and
Lightning's SIGUSR1 handler requeues Slurm jobs. A taken signal is left alone, with one
warning naming the setting. One registration per process, whatever its number of ranks; a
forked child registers again, with a file of its own.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

__all__ = ["DEFAULT_SIGNAL", "StackDump", "enable_stack_dumps", "signal_number"]

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
        return _dump


def _warn_once(key: int, message: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)
