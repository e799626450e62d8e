"""Shared fixtures: real Kafka, OpenSearch and S3Proxy for the session, fresh topics per test.

Each service starts once per session (once in each pytest-xdist worker process that runs a
test asking for it), on free ports, the first time a test asks for it.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlpulse.local.broker import bootstrap_or_local_broker
from rlpulse.local.opensearch import local_search_or_url
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.transport.topics import ensure_topics
from tests.kafka import settings_at
from tests.support.s3proxy import S3Proxy

QUICK_JIT = '["-XX:TieredStopAtLevel=1"]'
"""The JVM option of every broker the tests start: the quick compiler only.

The brokers were 40 % of the suite's CPU, most of it compiling Kafka's code again in each
short-lived JVM; with the quick compiler alone the cluster tests took half the CPU. What is
tested (Kafka's behaviour) is the same. ``RLPULSE_BROKER__JVM_OPTIONS`` set beforehand wins.
"""


AGENT_IDLE_EXIT_S = "1"
"""How long the host agents the tests' loggers start stay once their writers are gone (the
default is 10 minutes): :func:`no_agent_left` waits for each to exit by itself."""
AGENT_EXIT_WAIT_S = 20.0


def pytest_configure() -> None:
    """Every broker a test starts, in this process or a child, compiles with ``QUICK_JIT``;
    every host agent exits a second after its last writer."""
    os.environ.setdefault("RLPULSE_BROKER__JVM_OPTIONS", QUICK_JIT)
    os.environ.setdefault("RLPULSE_AGENT__IDLE_EXIT_S", AGENT_IDLE_EXIT_S)


def agents_of(nodeid: str) -> dict[int, str]:
    """The host agents running that a process of test ``nodeid`` started: pid -> command.

    Every process a test starts inherits ``PYTEST_CURRENT_TEST``, and so do the agents its
    loggers start, detached as they are.
    """
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if "delivery.agent_process" not in command and "rlpulse agent" not in command:
                continue
            environment = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        tag = b"PYTEST_CURRENT_TEST=" + nodeid.encode() + b" "
        if any(variable.startswith(tag) for variable in environment):
            found[int(entry.name)] = command.strip()
    return found


@pytest.fixture(autouse=True)
def no_agent_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """The suite leaves no host agent running: each exits by itself once its test's writers
    are gone (``agent.idle_exit_s``); one still running after that fails the test."""
    yield
    nodeid = request.node.nodeid
    deadline = time.monotonic() + AGENT_EXIT_WAIT_S
    left = agents_of(nodeid)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = agents_of(nodeid)
    said = {pid: _log_tail(pid) for pid in left}
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    if left:
        pytest.fail(
            f"host agents still ran {AGENT_EXIT_WAIT_S:g} s after the test (a logger left "
            f"open keeps its agent; so do records it cannot send): {left}; their logs end: "
            f"{said}"
        )


def _log_tail(pid: int) -> list[str]:
    """The last lines of what a detached agent logs (its stderr is its log file)."""
    try:
        return Path(os.readlink(f"/proc/{pid}/fd/2")).read_text().splitlines()[-5:]
    except OSError:
        return []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow scenarios first, in collection order otherwise; the browser's tests last.

    The suite runs on several worker processes (pytest-xdist, ``addopts`` in pyproject.toml),
    each taking the next test when it is free: with the long ones handed out first, the
    workers finish together instead of one of them running a long test alone at the end.
    The tests that drive Chromium (``browser``) are slow but handed out last: beside the
    fault scenarios that run first, its CPU made a restarted worker of test_cluster.py take
    28 s instead of 10 to consume (2 of 3 full runs missed that test's bound).
    """

    def order(item: pytest.Item) -> int:
        if item.get_closest_marker("browser") is not None:
            return 2
        return 0 if item.get_closest_marker("slow") is not None else 1

    items.sort(key=order)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap address of a real broker: ``RLPULSE_BOOTSTRAP``, or one started for the session."""
    settings = Settings()
    state_dir = settings.home / f"test-broker-{uuid.uuid4().hex[:8]}"
    with bootstrap_or_local_broker(settings, state_dir) as bootstrap:
        yield bootstrap


@pytest.fixture
def topics(kafka_bootstrap: str) -> Topics:
    """A fresh set of rlpulse topics, created on the session broker."""
    names = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}")
    ensure_topics(settings_at(kafka_bootstrap), names, partitions=3)
    return names


@pytest.fixture(scope="session")
def opensearch_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """OpenSearch's REST API: ``RLPULSE_OPENSEARCH_URL``, or a node started for the session."""
    settings = Settings()
    state_dir = tmp_path_factory.mktemp("opensearch")
    with local_search_or_url(settings, state_dir) as url:
        yield url


@pytest.fixture(scope="session")
def s3proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Proxy]:
    """A real S3-compatible server (S3Proxy, filesystem backend) started for the session."""
    with S3Proxy(Settings().home, tmp_path_factory.mktemp("s3proxy")) as server:
        yield server
