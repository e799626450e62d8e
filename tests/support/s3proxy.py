"""A real S3-compatible server on 127.0.0.1: S3Proxy with its filesystem backend.

What the tests run the archive against (``s3://bucket/prefix`` roots). The jars come from
Maven Central (``s3proxy.pom.xml`` beside this module, resolved once into
``<home>/s3proxy-jars``); objects live as files under ``<state>/data/<bucket>/<key>``. Each
start makes a new secret key; :meth:`S3Proxy.archive_settings` and
:meth:`S3Proxy.environment` hand the endpoint and the credentials to the archive's settings,
in code or for a child process. Buckets are made through the S3 API by the caller
(``rlpulse.archive.store.s3_filesystem(..., allow_bucket_creation=True)``). Its start, wait
and stop are the local Java services' (:mod:`rlpulse.local.java_service`); the running
server is this object's, not recorded on disk.

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
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from pydantic import SecretStr

from rlpulse.local.child_process import free_port
from rlpulse.local.exceptions import S3ProxyError
from rlpulse.local.java import MavenJars, Progress, find_java
from rlpulse.local.java_service import LocalJavaService
from rlpulse.local.private_files import write_private
from rlpulse.settings import ArchiveSettings
from rlpulse.transport.bootstrap import LOCAL_HOST, ProcessRecord

__all__ = ["S3Proxy", "S3ProxyJars", "S3ProxyRecord"]

START_TIMEOUT_S: Final = 60.0
ACCESS_KEY_ID: Final = "rlpulse"
MAIN_CLASS: Final = "org.gaul.s3proxy.Main"
POM: Final = Path(__file__).with_name("s3proxy.pom.xml")
LOGBACK_CONFIG: Final = Path(__file__).with_name("s3proxy-logback.xml")
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class S3ProxyJars(MavenJars):
    """S3Proxy's jars for one version of ``s3proxy.pom.xml``, resolved by Maven into a cache."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__(
            cache_dir,
            POM,
            cache_name="s3proxy-jars",
            product="S3Proxy",
            version_property="s3proxy.version",
            error=S3ProxyError,
        )


@dataclass(frozen=True)
class S3ProxyRecord(ProcessRecord):
    """The running server: its process and log, endpoint and version."""

    main_class = MAIN_CLASS

    endpoint: str
    version: str


class S3Proxy(LocalJavaService[S3ProxyRecord]):
    """One S3Proxy process with its state (objects, properties, logs) in ``state_dir``.

    ``port`` 0 picks a free port. Use it as a context manager, or call :meth:`start` and
    :meth:`stop`.
    """

    product = "S3Proxy"
    process_noun = "an S3Proxy process"
    record_noun = "server"
    down_command = "S3Proxy.stop()"
    log_name = "s3proxy.log"
    error = S3ProxyError
    stop_timeout_s = 15.0

    def __init__(self, cache_dir: Path, state_dir: Path, port: int = 0, heap: str = "256m") -> None:
        super().__init__(state_dir, START_TIMEOUT_S)
        self.cache_dir = cache_dir
        self.port = port
        self.heap = heap
        self.access_key_id = ACCESS_KEY_ID
        self.secret_access_key = ""
        """Made new at each :meth:`start`."""
        self.process: subprocess.Popen[bytes] | None = None
        self.record: S3ProxyRecord | None = None

    @property
    def endpoint(self) -> str:
        """The server's URL (``http://127.0.0.1:<port>``); valid once started."""
        return f"http://{LOCAL_HOST}:{self.port}"

    @property
    def data_dir(self) -> Path:
        """Where the filesystem backend keeps buckets (directories) and objects (files)."""
        return self.state_dir / "data"

    @property
    def version(self) -> str:
        """The running S3Proxy's version ('' before :meth:`start`)."""
        return "" if self.record is None else self.record.version

    def info(self) -> S3ProxyRecord | None:
        """The server this object started, while its process runs."""
        return self.record if self.alive() else None

    def address(self, record: S3ProxyRecord) -> str:
        """The server's endpoint."""
        return record.endpoint

    def answers(self, record: S3ProxyRecord, timeout_s: float) -> bool:
        """Whether an HTTP server answers at the endpoint (an anonymous request gets 403)."""
        try:
            with _NO_PROXY.open(record.endpoint + "/", timeout=timeout_s):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def describe(self, record: S3ProxyRecord) -> str:
        """Where the running server is."""
        return f"S3Proxy {record.version} is up at {record.endpoint} (pid {record.pid})"

    def _start(self, say: Progress) -> tuple[subprocess.Popen[bytes], S3ProxyRecord]:
        """Resolve the jars, write the properties with a new secret key, and launch S3Proxy."""
        java = find_java("S3Proxy", S3ProxyError, say).path
        if self.port:
            self._refuse_taken([(self.port, LOCAL_HOST, "the port argument")])
        self.port = self.port or free_port()
        jars = S3ProxyJars(self.cache_dir)
        libs = jars.resolve(say)
        self.secret_access_key = secrets.token_urlsafe(24)
        properties = self._write_properties()
        say(f"Starting S3Proxy {jars.version} on {self.endpoint}")
        options = [f"-Xmx{self.heap}", f"-Dlogback.configurationFile={LOGBACK_CONFIG}"]
        command = self.java_command(
            java,
            MAIN_CLASS,
            "--properties",
            str(properties),
            classpath=[f"{libs}/*"],
            options=options,
        )
        self.process = self._spawn(command)
        self.record = S3ProxyRecord(
            pid=self.process.pid,
            log_file=str(self.log_file),
            started_ns=time.time_ns(),
            endpoint=self.endpoint,
            version=jars.version,
        )
        return self.process, self.record

    def _forget(self) -> None:
        """Let go of the process once it is gone."""
        if self.process is not None:
            self.process.wait()
        self.process = None
        self.record = None

    def start(self, progress: Progress | None = None) -> Self:
        """Start S3Proxy and wait until it answers HTTP; :class:`S3ProxyError` if it cannot."""
        self.up(progress)
        return self

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s; the objects stay in :attr:`data_dir`."""
        self.down()

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
        """``<state>/s3proxy.properties`` (0600: it holds the secret key)."""
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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
