"""An rlpulse command in a child process: what the demo, the tests and the benchmarks start."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

__all__ = [
    "ChildProcess",
    "ServiceProcess",
    "free_port",
    "rlpulse_command",
    "setting_variables",
]


def free_port(avoid: Collection[int] = ()) -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago, and none of ``avoid``.

    ``avoid``: the ports already chosen for the other listeners of one start.
    """
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port
    raise OSError(f"no free port on 127.0.0.1 besides {sorted(avoid)}")


def rlpulse_command(*args: str) -> list[str]:
    """``python -P -m rlpulse *args`` with this interpreter.

    ``-P`` leaves the working directory off ``sys.path``: a ``./rlpulse`` there (the user's
    clone) is not the package.
    """
    return [sys.executable, "-P", "-m", "rlpulse", *args]


def setting_variables(settings: Mapping[str, object]) -> dict[str, str]:
    """Settings as the environment variables a child reads them from.

    ``{"archive.roll_s": 1}`` becomes ``{"RLPULSE_ARCHIVE__ROLL_S": "1"}``.
    """
    return {
        "RLPULSE_" + name.replace(".", "__").upper(): str(value) for name, value in settings.items()
    }


class ChildProcess:
    """Starts :meth:`command` in a child process (output to ``log_file``), stops it by signal."""

    def __init__(self, log_file: Path, env: Mapping[str, str] | None = None) -> None:
        self.log_file = log_file
        self.env = dict(env or {})
        """Environment variables for the child on top of this process's (``RLPULSE_*``...)."""
        self.process: subprocess.Popen[bytes] | None = None
        self.killed_after_timeout = False
        """Whether the last :meth:`stop` had to SIGKILL because the signal did not end it."""

    def command(self) -> list[str]:
        """The command line of the child."""
        raise NotImplementedError

    def start(self) -> Self:
        """Launch the child; its output goes to ``log_file``."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )
        return self

    def alive(self) -> bool:
        """Whether the child is still running."""
        return self.process is not None and self.process.poll() is None

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 30.0) -> int | None:
        """Send ``sig``; after ``timeout_s`` without exit, SIGKILL. Returns the exit code.

        :attr:`killed_after_timeout` tells whether the SIGKILL was needed.
        """
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.killed_after_timeout = True
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL, and wait for the child to be gone: the crash a process must survive."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log_text(self) -> str:
        """What the child printed so far."""
        try:
            return self.log_file.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class ServiceProcess(ChildProcess):
    """``rlpulse <subcommand> --bootstrap B --prefix P ...``, one service of a pipeline.

    A subclass names its :attr:`subcommand` and adds its own options in :meth:`_options`;
    ``extra_args`` go last, after them.
    """

    subcommand: ClassVar[str]
    """The rlpulse subcommand the child runs ("worker")."""

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        log_file: Path,
        env: Mapping[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        super().__init__(log_file, env)
        self.bootstrap = bootstrap
        self.prefix = prefix
        self.extra_args = extra_args

    def command(self) -> list[str]:
        """The command line of the child."""
        return rlpulse_command(
            self.subcommand,
            "--bootstrap",
            self.bootstrap,
            "--prefix",
            self.prefix,
            *self._options(),
            *self.extra_args,
        )

    def _options(self) -> list[str]:
        """The subcommand's own options, between ``--prefix`` and ``extra_args``."""
        return []
