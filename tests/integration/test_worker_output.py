"""What ``rlpulse worker`` writes when its output is a file, not a terminal (rlpulse issue 20)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpulse.local.worker_process import WorkerProcess
from rlpulse.schemas.topics import Topics

pytestmark = pytest.mark.broker


def test_a_worker_writing_to_a_file_writes_no_terminal_codes(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    with WorkerProcess(kafka_bootstrap, topics.prefix, log, partitions=3) as worker:
        worker.wait_consuming()
    text = log.read_text(errors="replace")
    assert "rules from seed" in text
    assert "\x1b" not in text and "\b" not in text, repr(text[:400])


def test_a_stop_that_outlasts_its_bound_ends_the_process_and_says_so(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """``worker.stop_timeout_s`` bounds a stop; set below what faust's own stop takes here."""
    worker = WorkerProcess(
        kafka_bootstrap,
        topics.prefix,
        tmp_path / "worker.log",
        partitions=3,
        env={"RLPULSE_WORKER__STOP_TIMEOUT_S": "0.001"},
    )
    with worker:
        worker.wait_consuming()
        assert worker.stop(timeout_s=20.0) == 0
    assert not worker.killed_after_timeout
    assert "the worker did not stop within 0.001 s (worker.stop_timeout_s)" in worker.log_text()
