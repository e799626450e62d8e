"""A stand-in for a process rlpulse records (a local broker, a search node) in unit tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.waiting import wait_for


@contextmanager
def process_running(main_class: str) -> Iterator[int]:
    """A live process with ``main_class`` on its command line, as a recorded JVM has; its pid.

    rlpulse recognises a recorded pid by that class (pids are reused), so a record of the
    test's own pid would read as a dead broker.
    """
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", main_class])
    try:
        # Popen may return while the child is still in its exec, before its command line shows
        wait_for(
            lambda: main_class.encode() in Path(f"/proc/{child.pid}/cmdline").read_bytes(),
            f"a child process showing {main_class} on its command line",
            timeout_s=10.0,
            every_s=0.01,
        )
        yield child.pid
    finally:
        child.kill()
        child.wait()
