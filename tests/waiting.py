"""Waiting in tests for something another process does, with a deadline and a reason."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(
    condition: Callable[[], bool], what: str, timeout_s: float = 120.0, every_s: float = 0.2
) -> None:
    """Return once ``condition()`` is true; fail with "timed out waiting for ``what``"."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every_s)
