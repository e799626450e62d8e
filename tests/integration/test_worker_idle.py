"""A healthy worker that has gone idle logs no ERROR.

faust checks every assigned partition for a stalled stream once ``worker.stall_after_s`` has
passed (300 s by default: shortened to 3 s here), every 2.5 commit intervals (``worker.
commit_interval_s``, 2.8 s by default: 1 s here). A worker that joined a short run and then sat
idle must not report its tables' changelogs, which no stream reads, as stalled.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers import EventLogger
from rlpulse.schemas.topics import Topics
from tests.kafka import settings_at

pytestmark = [pytest.mark.broker, pytest.mark.slow]

STALL_AFTER_S = 3.0
COMMIT_INTERVAL_S = 1.0  # 2.8 s by default
IDLE_S = 9.0  # more than three of faust's check intervals (2.5 x the commit interval)


def test_an_idle_worker_logs_no_error(kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> None:
    worker = WorkerProcess(
        kafka_bootstrap,
        topics.prefix,
        tmp_path / "worker.log",
        partitions=3,
        grace_s=2.0,
        env={
            "RLPULSE_WORKER__STALL_AFTER_S": str(STALL_AFTER_S),
            "RLPULSE_WORKER__COMMIT_INTERVAL_S": str(COMMIT_INTERVAL_S),
        },
    )
    try:
        worker.start()
        worker.wait_consuming(timeout_s=90.0)
        settings = settings_at(kafka_bootstrap, topics)
        with EventLogger("idle-run", settings=settings) as logger:
            for step in range(1, 6):
                logger.log({"kl_divergence": 0.1, "reward_mean": 1.0}, step, "rollout")
            assert logger.flush(30.0) == 0
        time.sleep(IDLE_S)
        assert worker.alive()
        log = worker.log_file.read_text(errors="replace")
        errors = [line for line in log.splitlines() if "ERROR" in line]
        assert errors == [], "\n".join(errors[:20])
    finally:
        worker.stop()
