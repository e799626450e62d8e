"""A rank's watch over its host's agent: one is alive, or it starts one; its trouble is said.

The loggers of a process that share an agent share one :class:`AgentWatch` (made by
:func:`watch_agent`, given back with :meth:`AgentWatch.release`): a thread that every
``agent.check_interval_s`` makes one shared lock attempt on the agent's lock file (no scan,
nothing per record, and it does not depend on ``log()`` being called: an idle or hung rank
still has a living agent) and, when no agent holds it and ``agent.start`` is ``auto``, starts
one (:func:`~rlpulse.producers.delivery.agent_process.start_detached`), under a lock that lets
one rank of the host start it while the others wait for their next check. A rank never waits
for the agent: its frames wait in its write-ahead log.

It reads the agent's ``status.json`` at each check and says, once per kind of trouble, in the
rank's own log, what keeps its records from Kafka (the agent could not start; Kafka out of
reach; a topic missing), and once when they flow again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Final

from rlpulse.diagnostics import WarnOnce
from rlpulse.producers.delivery.agent_place import AgentPlace, agent_alive, read_json
from rlpulse.producers.delivery.wal import WalClaim
from rlpulse.settings import Settings
from rlpulse.transport.backoff import Backoff

__all__ = ["AgentWatch", "watch_agent"]

log = logging.getLogger(__name__)

_FIRST_RETRY_S: Final = 10.0
_MAX_RETRY_S: Final = 300.0

Starter = Callable[[Settings], "str | None"]


class AgentWatch:
    """Keeps one agent alive for a place, for the loggers of this process that use it."""

    def __init__(self, place: AgentPlace, settings: Settings, starter: Starter) -> None:
        self.place = place
        self.settings = settings
        self.users = 0
        """Loggers of this process that use the watch (it stops when the last one is done)."""
        self.starts = 0
        """Agents this process started."""
        self.last_start_error: str | None = None
        """Why the last start failed (None: none failed)."""
        self._starter = starter
        self._warn = WarnOnce(log)
        self._problem: str | None = None
        self._stop = threading.Event()
        self._checked = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"rlpulse-agent-watch-{place.key}", daemon=True
        )
        self._next_start = 0.0
        self._start_pauses = Backoff(_FIRST_RETRY_S, _MAX_RETRY_S)

    def start(self) -> None:
        """Start the watch thread (its first check is at once)."""
        self._thread.start()

    def wait_checked(self, timeout_s: float) -> bool:
        """Wait until the first check (and start, if it had to) is done."""
        return self._checked.wait(timeout_s)

    def release(self) -> None:
        """One logger is done with the watch; the last one stops it."""
        with _WATCHES_LOCK:
            self.users -= 1
            if self.users > 0:
                return
            _WATCHES.pop(self.place.directory, None)
        self._stop.set()

    def _run(self) -> None:
        interval = self.settings.agent.check_interval_s
        while True:
            try:
                self.check()
            except Exception:  # a check that failed must not end the next ones
                log.exception("checking the host's agent at %s failed", self.place.directory)
            self._checked.set()
            if self._stop.wait(interval):
                return

    def check(self) -> None:
        """One check: start an agent if none is alive; say its trouble once."""
        place = self.place
        if not agent_alive(place.lock):
            if self.settings.agent.start == "never":
                self._say(
                    f"no agent runs for {place.directory} and agent.start is never: start "
                    "`rlpulse agent` on this host"
                )
                return
            if time.monotonic() >= self._next_start:
                self._start_one()
            return
        status = read_json(place.status) or {}
        problem = status.get("problem")
        self._say(problem if isinstance(problem, str) else None)

    def _start_one(self) -> None:
        """Start an agent unless another rank of this host is starting one just now."""
        try:
            spawning = WalClaim.take(self.place.directory, self.place.spawn_lock.name)
        except OSError as exc:
            self._failed(f"{self.place.directory}: {exc.strerror or exc}")
            return
        if spawning is None:
            return  # another rank starts it; the next check sees it
        try:
            if agent_alive(self.place.lock):
                return
            why = self._starter(self.settings)
        finally:
            spawning.release()
        if why is None:
            self.starts += 1
            self._start_pauses.reset()
            self._say(None)
        else:
            self._failed(why)

    def _failed(self, why: str) -> None:
        self.last_start_error = why
        self._next_start = time.monotonic() + self._start_pauses.next()
        self._say(
            f"no agent could be started for this host ({why}); records wait in the "
            f"write-ahead logs under {self.place.spool_root} until an agent runs or "
            "`rlpulse spool send`"
        )

    def _say(self, problem: str | None) -> None:
        """Warn once per distinct trouble; say once when it is over."""
        if problem == self._problem:
            return
        if problem is not None:
            self._warn(problem, "rlpulse (pid %d): %s", os.getpid(), problem)
        elif self._problem is not None:
            log.info("rlpulse (pid %d): the host's agent sends records again", os.getpid())
        self._problem = problem


_WATCHES: dict[object, AgentWatch] = {}
_WATCHES_LOCK = threading.Lock()
_FORK_HOOK: list[bool] = []  # whether the fork hook is registered


def watch_agent(place: AgentPlace, settings: Settings, starter: Starter) -> AgentWatch:
    """The watch of ``place`` in this process (started with its first user)."""
    with _WATCHES_LOCK:
        if not _FORK_HOOK:
            os.register_at_fork(after_in_child=_WATCHES.clear)  # a child has no watch threads
            _FORK_HOOK.append(True)
        watch = _WATCHES.get(place.directory)
        if watch is None:
            watch = _WATCHES[place.directory] = AgentWatch(place, settings, starter)
            watch.users = 1
            watch.start()
        else:
            watch.users += 1
        return watch
