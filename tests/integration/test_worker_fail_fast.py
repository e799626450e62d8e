"""A write the worker cannot make ends the process; its restart recovers from the changelogs.

The steps topic is deleted under a running worker (as an operator's mistake, or an ACL revoked,
would make it unwritable). The worker's next summary cannot be delivered within
``worker.publish_timeout_s`` (5 s here): the worker logs one line with the cause and exits with
status 75, instead of faust restarting its agent inside the process with tables already ahead
of what was published. A new worker, once the topic is back, publishes the summaries that never
left — each exactly once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from rlpulse.local.broker import tail
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers import EventLogger
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import StepSummary
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.streams.worker.app import EXIT_PUBLISH_FAILED
from rlpulse.transport.topics import delete_topics, ensure_topics, topic_exists
from tests.integration.topic_reader import read_until
from tests.kafka import settings_at

pytestmark = [pytest.mark.broker, pytest.mark.slow]

RUN = "fail-fast-run"


def summaries(bootstrap: str, topics: Topics, steps: set[int]) -> list[StepSummary]:
    codec = default_codec()
    return read_until(
        bootstrap,
        topics.steps,
        codec.decode_summary,
        lambda found: {s["step"] for s in found} >= steps,
        timeout_s=90.0,
        keep=lambda s: s["run_id"] == RUN,
    )


def wait_gone(settings: Settings, topic: str, timeout_s: float = 30.0) -> None:
    probe = Producer({"bootstrap.servers": settings.bootstrap})
    deadline = time.monotonic() + timeout_s
    while topic_exists(probe, topic, 5.0) is not False:
        assert time.monotonic() < deadline, f"{topic} still exists {timeout_s:.0f} s after deletion"
        time.sleep(0.1)


def test_a_failed_publish_ends_the_worker_and_the_restart_publishes_what_never_left(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    settings = settings_at(kafka_bootstrap, topics)
    env = {"RLPULSE_WORKER__PUBLISH_TIMEOUT_S": "5", "RLPULSE_WORKER__LOG_LEVEL": "info"}
    first = WorkerProcess(
        kafka_bootstrap, topics.prefix, tmp_path / "first.log", partitions=3, env=env
    )
    second = WorkerProcess(
        kafka_bootstrap, topics.prefix, tmp_path / "second.log", partitions=3, env=env
    )
    logger = EventLogger(RUN, settings=settings)
    try:
        first.start()
        first.wait_consuming(timeout_s=90.0)
        for step in (1, 2, 3):
            logger.log({"reward_mean": 1.0}, step, "rollout")
        assert logger.flush(30.0) == 0
        assert {s["step"] for s in summaries(kafka_bootstrap, topics, {1, 2, 3})} == {1, 2, 3}

        delete_topics(settings, [topics.steps])
        # A deleted topic's partitions go some milliseconds after the deletion is accepted; a
        # summary the broker took in that window would be lost with the topic, not refused.
        wait_gone(settings, topics.steps)
        for step in (4, 5):
            logger.log({"reward_mean": 1.0}, step, "rollout")
        assert logger.flush(30.0) == 0
        deadline = time.monotonic() + 120
        while first.alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not first.alive(), "the worker kept running without its steps topic"
        assert first.stop() == EXIT_PUBLISH_FAILED
        log = first.log_file.read_text()
        assert f"the worker exits with status {EXIT_PUBLISH_FAILED}" in log

        ensure_topics(settings, topics, partitions=3)  # the operator puts the topic back
        second.start()
        second.wait_consuming(timeout_s=90.0)
        try:
            after = summaries(kafka_bootstrap, topics, {4, 5})
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- second worker\n{tail(second.log_file, 40)}") from exc
        assert sorted((s["step"], s["revision"]) for s in after) == [(4, 1), (5, 1)]
    finally:
        logger.close(10)
        first.stop()
        second.stop()
