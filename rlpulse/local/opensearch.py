"""A real single-node OpenSearch on 127.0.0.1, run from Maven's jars.

``rlpulse search up`` resolves OpenSearch's jars with Maven from the packaged
``opensearch/pom.xml`` into ``<home>/opensearch-jars`` (once), compiles the small launcher
``opensearch/RlpulseNode.java`` with javac into ``<home>/opensearch-launcher`` (once), writes
``<state>/config/opensearch.yml`` and starts one node: single-node discovery, bound to
127.0.0.1, the HTTP and transport ports of the ``search`` settings, a fixed heap, no security
plugin (security is off: the node is for this machine). It waits until the REST API reports
the cluster green or yellow, then sets ``cluster.default_number_of_replicas`` to 0 (one node
has nowhere to put a replica, so new indices are green). The node's pid, ports and URL are
recorded in the state directory (default ``<home>/search``) so that ``status`` and ``down``
find it from another process; SIGTERM closes the node.

Clients find OpenSearch with :func:`search_url`: the ``opensearch_url`` setting, else the
node recorded here, else ``http://127.0.0.1:<search.port>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import AbstractContextManager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

from rlpulse.local.child_process import free_port
from rlpulse.local.exceptions import SearchError
from rlpulse.local.java import MavenJars, Progress, find_java, require_tools
from rlpulse.local.java_service import LocalJavaService, configured_or_local
from rlpulse.settings import Settings
from rlpulse.transport.bootstrap import LOCAL_HOST, ProcessRecord

__all__ = [
    "LocalSearch",
    "OpenSearchJars",
    "SearchRecord",
    "local_search_or_url",
    "request_json",
    "search_url",
]

LAUNCHER_CLASS: Final = "RlpulseNode"
CLUSTER_NAME: Final = "rlpulse-search"
READY_STATUSES: Final = frozenset({"green", "yellow"})

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Requests to the node never go through a proxy from the environment."""


def _search_files() -> Path:
    return Path(str(resources.files("rlpulse.local").joinpath("opensearch")))


def request_json(
    method: str, url: str, body: Any = None, timeout_s: float = 10.0
) -> tuple[int, Any]:
    """One REST request to OpenSearch: (HTTP status, decoded JSON body or None).

    ``body`` is sent as JSON, or as it is when it is already ``bytes`` (NDJSON for ``_bulk``).
    Raises :class:`OSError` when nothing answers at ``url``.
    """
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    content_type = "application/x-ndjson" if isinstance(body, bytes) else "application/json"
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", content_type)
    try:
        with _NO_PROXY.open(request, timeout=timeout_s) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, None


@dataclass(frozen=True)
class SearchRecord(ProcessRecord):
    """A running local OpenSearch node, as recorded in its state directory."""

    main_class = LAUNCHER_CLASS

    url: str
    http_port: int
    transport_port: int
    version: str
    heap: str


def search_url(settings: Settings) -> str:
    """Where OpenSearch's REST API is for clients of ``settings`` (see the module docstring)."""
    if settings.opensearch_url:
        return settings.opensearch_url
    record = SearchRecord.read(settings.home / "search")
    if record is not None:
        return record.url
    return f"http://{LOCAL_HOST}:{settings.search.port or 9200}"


def local_search_or_url(settings: Settings, state_dir: Path) -> AbstractContextManager[str]:
    """``settings.opensearch_url`` if set, else a new node in ``state_dir`` (free ports).

    The node is stopped on exit. What the test suite's session fixture uses.
    """
    node = LocalSearch(settings, state_dir=state_dir, port=0, transport_port=0)
    return configured_or_local(settings.opensearch_url, node)


