"""A real S3-compatible server on 127.0.0.1: S3Proxy with its filesystem backend.

What the tests and benchmarks run the archive against (``s3://bucket/prefix`` roots). The
jars come from Maven Central (``s3proxy/pom.xml``, resolved once into
``<home>/s3proxy-jars``); objects live as files under ``<state>/data/<bucket>/<key>``. Each
start makes a new secret key; :meth:`S3Proxy.archive_settings` and
:meth:`S3Proxy.environment` hand the endpoint and the credentials to the archive's settings,
in code or for a child process. Buckets are made through the S3 API by the caller
(``rlpulse.archive.store.s3_filesystem(..., allow_bucket_creation=True)``).

S3Proxy 2.6.0 refuses the flexible checksums that current AWS SDKs send by default
(gaul/s3proxy#795); :class:`~rlpulse.archive.store.ArchiveStore` asks for checksums
only where required, which S3Proxy accepts.
"""

from __future__ import annotations

import secrets
import subprocess
import time
import urllib.error
import urllib.request
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from pydantic import SecretStr

from rlpulse.local.child_process import free_port
from rlpulse.local.exceptions import S3ProxyError
from rlpulse.local.java import MavenJars, Progress, find_java, port_in_use, stop_pid, tail
from rlpulse.local.private_files import write_private
from rlpulse.settings import ArchiveSettings
from rlpulse.transport.bootstrap import LOCAL_HOST

__all__ = ["S3Proxy", "S3ProxyJars"]

START_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 15.0
ACCESS_KEY_ID: Final = "rlpulse"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _s3proxy_files() -> Path:
    return Path(str(resources.files("rlpulse.local").joinpath("s3proxy")))


class S3ProxyJars(MavenJars):
    """S3Proxy's jars for one version of ``s3proxy/pom.xml``, resolved by Maven into a cache."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__(
            cache_dir,
            _s3proxy_files() / "pom.xml",
            cache_name="s3proxy-jars",
            product="S3Proxy",
            version_property="s3proxy.version",
            error=S3ProxyError,
        )


class S3Proxy:
    """One S3Proxy process with its state (objects, properties, log) in ``state_dir``.

    ``port`` 0 picks a free port. Use it as a context manager, or call :meth:`start` and
    :meth:`stop`.
    """

    def __init__(self, cache_dir: Path, state_dir: Path, port: int = 0, heap: str = "256m") -> None:
        self.cache_dir = cache_dir
        self.state_dir = state_dir
        self.port = port
        self.heap = heap
        self.access_key_id = ACCESS_KEY_ID
        self.secret_access_key = ""
        """Made new at each :meth:`start`."""
        self.process: subprocess.Popen[bytes] | None = None
        self.version = ""

    @property
    def endpoint(self) -> str:
        """The server's URL (``http://127.0.0.1:<port>``); valid once started."""
        return f"http://{LOCAL_HOST}:{self.port}"

    @property
    def data_dir(self) -> Path:
        """Where the filesystem backend keeps buckets (directories) and objects (files)."""
        return self.state_dir / "data"

    @property
    def log_file(self) -> Path:
        """S3Proxy's log (logback)."""
        return self.state_dir / "s3proxy.log"

    @property
    def console_file(self) -> Path:
        """The JVM's stdout and stderr."""
        return self.state_dir / "console.log"

    def start(self, progress: Progress | None = None) -> Self:
        """Start S3Proxy and wait until it answers HTTP; :class:`S3ProxyError` if it cannot."""
        say = progress or (lambda _message: None)
        if self.process is not None and self.process.poll() is None:
            return self
        java = find_java("S3Proxy", S3ProxyError, say).path
        if self.port and port_in_use(self.port):
            raise S3ProxyError(f"port {self.port} on 127.0.0.1 is already in use.")
        self.port = self.port or free_port()
        jars = S3ProxyJars(self.cache_dir)
        libs = jars.resolve(say)
        self.version = jars.version
        self.secret_access_key = secrets.token_urlsafe(24)
        properties = self._write_properties()
        say(f"Starting S3Proxy {jars.version} on {self.endpoint}")
        command = [
            java,
            f"-Xmx{self.heap}",
            "-Djava.awt.headless=true",
            f"-Dlogback.configurationFile={_s3proxy_files() / 'logback.xml'}",
            f"-Drlpulse.log.file={self.log_file}",
            "-cp",
            f"{libs}/*",
            "org.gaul.s3proxy.Main",
            "--properties",
            str(properties),
        ]
        with self.console_file.open("ab") as console:
            self.process = subprocess.Popen(
                command,
                stdout=console,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._wait_ready(self.process)
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s; the objects stay in :attr:`data_dir`."""
        if self.process is None:
            return
        stop_pid(self.process.pid, STOP_TIMEOUT_S)
        self.process.wait()
        self.process = None

    def alive(self) -> bool:
        """Whether the server process is running."""
        return self.process is not None and self.process.poll() is None

    def archive_settings(self, root: str) -> ArchiveSettings:
        """Archive settings with ``root`` (``s3://bucket/prefix``) on this server."""
        return ArchiveSettings(
            root=root,
            s3_endpoint=self.endpoint,
            s3_access_key_id=self.access_key_id,
            s3_secret_access_key=SecretStr(self.secret_access_key),
        )

    def environment(self) -> dict[str, str]:
        """The ``RLPULSE_ARCHIVE__S3_*`` variables that point a child process's archive here."""
        return {
            "RLPULSE_ARCHIVE__S3_ENDPOINT": self.endpoint,
            "RLPULSE_ARCHIVE__S3_ACCESS_KEY_ID": self.access_key_id,
            "RLPULSE_ARCHIVE__S3_SECRET_ACCESS_KEY": self.secret_access_key,
        }

    def _write_properties(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        lines = {
            "s3proxy.endpoint": self.endpoint,
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": self.access_key_id,
            "s3proxy.credential": self.secret_access_key,
            "s3proxy.ignore-unknown-headers": "true",
            "jclouds.provider": "filesystem",
            "jclouds.filesystem.basedir": str(self.data_dir),
        }
        path = self.state_dir / "s3proxy.properties"
        write_private(path, "".join(f"{k}={v}\n" for k, v in lines.items()).encode())
        return path

    def _wait_ready(self, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                self.process = None
                raise S3ProxyError(
                    f"S3Proxy exited with code {process.returncode} during start-up; last lines "
                    f"of {self.log_file}:\n{tail(self.log_file) or tail(self.console_file)}"
                )
            if self._answers():
                return
            time.sleep(0.1)
        self.stop()
        raise S3ProxyError(
            f"S3Proxy did not answer at {self.endpoint} within {START_TIMEOUT_S:.0f} s; last "
            f"lines of {self.log_file}:\n{tail(self.log_file) or tail(self.console_file)}"
        )

    def _answers(self) -> bool:
        """Whether an HTTP server answers at the endpoint (an anonymous request gets 403)."""
        try:
            with _NO_PROXY.open(self.endpoint + "/", timeout=2.0):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
