"""Where a host's agent lives, whether it is alive, and how a writer wakes it.

One agent serves the write-ahead logs of one user, spool root, host and cluster (bootstrap
servers, topic prefix and Kafka user): :func:`agent_place` names its directory after a key
made of those, so ranks of two clusters or prefixes on one host each reach their own agent,
and every rank with the same settings finds the same one. The directory is
``<spool root>/.agents/<key>/`` (a run's directory never starts with a dot), or, when the spool
root is on a filesystem hosts share, ``/var/tmp/rlpulse-<user>/agents/<key>/`` on the node: a
``flock`` must be node-local (on Lustre it can fail with ENOSYS). Made with mode 0700; it holds

    lock         flock(2)-ed by the live agent: it is alive while the lock is held
    spawn.lock   flock(2)-ed by a rank while it starts an agent: one start at a time
    state        one byte the agent sets before it sleeps, mapped by every writer
    wake         a FIFO: a writer that finds the agent asleep writes a line; a new log's
                 writer writes ``+<log directory>``
    place.json   what the key is made of: host, cluster, prefix (written by whoever comes first)
    agent.json   the agent's pid, start, protocol and what it serves
    status.json  what the agent sends now, and the trouble it has, if any
    agent.log    what the agent logs

Waking costs the writer nothing while the agent is awake: the agent sets ``state`` to
:data:`SLEEPING` (anything wakes it) or :data:`LINGERING` (it holds log records for the
linger: only an event wakes it) before it sleeps, then looks at every log once more; a
writer reads the byte after each append and only when it says so, sets it back to
:data:`AWAKE` and writes to the FIFO: one wake (three system calls) however many records
follow before the agent sleeps again. A wake lost to a race is made up by the agent's own look
every ``agent.look_interval_s``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import mmap
import os
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from rlpulse.producers.delivery.spool_root import SHARED_FILESYSTEMS, SpoolRoot, node_local_default
from rlpulse.producers.delivery.wal import EVENT, try_lock_shared

__all__ = [
    "AWAKE",
    "LINGERING",
    "SLEEPING",
    "AgentBell",
    "AgentPlace",
    "agent_alive",
    "agent_place",
    "agents_under",
    "read_json",
    "write_json",
]

AWAKE: Final = 0
"""The agent is looking at the logs, or will within milliseconds: nobody wakes it."""
LINGERING: Final = 1
"""The agent holds log records for the linger and sleeps until then: an event wakes it."""
SLEEPING: Final = 2
"""The agent sleeps: any record wakes it."""
AGENTS_DIR: Final = ".agents"
_STATE_BYTES: Final = 64


@dataclass(frozen=True)
class AgentPlace:
    """The directory of the agent of one user, spool root, host and cluster, and its key."""

    directory: Path
    key: str
    spool_root: Path
    host: str
    bootstrap: str
    prefix: str

    @property
    def lock(self) -> Path:
        """The file the live agent holds its ``flock`` on."""
        return self.directory / "lock"

    @property
    def spawn_lock(self) -> Path:
        """The file a rank holds its ``flock`` on while it starts an agent."""
        return self.directory / "spawn.lock"

    @property
    def state(self) -> Path:
        """The byte that says whether the agent sleeps."""
        return self.directory / "state"

    @property
    def wake(self) -> Path:
        """The FIFO a writer wakes the agent through."""
        return self.directory / "wake"

    @property
    def info(self) -> Path:
        """``agent.json``: the agent's pid, start, protocol and what it serves."""
        return self.directory / "agent.json"

    @property
    def status(self) -> Path:
        """``status.json``: what the agent sends now and its trouble."""
        return self.directory / "status.json"

    @property
    def log_file(self) -> Path:
        """What the agent logs."""
        return self.directory / "agent.log"

    @property
    def description(self) -> Path:
        """``place.json``: what the key is made of."""
        return self.directory / "place.json"

    def make(self) -> None:
        """Create the directory (0700), ``place.json``, the state byte and the FIFO if missing."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.description.exists():
            write_json(self.description, self.describe())
        if not self.state.exists():
            self._make_state()
        try:
            os.mkfifo(self.wake, 0o600)
        except FileExistsError:
            if not stat.S_ISFIFO(os.stat(self.wake).st_mode):
                raise OSError(errno.EEXIST, f"{self.wake} exists and is not a FIFO") from None

    def _make_state(self) -> None:
        """Make the state file whole, then link it in: another process never maps it short."""
        made = self.directory / f"state.{os.getpid()}.{threading.get_ident()}.tmp"
        descriptor = os.open(made, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(descriptor, _STATE_BYTES)
        finally:
            os.close(descriptor)
        try:
            os.link(made, self.state)  # never replaces one that another process made first
        except FileExistsError:
            pass
        finally:
            made.unlink()

    def describe(self) -> dict[str, Any]:
        """What the key is made of (for ``agent.json`` and ``rlpulse spool list``)."""
        return {
            "key": self.key,
            "spool_root": str(self.spool_root),
            "host": self.host,
            "bootstrap": self.bootstrap,
            "prefix": self.prefix,
        }


def agent_place(
    spool: SpoolRoot, host: str, bootstrap: str, prefix: str, kafka_user: str | None
) -> AgentPlace:
    """The agent for logs under ``spool`` written on ``host`` for this cluster and prefix."""
    root = spool.path.absolute()
    parts = json.dumps(
        [os.getuid(), str(root), host, bootstrap, prefix, kafka_user or ""], sort_keys=True
    )
    key = hashlib.sha256(parts.encode()).hexdigest()[:16]
    if spool.filesystem in SHARED_FILESYSTEMS:
        base = node_local_default().parent / "agents"
    else:
        base = root / AGENTS_DIR
    return AgentPlace(base / key, key, root, host, bootstrap, prefix)


def agents_under(spool_root: Path) -> list[Path]:
    """The agents' directories kept under a spool root (and on this node, for a shared one)."""
    found = []
    for base in (spool_root / AGENTS_DIR, node_local_default().parent / "agents"):
        with contextlib.suppress(OSError):
            found += [Path(entry.path) for entry in os.scandir(base) if entry.is_dir()]
    return sorted(set(found))


