"""What the local Java services share: jars resolved by Maven, the tools found, a clean stop.

The Kafka broker (:mod:`rlpulse.local.broker`), the OpenSearch node
(:mod:`rlpulse.local.opensearch`) and S3Proxy (:mod:`rlpulse.local.s3proxy`) each run from
the jars of one packaged ``pom.xml``, which Maven resolves once into a cache directory named
after the pom's digest (a changed pom gets a new directory). Nothing is built from the poms.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Final

from rlpulse.local.exceptions import LocalError
from rlpulse.transport.bootstrap import pid_alive

__all__ = [
    "MavenJars",
    "Progress",
    "port_in_use",
    "require_tool",
    "require_tools",
    "stop_pid",
    "stop_pids",
    "tail",
]

LOG_TAIL_LINES = 15

Progress = Callable[[str], None]
"""Where long operations report what they are doing (one line each)."""

_NEEDS: Final = {
    "java": ("Java 17 or newer", "openjdk-17-jre-headless"),
    "javac": ("a Java 17 JDK", "openjdk-17-jdk-headless"),
    "mvn": ("Maven", "maven"),
}
"""What each tool is, and the Debian package that installs it."""


def port_in_use(port: int) -> bool:
    """Whether something holds ``port`` on 127.0.0.1 (a listener, or a socket bound to it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a text file, or '' if it does not exist."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def require_tools(names: list[str], why: str, error: type[LocalError]) -> dict[str, str]:
    """The paths of ``names`` (``java``, ``javac``, ``mvn``) on PATH.

    Raises ``error`` naming every missing one at once and what installs them; ``why``
    completes "... not on PATH; ``why`` needs ...".
    """
    found = {name: shutil.which(name) for name in names}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        needs = [name for name in missing if not (name == "java" and "javac" in missing)]
        verb = "is" if len(missing) == 1 else "are"  # (a JDK brings the runtime: one package)
        raise error(
            f"{_and(missing)} {verb} not on PATH; {why} needs "
            f"{_and([_NEEDS[name][0] for name in needs])} "
            f"(apt-get install {' '.join(_NEEDS[name][1] for name in needs)})."
        )
    return {name: path for name, path in found.items() if path is not None}


def _and(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def require_tool(name: str, why: str, error: type[LocalError]) -> str:
    """The path of one tool on PATH (see :func:`require_tools`)."""
    return require_tools([name], why, error)[name]


def stop_pid(pid: int, timeout_s: float) -> None:
    """SIGTERM ``pid``; SIGKILL it if still alive after ``timeout_s``; return once it is gone."""
    stop_pids([pid], timeout_s)


def stop_pids(pids: Collection[int], timeout_s: float) -> None:
    """:func:`stop_pid` for several processes at once: each gets SIGTERM before any is waited for.

    The nodes of a cluster must go together: a node stopped after the others waits for a
    quorum that is gone (30 s here) before it exits.
    """
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(pid_alive(pid) for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    while any(pid_alive(pid) for pid in pids):
        time.sleep(0.05)


class MavenJars:
    """The runtime jars of one pom, resolved by Maven into ``<cache_dir>/<cache_name>/<digest>``.

    ``product`` names what the jars are in messages ("Apache Kafka"); ``version_property`` is
    the pom property that holds its version; ``error`` is the exception class raised.
    """

    def __init__(
        self,
        cache_dir: Path,
        pom: Path,
        *,
        cache_name: str,
        product: str,
        version_property: str,
        error: type[LocalError],
    ) -> None:
        self.pom = pom
        self.product = product
        self.version_property = version_property
        self.error = error
        digest = hashlib.sha256(self.pom.read_bytes()).hexdigest()[:12]
        self.directory = cache_dir / cache_name / digest

    @property
    def version(self) -> str:
        """The version of the product the pom asks for."""
        text = self.pom.read_text()
        opening = f"<{self.version_property}>"
        start = text.index(opening) + len(opening)
        return text[start : text.index(f"</{self.version_property}>", start)]

    def ready(self) -> bool:
        """Whether a complete resolution is already cached."""
        return (self.directory / ".complete").exists()

    def resolve(self, progress: Progress) -> Path:
        """Return the jar directory, running Maven first if it is not cached yet.

        Processes resolving the same pom at once take turns (a lock file beside the cache):
        the first runs Maven, the others find its result. Two Mavens writing one local
        repository at once can leave a corrupt artifact in it.
        """
        if self.ready():
            return self.directory
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.directory.with_name(self.directory.name + ".lock")
        with lock_path.open("a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                progress(f"Waiting for another process resolving the {self.product} jars")
                fcntl.flock(lock, fcntl.LOCK_EX)
            if self.ready():
                return self.directory
            return self._resolve(progress)

    def _resolve(self, progress: Progress) -> Path:
        mvn = shutil.which("mvn")
        if mvn is None:
            raise self.error(
                f"Maven (mvn) is not on PATH; rlpulse needs it once to fetch the {self.product} "
                "jars (apt-get install maven)."
            )
        progress(f"Resolving {self.product} {self.version} jars with Maven (first run only)")
        staging = self.directory.with_name(self.directory.name + f".tmp-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.parent.mkdir(parents=True, exist_ok=True)
        command = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(self.pom),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={staging}",
            "-DincludeScope=runtime",
        ]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            output = "\n".join((result.stdout + result.stderr).splitlines()[-LOG_TAIL_LINES:])
            raise self.error(f"Maven could not resolve the {self.product} jars:\n{output}")
        (staging / ".complete").write_text(self.version)
        if self.directory.exists():  # another process finished first
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.rename(self.directory)
        return self.directory
