"""Shared fixtures: real Kafka, OpenSearch and S3Proxy for the session, fresh topics per test.

Each service starts once per session (once in each pytest-xdist worker process that runs a
test asking for it), on free ports, the first time a test asks for it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from rlpulse.local.broker import bootstrap_or_local_broker
from rlpulse.local.opensearch import local_search_or_url
from rlpulse.local.s3proxy import S3Proxy
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.transport.topics import ensure_topics
from tests.kafka import settings_at

QUICK_JIT = '["-XX:TieredStopAtLevel=1"]'
"""The JVM option of every broker the tests start: the quick compiler only.

The brokers were 40 % of the suite's CPU, most of it compiling Kafka's code again in each
short-lived JVM; with the quick compiler alone the cluster tests took half the CPU. What is
tested (Kafka's behaviour) is the same. ``RLPULSE_BROKER__JVM_OPTIONS`` set beforehand wins.
"""


def pytest_configure() -> None:
    """Every broker a test starts, in this process or a child, compiles with ``QUICK_JIT``."""
    os.environ.setdefault("RLPULSE_BROKER__JVM_OPTIONS", QUICK_JIT)


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
