"""`rlpulse search up|down|status` on a fresh home, the session's node, and the failure messages.

The node is real OpenSearch 2.19.6 from Maven's jars; every answer comes from its REST API.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from rlpulse.local.opensearch import request_json
from rlpulse.transport.bootstrap import pid_alive

REPO = Path(__file__).resolve().parents[2]
INSTALL = "openjdk-17-jdk-headless maven"
MAPPING = {
    "mappings": {
        "properties": {
            "run_id": {"type": "keyword"},
            "level": {"type": "keyword"},
            "step": {"type": "integer"},
            "rank": {"type": "integer"},
            "message": {"type": "text"},
        }
    }
}


def rlpulse(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlpulse", *args],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "250"},
        cwd=REPO,
        timeout=300,
        check=False,
    )


def call(method: str, url: str, body: Any = None) -> Any:
    """A REST call that must succeed; its JSON answer."""
    status, answer = request_json(method, url, body)
    assert 200 <= status < 300, (method, url, status, answer)
    return answer


@pytest.mark.slow
def test_up_in_a_fresh_home_finds_what_it_indexed_then_status_and_down(tmp_path: Path) -> None:
    env = {**os.environ, "RLPULSE_HOME": str(tmp_path / "home")}
    started = time.monotonic()
    up = rlpulse("search", "up", "--port", "0", "--transport-port", "0", env=env)
    took = time.monotonic() - started
    assert up.returncode == 0, up.stdout + up.stderr
    found = re.search(
        r"OpenSearch 2\.19\.6 is up at (http://127\.0\.0\.1:\d+) \(pid (\d+)", up.stdout
    )
    assert found, up.stdout
    url, pid = found.group(1), int(found.group(2))
    print(f"first `search up` (Maven, javac, start): {took:.1f} s")
    try:
        for step in ("Resolving OpenSearch 2.19.6 jars", "Compiling the OpenSearch launcher"):
            assert step in up.stderr, up.stderr  # progress lines, first run only
        assert f"Starting OpenSearch 2.19.6 on {url} (heap 512m)" in up.stderr
        state = tmp_path / "home" / "search"
        assert (state / "data").is_dir() and (state / "logs" / "node.log").is_file()

        again = rlpulse("search", "up", env=env)
        assert again.returncode == 0 and url in again.stdout, again.stdout + again.stderr
        assert "Reusing OpenSearch" in again.stderr

        status = rlpulse("search", "status", env=env)
        assert status.returncode == 0, status.stdout
        assert f"is up (cluster green) at {url} (pid {pid}, heap 512m" in status.stdout

        index = f"logs-{uuid.uuid4().hex[:8]}"
        call("PUT", f"{url}/{index}", MAPPING)
        doc = {"run_id": "run-7", "level": "ERROR", "step": 15, "rank": 3, "message": "CUDA OOM"}
        call("PUT", f"{url}/{index}/_doc/p-1-42?refresh=true", doc)
        call("PUT", f"{url}/{index}/_doc/p-1-43?refresh=true", {**doc, "step": 16})
        terms = [{"term": {"run_id": "run-7"}}, {"term": {"step": 15}}]
        query = {"query": {"bool": {"filter": terms}}}
        hits = call("POST", f"{url}/{index}/_search", query)["hits"]
        assert hits["total"]["value"] == 1
        assert (hits["hits"][0]["_id"], hits["hits"][0]["_source"]) == ("p-1-42", doc)
        counted = call("GET", f"{url}/{index}/_count?q=level:ERROR%20AND%20message:oom")
        assert counted["count"] == 2  # keyword and analysed text fields, as mapped
        health = call("GET", f"{url}/_cluster/health/{index}")
        assert health["status"] == "green"  # no replica asked of one node
    finally:
        down = rlpulse("search", "down", env=env)
    assert down.returncode == 0 and "OpenSearch stopped" in down.stdout, down.stdout + down.stderr
    assert not pid_alive(pid)
    status = rlpulse("search", "status", env=env)
    assert status.returncode == 1 and "OpenSearch is down" in status.stdout
    assert rlpulse("search", "down", env=env).stdout.strip() == "OpenSearch was not running"


def test_the_session_node_keeps_one_document_per_id(opensearch_url: str) -> None:
    """The contract an indexer builds exactly-once on: the same id again replaces, never adds."""
    index = f"logs-{uuid.uuid4().hex[:8]}"
    call("PUT", f"{opensearch_url}/{index}", MAPPING)
    lines: list[dict[str, Any]] = []
    for seq in range(100):
        lines.append({"index": {"_index": index, "_id": f"producer-a-{seq}"}})
        lines.append({"run_id": "run-9", "level": "INFO", "step": seq // 10, "message": f"m{seq}"})
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    first = call("POST", f"{opensearch_url}/_bulk?refresh=true", body)
    replayed = call("POST", f"{opensearch_url}/_bulk?refresh=true", body)  # a restart's replay
    assert not first["errors"] and not replayed["errors"]
    assert {item["index"]["result"] for item in first["items"]} == {"created"}
    assert {item["index"]["result"] for item in replayed["items"]} == {"updated"}
    assert call("GET", f"{opensearch_url}/{index}/_count")["count"] == 100
    step_3 = call("GET", f"{opensearch_url}/{index}/_count?q=run_id:run-9%20AND%20step:3")
    assert step_3["count"] == 10


def _path_with(tmp_path: Path, *tools: str) -> str:
    """A PATH directory holding only links to ``tools``."""
    directory = tmp_path / "bin"
    directory.mkdir()
    for tool in tools:
        found = shutil.which(tool)
        assert found is not None, f"{tool} is not on PATH: apt-get install {INSTALL}"
        (directory / tool).symlink_to(found)
    return str(directory)


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ((), "javac and mvn are not on PATH; the local OpenSearch node needs a Java 17 JDK "
         "and Maven (apt-get install openjdk-17-jdk-headless maven)."),
        (("mvn",), "javac is not on PATH; the local OpenSearch node needs a Java 17 JDK "
         "(apt-get install openjdk-17-jdk-headless)."),
        (("javac",), "mvn is not on PATH; the local OpenSearch node needs Maven "
         "(apt-get install maven)."),
    ],
    ids=["nothing", "no-javac", "no-mvn"],
)  # fmt: skip
def test_a_missing_tool_is_one_sentence_naming_what_installs_it(
    tmp_path: Path, tools: tuple[str, ...], message: str
) -> None:
    env = {**os.environ, "PATH": _path_with(tmp_path, *tools), "RLPULSE_HOME": str(tmp_path / "h")}
    result = rlpulse("search", "up", "--port", "0", "--transport-port", "0", env=env)
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: {message}"
    assert not (tmp_path / "h" / "search" / "state.json").exists()


def test_a_port_in_use_is_refused(tmp_path: Path) -> None:
    env = {**os.environ, "RLPULSE_HOME": str(tmp_path / "home")}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = rlpulse("search", "up", "--port", str(port), "--transport-port", "0", env=env)
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr
    assert "--port" in result.stderr and "Traceback" not in result.stderr
