"""An archiver running as a child process: what the tests and the benchmarks start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

__all__ = ["ArchiverProcess"]


class ArchiverProcess:
    """Starts ``rlpulse archive`` in a child process and stops it by signal.

    ``settings`` are extra settings as environment variables (``{"archive.roll_s": 1}``
    becomes ``RLPULSE_ARCHIVE__ROLL_S=1``).
    """

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        root: Path | str,
        log_file: Path,
        settings: Mapping[str, object] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.prefix = prefix
        self.root = str(root)
        self.log_file = log_file
        self.settings = dict(settings or {})
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """The command line of the child."""
        return [
            sys.executable,
            "-m",
            "rlpulse",
            "archive",
            "--bootstrap",
            self.bootstrap,
            "--prefix",
            self.prefix,
            "--root",
            self.root,
        ]

    def environment(self) -> dict[str, str]:
        """The child's environment: ours, unbuffered, with the extra settings."""
        extra = {
            "RLPULSE_" + name.replace(".", "__").upper(): str(value)
            for name, value in self.settings.items()
        }
        return {**os.environ, "PYTHONUNBUFFERED": "1", **extra}

    def start(self) -> ArchiverProcess:
        """Launch the child; its output is appended to ``log_file``."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=self.environment(),
            )
        return self

    def alive(self) -> bool:
        """Whether the child is still running."""
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: the crash the archive must survive."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        """Send ``sig``; after ``timeout_s`` without exit, SIGKILL. Returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def log_text(self) -> str:
        """What the child printed so far."""
        try:
            return self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> ArchiverProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
