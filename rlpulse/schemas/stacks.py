"""Stack records: what a rank's ``capture_stacks`` record holds, and reading its dump.

The host's agent (:mod:`rlpulse.producers.delivery.stacks`) sends one log record per rank of
a capture, logger :data:`STACKS_LOGGER`: its message is the rank's faulthandler dump with the
training loop's thread first (its header ends with :data:`LOOP_MARK`); its fields say the
command id, the ``outcome`` (``stacks``, ``gone``, ``silent``, ``unregistered``,
``refused``), the pid and the host. :func:`parse_dump` reads such a dump back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "LOOP_MARK",
    "STACKS_LOGGER",
    "RankStacks",
    "ThreadStack",
    "parse_dump",
    "render",
    "request_path",
]

STACKS_LOGGER: Final = "rlpulse.stacks"
"""The logger name of the records that carry stacks (and of a rank reported gone or silent)."""
LOOP_MARK: Final = "the training loop (the thread that made the rank's RunLink)"
"""Follows the header of the thread listed first in a rank's record."""


def request_path(stacks_file: Path) -> Path:
    """The FIFO beside a process's stack file on which its agent asks for its stacks."""
    return stacks_file.with_suffix(".ask")


_THREAD_HEADER = re.compile(
    r"^(Current thread|Thread) (0x[0-9a-fA-F]+) \(most recent call first\):.*$"
)


@dataclass(frozen=True)
class ThreadStack:
    """One thread of a faulthandler dump: its ident and frames, innermost first."""

    ident: int
    current: bool
    frames: tuple[str, ...]

    @property
    def top(self) -> str:
        """The innermost frame (``File "x.py", line 12 in f``), or ``<no Python frame>``."""
        return self.frames[0] if self.frames else "<no Python frame>"


def parse_dump(text: str) -> list[ThreadStack]:
    """The threads of a faulthandler dump (``all_threads=True``), in the dump's order."""
    threads: list[ThreadStack] = []
    ident: int | None = None
    current = False
    frames: list[str] = []
    for line in text.splitlines():
        header = _THREAD_HEADER.match(line.strip())
        if header is not None:
            if ident is not None:
                threads.append(ThreadStack(ident, current, tuple(frames)))
            ident, current, frames = int(header.group(2), 16), header.group(1) != "Thread", []
        elif ident is not None and line.strip().startswith("File "):
            frames.append(line.strip())
    if ident is not None:
        threads.append(ThreadStack(ident, current, tuple(frames)))
    return threads


def render(threads: Sequence[ThreadStack], loop_ident: int | None) -> str:
    """The dump again, the training loop's thread first (marked), then the others in order."""
    ordered = sorted(threads, key=lambda thread: thread.ident != loop_ident)
    blocks = []
    for thread in ordered:
        mark = f" {LOOP_MARK}" if thread.ident == loop_ident else ""
        head = f"Thread 0x{thread.ident:016x} (most recent call first):{mark}"
        blocks.append("\n".join([head, *(f"  {frame}" for frame in thread.frames)]))
    return "\n\n".join(blocks)


@dataclass(frozen=True)
class RankStacks:
    """One rank's record of a capture."""

    rank: int
    outcome: str  # stacks, gone, silent, unregistered, refused
    step: int
    host: str
    pid: int
    dump: str  # the threads, training loop first (empty without stacks)
