"""Readers started before any worker: the archiver and the exporter create the topics, say so."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from rlpulse.archive.catalog import query_archive
from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.local.child_process import free_port
from rlpulse.local.exporter_process import ExporterProcess
from rlpulse.producers import EventLogger
from rlpulse.schemas.topics import Topics
from tests.kafka import settings_at
from tests.waiting import wait_for

pytestmark = pytest.mark.broker

SAID = "created the topics no worker had created yet: "


def created(log_text: str) -> set[str]:
    """The topic names after :data:`SAID` (the console wraps long lines)."""
    return {word.rstrip(",") for word in log_text.split(SAID, 1)[1].split()}


def test_an_archiver_started_before_any_worker_creates_the_topics_and_says_so(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = Topics(prefix=f"early-{uuid.uuid4().hex[:8]}")  # no worker ever ran with it
    root = tmp_path / "archive"
    with ArchiverProcess(
        kafka_bootstrap, topics.prefix, root, tmp_path / "archiver.log", {"archive.roll_s": 0.3}
    ) as archiver:
        wait_for(lambda: SAID in archiver.log_text(), "the archiver to say what it created")
        with EventLogger("run-early", settings=settings_at(kafka_bootstrap, topics)) as logger:
            logger.log({"loss": 1.0}, 1)
            assert logger.flush(30) == 0  # the topic exists: delivered, not spooled
        wait_for(
            lambda: query_archive(str(root), topics, "SELECT count(*) FROM events")[1][0][0] == 1,
            "the event in the archive",
        )
    assert {topics.events, topics.acks, topics.logs} <= created(archiver.log_text())


def test_an_exporter_started_before_any_worker_creates_the_topics_and_says_so(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = Topics(prefix=f"early-{uuid.uuid4().hex[:8]}")
    log_file = tmp_path / "exporter.log"
    with ExporterProcess(kafka_bootstrap, topics.prefix, log_file, free_port()) as exporter:
        exporter.wait_ready()
        text = log_file.read_text()
    assert {topics.events, topics.steps, topics.acks} <= created(text)
