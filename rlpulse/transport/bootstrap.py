"""Where every client finds Kafka: the one reading of the ``bootstrap`` setting.

``bootstrap`` (a flag, ``RLPULSE_BOOTSTRAP``, the config file) when set; otherwise the
broker that ``rlpulse broker up`` started on this machine, as recorded in
``<home>/broker/state.json``; otherwise ``<broker.advertised_host or 127.0.0.1>:<broker.port>``,
where ``broker up`` would start one (a config file that compute nodes share with the login
node's broker names it once) (``127.0.0.1:9092`` when ``broker.port`` is 0, free ports, which only a
running broker's record can tell). Blank means unset everywhere
(the settings model strips it). The record is written by :mod:`rlpulse.local.broker`;
reading it is a small file read and a signal-0 check of the recorded pid.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, Final, Self

from rlpulse.settings import DEFAULT_BOOTSTRAP, Settings

__all__ = [
    "BROKER_MAIN_CLASS",
    "STATE_FILE",
    "BrokerRecord",
    "ProcessRecord",
    "bootstrap_servers",
    "pid_alive",
    "process_started_ns",
    "recorded_process_alive",
]

STATE_FILE: Final = "state.json"
"""The record of a running local process, in its state directory."""
LOCAL_HOST = "127.0.0.1"
"""Where ``rlpulse broker up`` listens."""
BROKER_MAIN_CLASS = "kafka.Kafka"
"""The main class on a local broker's command line (how its recorded pid is recognised)."""


@dataclass(frozen=True)
class ProcessRecord:
    """A process started on this machine, recorded as JSON in its state directory.

    What ``status`` and ``down`` read from another process. A subclass adds its fields and
    names its program's :attr:`main_class`, which tells the recorded process from a later one
    given the same pid.
    """

    pid: int
    log_file: str
    """The process's own log."""
    started_ns: int
    main_class: ClassVar[str]
    """What the process's command line holds (see :func:`recorded_process_alive`)."""

    @classmethod
    def read(cls, state_dir: Path) -> Self | None:
        """The process recorded in ``state_dir`` if it is alive, else None."""
        try:
            record = cls(**json.loads((state_dir / STATE_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None
        return record if recorded_process_alive(record.pid, cls.main_class) else None

    def write(self, state_dir: Path) -> None:
        """Record this process in ``state_dir``."""
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / STATE_FILE).write_text(json.dumps(asdict(self), indent=2))


@dataclass(frozen=True)
class BrokerRecord(ProcessRecord):
    """A running local broker, as recorded in its state directory."""

    main_class = BROKER_MAIN_CLASS

    port: int
    controller_port: int
    bootstrap: str
    kafka_version: str
    secure: bool = False
    ca_file: str | None = None
    java: str | None = None
    """Which Java runs it (:meth:`~rlpulse.local.java.JavaRuntime.describe`)."""


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs: a zombie (killed, not yet reaped) does not.

    A zombie child of ours is reaped; another's is read from ``/proc`` where there is one.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(ChildProcessError):
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] not in ("Z", "X")


def recorded_process_alive(pid: int, marker: str) -> bool:
    """Whether ``pid`` is alive and still the process a state file recorded.

    A pid is given to a new process once its own has ended (the numbers wrap at 32,768 on a
    default Linux; the test suite gets there in minutes): a record left by a broker that
    died must not make rlpulse stop or SIGKILL whatever runs under that number now. So the
    process's command line must hold ``marker`` (the recorded program's main class). Where
    ``/proc`` is missing (macOS) the pid alone decides.
    """
    if not pid_alive(pid):
        return False
    if not _PROC.is_dir():
        return True
    try:
        command_line = (_PROC / str(pid) / "cmdline").read_bytes()
    except FileNotFoundError:  # it ended just now
        return False
    except PermissionError:
        return True
    if not command_line:  # a process in the middle of its exec shows none yet
        return True
    return marker.encode() in command_line.split(b"\0")


_PROC = Path("/proc")


def process_started_ns(pid: int) -> int | None:
    """When process ``pid`` started, in Unix nanoseconds (to about a second), from ``/proc``.

    None where it cannot be told: no ``/proc`` (macOS), or the process is gone. With the time
    a process of ours left behind (a log's creation), it tells whether ``pid`` still names
    that process or a newer one that was given its number.
    """
    boot_s = _boot_s()
    if boot_s is None:
        return None
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
        ticks = int(stat[stat.rfind(")") + 2 :].split()[19])  # field 22, starttime
    except (OSError, ValueError, IndexError):
        return None
    return boot_s * 1_000_000_000 + ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


@functools.cache
def _boot_s() -> int | None:
    """When this machine booted (Unix seconds, ``/proc/stat``'s ``btime``); read once."""
    try:
        lines = (_PROC / "stat").read_text().splitlines()
        return int(next(line for line in lines if line.startswith("btime ")).split()[1])
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def local_broker_dir(settings: Settings) -> Path:
    """The state directory of the default local broker."""
    return settings.home / "broker"


def bootstrap_servers(settings: Settings) -> str:
    """The bootstrap servers the clients of ``settings`` connect to (see the module docstring)."""
    if settings.bootstrap:
        return settings.bootstrap
    record = BrokerRecord.read(local_broker_dir(settings))
    if record is not None:
        return record.bootstrap
    port = settings.broker.port
    host = settings.broker.advertised_host or LOCAL_HOST
    return f"{host}:{port}" if port else DEFAULT_BOOTSTRAP
