"""What ``rlpulse worker`` writes when its output is a file, not a terminal (rlpulse issue 20),
and the line it says after each rebalance about the partitions it holds."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from rlpulse.local.broker import tail
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.schemas.topics import Topics
from rlpulse.transport.topics import ensure_topics
from tests.integration.worker_state import held_partitions, holding_lines, last_holding
from tests.kafka import settings_at
from tests.waiting import wait_for

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


def _said(workers: list[WorkerProcess]) -> str:
    return "\n".join(f"--- {w.log_file.name}\n{tail(w.log_file, 20)}" for w in workers)


@pytest.mark.slow
def test_two_workers_each_say_which_partitions_they_hold_after_each_rebalance(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """``rlpulse worker`` started twice with one prefix (the topics have 3 partitions): each says
    in one line, at the default log level, what it holds after each rebalance."""
    first = WorkerProcess(kafka_bootstrap, topics.prefix, tmp_path / "first.log", partitions=3)
    second = WorkerProcess(kafka_bootstrap, topics.prefix, tmp_path / "second.log", partitions=3)
    group = first.group_id
    workers = [first, second]
    try:
        first.start().wait_consuming()
        alone = f"holding events partitions 0, 1, 2 of 3 (group {group}, 1 member)"
        wait_for(
            lambda: last_holding(first) == alone, f"{alone!r}", 60.0, state=lambda: _said(workers)
        )
        second.start().wait_consuming()

        def shared() -> bool:
            lines = [last_holding(w) for w in workers]
            held = [held_partitions(line) for line in lines]
            return (
                all(line.endswith(f"of 3 (group {group}, 2 members)") for line in lines)
                and held[0] | held[1] == {0, 1, 2}
                and not held[0] & held[1]
            )

        what = "both workers to say they share partitions 0, 1, 2"
        wait_for(shared, what, 60.0, state=lambda: _said(workers))
        time.sleep(3.0)  # ticks and heartbeats go on: no more lines without a rebalance
        said = {w.log_file.name: holding_lines(w) for w in workers}
    finally:
        for worker in workers:
            worker.stop()
    # One line per rebalance: the first worker saw two (alone, then shared), a third only if
    # the group happened to rebalance once more; the second worker joined the shared one.
    assert said["first.log"][0] == alone, _said(workers)
    assert len(said["first.log"]) in (2, 3) and len(said["second.log"]) in (1, 2), said


@pytest.mark.slow
def test_a_worker_beyond_the_partition_count_says_it_holds_none(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """One partition, two workers: one holds it, the other says in one line why it idles."""
    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}")
    ensure_topics(settings_at(kafka_bootstrap), topics, partitions=1)
    workers = [
        WorkerProcess(kafka_bootstrap, topics.prefix, tmp_path / f"{name}.log", partitions=1)
        for name in ("first", "second")
    ]
    group = workers[0].group_id
    holds = f"holding events partition 0 of 1 (group {group}, 2 members)"
    idle = (
        f"holding no events partition: the group {group} has 2 members for 1 partition; "
        "more workers than `worker.partitions` stay idle"
    )
    try:
        for worker in workers:
            worker.start().wait_consuming()
        wait_for(
            lambda: sorted(last_holding(w) for w in workers) == sorted([holds, idle]),
            f"one worker to say {holds!r} and the other {idle!r}",
            60.0,
            state=lambda: _said(workers),
        )
    finally:
        for worker in workers:
            worker.stop()
