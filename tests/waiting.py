"""Waiting in tests for something another process does, with a deadline and a reason."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(
    condition: Callable[[], object],
    what: str,
    timeout_s: float = 120.0,
    every_s: float = 0.2,
    state: Callable[[], str] | None = None,
) -> None:
    """Return once ``condition()`` is true; fail with "timed out waiting for ``what``".

    ``state``, when given, says at the timeout where things stand (counts, a child's log).
    """
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            where = f"\n{state()}" if state is not None else ""
            raise AssertionError(f"timed out waiting for {what}{where}")
        time.sleep(every_s)
