"""The exporter through a broker outage and a restart: last values served, then caught up.

Runs its own broker (the session's is shared by every test and must stay up): the exporter
must keep serving while that broker is down, and continue by itself when it is back on the
same port; a restarted exporter must serve the same latest values from its lookback.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from rlpulse.local.broker import LocalBroker
from rlpulse.local.child_process import free_port
from rlpulse.local.exporter_process import ExporterProcess
from rlpulse.producers import EventLogger
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.transport.topics import ensure_topics
from tests.kafka import settings_at

pytestmark = pytest.mark.broker

RUN = "recovering"


def log_steps(bootstrap: str, topics: Topics, steps: range) -> None:
    settings = settings_at(bootstrap, topics)
    for rank in range(2):
        with EventLogger(RUN, rank=rank, world_size=2, settings=settings) as logger:
            for step in steps:
                logger.log({"reward_mean": step + rank / 4}, step, "rollout")
            assert logger.flush(timeout_s=30.0) == 0


def wait_value(
    exporter: ExporterProcess, name: str, labels: dict[str, str], want: float, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    got = None
    while time.monotonic() < deadline:
        got = exporter.value(name, labels)
        if got == want:
            return
        time.sleep(0.2)
    pytest.fail(f"{name}{labels} is {got}, not {want}, after {timeout_s:.0f} s")


def test_it_serves_through_an_outage_recovers_and_restarts_from_its_lookback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLPULSE_EXPORTER__LAG_INTERVAL_S", "0.5")
    broker = LocalBroker(Settings(), state_dir=tmp_path / "broker", port=free_port())
    bootstrap = broker.up().bootstrap
    topics = Topics(prefix="recovery")
    ensure_topics(settings_at(bootstrap), topics, partitions=2)
    rank0 = {"run": RUN, "stage": "rollout", "rank": "0"}
    rank1 = {**rank0, "rank": "1"}
    first, second = (
        ExporterProcess(bootstrap, topics.prefix, tmp_path / f"exporter-{n}.log", free_port())
        for n in (1, 2)
    )
    try:
        first.start().wait_ready()
        log_steps(bootstrap, topics, range(1, 4))
        wait_value(first, "rlpulse_reward_mean", rank1, 3.25, timeout_s=30.0)
        wait_value(first, "rlpulse_exporter_kafka_up", {}, 1.0, timeout_s=30.0)

        broker.down()
        wait_value(first, "rlpulse_exporter_kafka_up", {}, 0.0, timeout_s=60.0)
        assert first.alive()
        assert first.value("rlpulse_reward_mean", rank0) == 3.0  # the last values, still served
        assert first.value("rlpulse_reward_mean", rank1) == 3.25

        assert broker.up().bootstrap == bootstrap
        log_steps(bootstrap, topics, range(4, 6))
        wait_value(first, "rlpulse_reward_mean", rank1, 5.25, timeout_s=90.0)
        wait_value(first, "rlpulse_exporter_kafka_up", {}, 1.0, timeout_s=30.0)
        events = {"run": RUN, "host": socket.gethostname(), "kind": "metrics"}
        assert first.value("rlpulse_host_events_total", events) == 10.0
        first.stop()

        second.start().wait_ready()
        assert second.value("rlpulse_reward_mean", rank0) == 5.0
        assert second.value("rlpulse_reward_mean", rank1) == 5.25
        # Counters count what arrived after the start, not the lookback.
        assert second.value("rlpulse_host_events_total", events) is None
    finally:
        first.stop()
        second.stop()
        broker.down()
