"""Starting the host's agent: in the foreground (``rlpulse agent``), or detached by a rank.

:func:`start_detached` is what a rank does when it finds no live agent: it runs
``python -m rlpulse.producers.delivery.agent_process --detached`` with its settings on the
child's standard input (secrets included: a pipe, never a file or the command line), in a
session of its own, with every other descriptor closed. That process takes the agent's lock,
forks the agent (which the init process then adopts: it is not a child that dies with the
rank, and ``torchrun ... | tee`` does not wait for it), says ``started`` or why it could not,
and exits. The rank waits for that line at most ``agent.start_timeout_s``, on its watch
thread, never in ``log()``.

:func:`place_for` names the agent of a rank's settings; :func:`run_foreground` runs it in
this process (``rlpulse agent``: by hand, under systemd, in a DaemonSet).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

from pydantic import SecretStr

from rlpulse.producers.delivery.agent import HostAgent
from rlpulse.producers.delivery.agent_place import AgentPlace, agent_place
from rlpulse.producers.delivery.spool_root import SpoolRoot, resolve_spool_root
from rlpulse.settings import Settings
from rlpulse.transport.bootstrap import bootstrap_servers

__all__ = ["DETACHED_FLAG", "place_for", "run_foreground", "start_detached"]

DETACHED_FLAG: Final = "--detached"
_MODULE: Final = "rlpulse.producers.delivery.agent_process"
_LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_LOG_BYTES: Final = 8 * 1024 * 1024


def place_for(settings: Settings, spool: SpoolRoot | None = None) -> AgentPlace:
    """The agent that serves the logs of a process with ``settings`` on this host."""
    spool = spool if spool is not None else resolve_spool_root(settings)
    host = settings.producer.hostname or socket.gethostname()
    return agent_place(
        spool, host, bootstrap_servers(settings), settings.prefix, settings.security.username
    )


def settings_document(settings: Settings) -> dict[str, Any]:
    """``settings`` as JSON a child process builds the same settings from (secrets shown).

    ``bootstrap`` is the resolved address, so that the child serves the cluster the rank
    writes for even if the local broker's record changes meanwhile.
    """
    document: dict[str, Any] = settings.model_dump(mode="json")
    for dotted in Settings.secret_fields:
        section, name = dotted.split(".")
        value = getattr(getattr(settings, section), name)
        document[section][name] = (
            value.get_secret_value() if isinstance(value, SecretStr) else value
        )
    document["bootstrap"] = bootstrap_servers(settings)
    return document


def start_detached(settings: Settings, timeout_s: float | None = None) -> str | None:
    """Start this host's agent for ``settings`` unless one runs; None, or why it could not."""
    package_root = str(Path(__file__).resolve().parents[3])
    path = os.environ.get("PYTHONPATH")
    environment = {
        **os.environ,
        "PYTHONPATH": package_root if not path else f"{package_root}{os.pathsep}{path}",
        "PYTHONUNBUFFERED": "1",
    }
    if not sys.executable:
        return "this Python does not know its own interpreter (sys.executable is empty)"
    wait_s = settings.agent.start_timeout_s if timeout_s is None else timeout_s
    try:
        child = subprocess.Popen(
            [sys.executable, "-P", "-m", _MODULE, DETACHED_FLAG],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            close_fds=True,
            start_new_session=True,
            cwd="/",
            env=environment,
        )
    except OSError as exc:
        return f"{sys.executable} could not run: {exc.strerror or exc}"
    try:
        output, _ = child.communicate(
            json.dumps(settings_document(settings)).encode(), timeout=wait_s
        )
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        return f"it did not say it runs within {wait_s:g} s"
    lines = [line for line in output.decode(errors="replace").splitlines() if line.strip()]
    if child.returncode == 0:
        return None
    return lines[-1] if lines else f"it exited with status {child.returncode}"


def run_foreground(settings: Settings) -> int:
    """Run the agent of ``settings`` in this process until it is idle or stopped."""
    agent = HostAgent(settings, place_for(settings))
    agent.install_signal_handlers()
    return agent.run()


def _detached() -> int:
    """The process a rank starts: take the agent's lock, fork the agent, say how it went."""
    try:
        settings = Settings(**json.loads(sys.stdin.buffer.read()))
        place = place_for(settings)
        agent = HostAgent(settings, place)
        agent.check_clients()
        holder = agent.take_place()
    except Exception as exc:  # everything goes back to the rank as one line
        print(f"cannot start the host's agent: {_reason(exc)}", flush=True)
        return 1
    if holder is not None:
        print(f"running: pid {holder}", flush=True)
        return 0
    pid = os.fork()
    if pid:
        print(f"started: pid {pid}", flush=True)
        return 0
    _become_daemon(place)
    agent.install_signal_handlers()
    try:
        status = agent.run()
    except Exception:
        logging.getLogger(__name__).exception("the agent failed")
        status = 1
    os._exit(status)


def _become_daemon(place: AgentPlace) -> None:
    """Leave the rank's terminal and pipes behind: standard streams to /dev/null and the log."""
    from logging.handlers import RotatingFileHandler

    null = os.open(os.devnull, os.O_RDWR)
    log_fd = os.open(place.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(log_fd, 2)  # what escapes logging (a crash in a C library) still lands there
    os.close(null)
    os.close(log_fd)
    handler = RotatingFileHandler(place.log_file, maxBytes=_LOG_BYTES, backupCount=1)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    logging.getLogger("rlpulse").handlers.clear()  # its stderr handler: the same file again


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return str(exc) or exc.__class__.__name__


if __name__ == "__main__":
    if sys.argv[1:] != [DETACHED_FLAG]:
        sys.exit(f"usage: python -m {_MODULE} {DETACHED_FLAG} (settings as JSON on stdin)")
    sys.exit(_detached())
