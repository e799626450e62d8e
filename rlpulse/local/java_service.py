"""One lifecycle for a local Java service: find it or start it, wait until it answers, stop it.

The Kafka broker (:mod:`rlpulse.local.broker`), the OpenSearch node
(:mod:`rlpulse.local.opensearch`) and the tests' S3Proxy say only what differs: how a new one
is prepared and launched (:meth:`LocalJavaService._start`), how a running one is found
(:meth:`~LocalJavaService.info`), what answering means (:meth:`~LocalJavaService.answers`),
and their names in messages. The rest is here: the running one is reused when it answers and
refused when it does not; a new JVM runs in its own session with its output in
``<state>/logs/console.log``; the wait for it ends with the log's last lines when the process
exits or does not answer in time; ``status`` says where it is; ``down`` stops it by SIGTERM,
then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar, Final, Generic, TypeVar

from rlpulse.local.exceptions import LocalError
from rlpulse.local.java import Progress, port_in_use, stop_pid, tail
from rlpulse.transport.bootstrap import STATE_FILE, ProcessRecord

__all__ = ["STATE_FILE", "LocalJavaService", "configured_or_local"]

REUSE_TIMEOUT_S: Final = 10.0
"""How long a recorded service has to answer before it is refused rather than reused."""
PROBE_TIMEOUT_S: Final = 2.0
"""How long each probe of the start-up wait waits for an answer."""
POLL_S: Final = 0.25
NOTE_EVERY_S: Final = 15.0
"""How often the start-up wait says it is still waiting."""
STOP_AFTER_FAILED_START_S: Final = 5.0


RecordT = TypeVar("RecordT", bound=ProcessRecord)

Launched = tuple[subprocess.Popen[bytes], RecordT]
"""A service just started: its JVM and its record, before it answers."""


def _silent(_message: str) -> None:
    """Progress that is said nowhere."""


class LocalJavaService(ABC, Generic[RecordT]):
    """A service on this machine that runs in a JVM, with its files in ``state_dir``.

    A subclass names the service (:attr:`product` and the nouns of its messages) and says how
    to find, probe and start it; ``start_timeout_s`` bounds the wait for a new one to answer.
    """

    product: ClassVar[str]
    """What messages call the service ("Kafka")."""
    process_noun: ClassVar[str]
    """What messages call its process ("a broker process")."""
    record_noun: ClassVar[str]
    """What ``status`` calls the recorded service ("broker": "no broker recorded in ...")."""
    down_command: ClassVar[str]
    """What stops a recorded service that does not answer (``rlpulse broker down``)."""
    log_name: ClassVar[str]
    """The file name of the service's own log in ``<state>/logs``."""
    error: ClassVar[type[LocalError]]
    """The exception its failures raise."""
    stop_timeout_s: ClassVar[float] = 30.0
    """How long :meth:`down` waits after SIGTERM before SIGKILL."""

    def __init__(self, state_dir: Path, start_timeout_s: float) -> None:
        self.state_dir = state_dir
        self.start_timeout_s = start_timeout_s

    @property
    def state_file(self) -> Path:
        """JSON record of the running service."""
        return self.state_dir / STATE_FILE

    @property
    def log_file(self) -> Path:
        """The service's own log."""
        return self.state_dir / "logs" / self.log_name

    @property
    def console_file(self) -> Path:
        """The JVM's stdout and stderr."""
        return self.state_dir / "logs" / "console.log"

    @abstractmethod
    def info(self) -> RecordT | None:
        """The recorded service if its process is alive, else None."""

    @abstractmethod
    def address(self, record: RecordT) -> str:
        """Where clients reach ``record``'s service (its bootstrap address or URL)."""

    @abstractmethod
    def answers(self, record: RecordT, timeout_s: float) -> bool:
        """Whether ``record``'s service answers as a ready one does, within ``timeout_s``."""

    @abstractmethod
    def describe(self, record: RecordT) -> str:
        """The sentence of :meth:`status` for a running service."""

    @abstractmethod
    def _start(self, say: Progress) -> Launched[RecordT]:
        """Prepare a new service, launch its JVM and record it; do not wait for it."""

    def _check_start(self, running: RecordT | None) -> None:
        """Refuse to go on before anything is reused or started (nothing to refuse here)."""

    def _ready(self, record: RecordT) -> None:
        """What a new service needs once it answers, before it is used (nothing here)."""

    def _forget(self) -> None:
        """Drop the record of a service that is gone."""
        self.state_file.unlink(missing_ok=True)

    def status(self) -> str:
        """One sentence saying whether the service is up and where."""
        info = self.info()
        if info is not None:
            return self.describe(info)
        if self.state_file.exists():
            return f"{self.product} is down (stale state in {self.state_dir}: its process is gone)"
        return f"{self.product} is down (no {self.record_noun} recorded in {self.state_dir})"

    def up(self, progress: Progress | None = None) -> RecordT:
        """Start the service, or return the running one; raise :attr:`error` with the reason."""
        say = progress or _silent
        launched = self.launch(say)
        if not isinstance(launched, tuple):
            return launched
        started = time.monotonic()
        process, record = launched
        self.wait_ready(process, record, say)
        self._ready(record)
        elapsed = time.monotonic() - started
        say(f"{self.product} is up at {self.address(record)} after {elapsed:.1f} s")
        return record

    def launch(self, progress: Progress | None = None) -> RecordT | Launched[RecordT]:
        """Start the service without waiting for it: the running one's record, or the new JVM."""
        return self._reuse_or_start(progress or _silent, self._start)

    def _reuse_or_start(
        self, say: Progress, start: Callable[[Progress], Launched[RecordT]]
    ) -> RecordT | Launched[RecordT]:
        """The running service when it answers (refused when it does not), else ``start``."""
        running = self.info()
        self._check_start(running)
        if running is None:
            return start(say)
        if self.answers(running, REUSE_TIMEOUT_S):
            say(f"Reusing {self.product} at {self.address(running)} (pid {running.pid})")
            return running
        raise self.error(
            f"{self.process_noun} (pid {running.pid}) is recorded in {self.state_dir} but does "
            f"not answer at {self.address(running)}; run `{self.down_command}` first.\n"
            + tail(Path(running.log_file))
        )

    def wait_ready(
        self,
        process: subprocess.Popen[bytes],
        record: RecordT,
        progress: Progress | None = None,
    ) -> None:
        """Block until the launched service answers; :attr:`error` if it exits or times out."""
        say = progress or _silent
        started = time.monotonic()
        deadline = started + self.start_timeout_s
        next_note = started + NOTE_EVERY_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                self._forget()
                raise self.error(
                    f"{self.product} exited with code {process.returncode} during start-up; "
                    f"last lines of {self.log_file}:\n{self._last_lines()}"
                )
            if self.answers(record, PROBE_TIMEOUT_S):
                return
            if time.monotonic() >= next_note:
                waited = time.monotonic() - started
                say(f"Still waiting for {self.product} at {self.address(record)} ({waited:.0f} s)")
                next_note += NOTE_EVERY_S
            time.sleep(POLL_S)
        self.down(timeout_s=STOP_AFTER_FAILED_START_S)
        raise self.error(
            f"{self.product} did not answer at {self.address(record)} within "
            f"{self.start_timeout_s:.0f} s; last lines of {self.log_file}:\n{self._last_lines()}"
        )

    def down(self, timeout_s: float | None = None) -> bool:
        """Stop the recorded service: SIGTERM, then SIGKILL after ``timeout_s``. True if one ran.

        ``timeout_s`` defaults to :attr:`stop_timeout_s`.
        """
        info = self.info()
        if info is not None:
            stop_pid(info.pid, self.stop_timeout_s if timeout_s is None else timeout_s)
        self._forget()
        return info is not None

    def _refuse_taken(self, ports: Iterable[tuple[int, str, str]]) -> None:
        """Raise :attr:`error` for the first ``(port, host, option)`` something already holds."""
        for port, host, option in ports:
            if port_in_use(port, host):
                raise self.error(
                    f"port {port} on {host} is already in use; stop what listens there or "
                    f"choose another with {option}."
                )

    def java_command(
        self, java: str, main: str, *args: str, classpath: Sequence[str], options: Sequence[str]
    ) -> list[str]:
        """The command line that runs ``main`` with ``args``, logging to :attr:`log_file`.

        ``options`` are the JVM's own (heap, garbage collector, logging configuration).
        """
        return [
            java,
            *options,
            "-Djava.awt.headless=true",
            f"-Drlpulse.log.file={self.log_file}",
            "-cp",
            os.pathsep.join(classpath),
            main,
            *args,
        ]

    def _spawn(self, command: list[str]) -> subprocess.Popen[bytes]:
        """Launch ``command`` in its own session, its output appended to :attr:`console_file`."""
        self.console_file.parent.mkdir(parents=True, exist_ok=True)
        with self.console_file.open("ab") as console:
            return subprocess.Popen(
                command,
                stdout=console,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _last_lines(self) -> str:
        """The last lines of the service's log, else of what the JVM printed."""
        return tail(self.log_file) or tail(self.console_file)


@contextlib.contextmanager
def configured_or_local(
    configured: str | None, service: LocalJavaService[RecordT]
) -> Iterator[str]:
    """``configured`` (an address from the settings) if set, else ``service`` started here.

    The service is stopped on exit. What the test suite's session fixtures and the benchmarks
    use.
    """
    if configured:
        yield configured
        return
    record = service.up()
    try:
        yield service.address(record)
    finally:
        service.down()