class OpenSearchJars(MavenJars):
    """OpenSearch's jars for one version of ``opensearch/pom.xml``, resolved into a cache."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__(
            cache_dir,
            _search_files() / "pom.xml",
            cache_name="opensearch-jars",
            product="OpenSearch",
            version_property="opensearch.version",
            error=SearchError,
        )


class _Launcher:
    """``RlpulseNode.java`` compiled against one set of jars, cached by source and pom digest."""

    def __init__(self, cache_dir: Path, jars: OpenSearchJars) -> None:
        self.source = _search_files() / f"{LAUNCHER_CLASS}.java"
        digest = hashlib.sha256(self.source.read_bytes() + jars.directory.name.encode())
        self.directory = cache_dir / "opensearch-launcher" / digest.hexdigest()[:12]

    def ready(self) -> bool:
        return (self.directory / f"{LAUNCHER_CLASS}.class").exists()

    def compile(self, javac: str | None, libs: Path, say: Progress) -> Path:
        """The directory of the compiled class; compiles it first with ``javac`` if needed."""
        if self.ready():
            return self.directory
        if javac is None:
            raise SearchError("javac is needed to compile the OpenSearch launcher")
        say("Compiling the OpenSearch launcher with javac (first run only)")
        staging = self.directory.with_name(self.directory.name + f".tmp-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        command = [javac, "-nowarn", "-cp", f"{libs}/*", "-d", str(staging), str(self.source)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise SearchError(
                f"javac could not compile {self.source}:\n{(result.stdout + result.stderr).strip()}"
            )
        if self.directory.exists():  # another process finished first
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.rename(self.directory)
        return self.directory


class LocalSearch(LocalJavaService[SearchRecord]):
    """One local OpenSearch node whose files live in ``state_dir`` (default ``<home>/search``).

    ``port`` and ``transport_port`` default to the ``search`` settings (9200 and 9300); 0
    picks a free port (what tests use).
    """

    product = "OpenSearch"
    process_noun = "an OpenSearch process"
    record_noun = "node"
    down_command = "rlpulse search down"
    error = SearchError
    log_name = "node.log"

    def __init__(
        self,
        settings: Settings,
        state_dir: Path | None = None,
        port: int | None = None,
        transport_port: int | None = None,
    ) -> None:
        super().__init__(
            state_dir if state_dir is not None else settings.home / "search",
            settings.search.startup_timeout_s,
        )
        self.cache_dir = settings.home
        self.port = settings.search.port if port is None else port
        self.transport_port = (
            settings.search.transport_port if transport_port is None else transport_port
        )
        self.heap = settings.search.heap

    def info(self) -> SearchRecord | None:
        """The recorded node if its process is alive, else None."""
        return SearchRecord.read(self.state_dir)

    def address(self, record: SearchRecord) -> str:
        """The recorded node's REST API."""
        return record.url

    def answers(self, record: SearchRecord, timeout_s: float) -> bool:
        """Whether the recorded node's cluster is green or yellow, said within ``timeout_s``."""
        return self.health(record.url, timeout_s) in READY_STATUSES

    def health(self, url: str, timeout_s: float = 5.0) -> str | None:
        """The cluster's status at ``url`` (green, yellow, red), or None when nothing answers."""
        try:
            status, body = request_json("GET", f"{url}/_cluster/health", timeout_s=timeout_s)
        except OSError:
            return None
        if status != 200 or not isinstance(body, dict):
            return None
        return str(body.get("status"))

    def describe(self, record: SearchRecord) -> str:
        """Where the running node is, and its cluster's health."""
        health = self.health(record.url)
        state = "not answering" if health is None else f"up (cluster {health})"
        return (
            f"OpenSearch {record.version} is {state} at {record.url} "
            f"(pid {record.pid}, heap {record.heap}, log {record.log_file})"
        )

    def _start(self, say: Progress) -> tuple[subprocess.Popen[bytes], SearchRecord]:
        """Resolve the jars, compile the launcher, configure and launch a node, and record it."""
        jars = OpenSearchJars(self.cache_dir)
        launcher = _Launcher(self.cache_dir, jars)
        needed = [] if launcher.ready() else ["javac"]
        needed += [] if jars.ready() else ["mvn"]
        tools = require_tools(needed, "the local OpenSearch node", SearchError) if needed else {}
        java = find_java("the local OpenSearch node", SearchError, say)
        http_port = self.port or free_port()
        transport_port = self.transport_port or free_port()
        self._refuse_taken(
            ((http_port, LOCAL_HOST, "--port"), (transport_port, LOCAL_HOST, "--transport-port"))
        )
        libs = jars.resolve(say)
        classes = launcher.compile(tools.get("javac"), libs, say)
        home = self._write_config(http_port, transport_port)
        url = f"http://{LOCAL_HOST}:{http_port}"
        say(f"Starting OpenSearch {jars.version} on {url} (heap {self.heap})")
        options = [
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-Dfile.encoding=UTF-8",
            "-Dlog4j2.shutdownHookEnabled=false",  # the node logs until it has closed
            f"-Dlog4j2.configurationFile={_search_files() / 'log4j2.properties'}",
        ]
        command = self.java_command(
            java.path,
            LAUNCHER_CLASS,
            str(home),
            classpath=[f"{libs}/*", str(classes)],
            options=options,
        )
        process = self._spawn(command)
        info = SearchRecord(
            pid=process.pid,
            log_file=str(self.log_file),
            started_ns=time.time_ns(),
            url=url,
            http_port=http_port,
            transport_port=transport_port,
            version=jars.version,
            heap=self.heap,
        )
        info.write(self.state_dir)
        return process, info

    def _ready(self, record: SearchRecord) -> None:
        """New indices get no replica (one node has nowhere to put one): green, not yellow."""
        body = {"persistent": {"cluster.default_number_of_replicas": 0}}
        status, answer = request_json("PUT", f"{record.url}/_cluster/settings", body)
        if status != 200:
            raise SearchError(f"OpenSearch refused a cluster setting at {record.url}: {answer}")

    def _write_config(self, http_port: int, transport_port: int) -> Path:
        """``<state>/config/opensearch.yml``, rewritten at each start; the node's home."""
        home = self.state_dir
        (home / "config").mkdir(parents=True, exist_ok=True)
        (home / "logs").mkdir(parents=True, exist_ok=True)
        settings = {
            "cluster.name": CLUSTER_NAME,
            "node.name": CLUSTER_NAME,
            "path.data": str(home / "data"),
            "path.logs": str(home / "logs"),
            "discovery.type": "single-node",
            "network.host": LOCAL_HOST,
            "http.port": http_port,
            "transport.port": transport_port,
            # A nearly full disk shared with other work must not make shards unassigned.
            "cluster.routing.allocation.disk.threshold_enabled": False,
        }
        text = "# Written by `rlpulse search up` at each start; edits are lost.\n" + "".join(
            f"{key}: {json.dumps(value)}\n" for key, value in settings.items()
        )
        (home / "config" / "opensearch.yml").write_text(text)
        return home