def agent_alive(lock: Path) -> bool:
    """Whether a live agent holds ``lock`` (a shared lock attempt, given up at once)."""
    try:
        descriptor = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        return not try_lock_shared(descriptor)
    finally:
        os.close(descriptor)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON document written by the agent, or None if it is missing or unreadable."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Write a JSON document atomically (readers never see half of it)."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temporary.write_text(json.dumps(document))
    os.replace(temporary, path)


class AgentBell:
    """A writer's side of the agent's wake: the mapped state byte and the FIFO.

    Made once per logger; :meth:`ring` after each append costs a read of one mapped byte
    while the agent is awake.
    """

    def __init__(self, place: AgentPlace) -> None:
        self.place = place
        self._wake = str(place.wake)
        place.make()
        descriptor = os.open(place.state, os.O_RDWR)
        try:
            self.state = mmap.mmap(descriptor, _STATE_BYTES)
        finally:
            os.close(descriptor)

    def ring(self, kind: int) -> None:
        """Wake the agent if it sleeps through a record of ``kind`` (else nothing)."""
        state = self.state
        mode = state[0]
        if mode == SLEEPING or (mode == LINGERING and kind == EVENT):
            state[0] = AWAKE
            self.send(b"\n")

    def register(self, log_dir: Path) -> None:
        """Tell the agent of a new log (it also finds it by itself, within seconds)."""
        self.send(b"+" + os.fsencode(log_dir) + b"\n")

    def send(self, line: bytes) -> None:
        """Write ``line`` to the FIFO; nothing happens when no agent reads it or it is full."""
        try:
            descriptor = os.open(self._wake, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no agent reads; ENOENT: gone
            return
        try:
            os.write(descriptor, line)
        except OSError:  # EAGAIN: full, the agent has plenty to read; EPIPE: it just died
            pass
        finally:
            os.close(descriptor)

    def close(self) -> None:
        """Unmap the state byte."""
        self.state.close()
