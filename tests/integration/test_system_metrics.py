"""RunLink's opt-in system sampling: stage ``system`` events, every interval, until close.

The samples number themselves (0, 1, 2, ...); the training step stays the trainer's: the
``run_end`` sent at close and a text record logged without a step carry it.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from rlpulse.producers import RunLink
from rlpulse.schemas import default_codec
from rlpulse.schemas.records import TrainerEvent
from rlpulse.schemas.topics import Topics
from tests.integration.test_producer_faults import log_records_on_topic
from tests.kafka import read_to_end, settings_at
from tests.waiting import wait_for

pytestmark = pytest.mark.broker


def events_of(bootstrap: str, topics: Topics, run_id: str) -> list[TrainerEvent]:
    """The run's events on the topic (every link was closed: all of them are there)."""
    codec = default_codec()
    raw = [message.value() for message in read_to_end(bootstrap, topics.events)]
    return [e for e in map(codec.decode_event, raw) if e["run_id"] == run_id]


def test_each_rank_samples_its_process_off_the_training_thread(
    kafka_bootstrap: str, topics: Topics
) -> None:
    interval_s = 0.2
    sampled = settings_at(
        kafka_bootstrap, topics, producer={"system_metrics_interval_s": interval_s}
    )
    links = [RunLink("sampled", rank=r, world_size=2, settings=sampled) for r in range(2)]
    quiet = RunLink("quiet", settings=settings_at(kafka_bootstrap, topics))
    for link in (*links, quiet):
        link.log({"loss": 1.0}, 0, "actor")
    samplers = [link.system for link in links]
    assert None not in samplers and quiet.system is None
    # From here the training thread calls nothing of rlpulse until close.
    logged_at = time.time_ns()
    before = [sampler.samples if sampler is not None else 0 for sampler in samplers]
    wait_for(
        lambda: all(
            sampler is not None and sampler.samples >= max(5, seen + 3)
            for sampler, seen in zip(samplers, before, strict=True)
        ),
        "five system samples on each rank, three of them while the training thread waits",
        timeout_s=60.0,
        every_s=0.05,
    )
    for link in (*links, quiet):
        link.close()
    closed_at = time.time_ns()
    system = [e for e in events_of(kafka_bootstrap, topics, "sampled") if e["stage"] == "system"]
    for rank in (0, 1):
        mine = [e for e in system if e["rank"] == rank]
        assert len(mine) >= 5, mine
        assert [e["step"] for e in mine] == list(range(len(mine)))  # the sample index
        stamps = [e["timestamp_ns"] for e in mine]
        assert all(stamp < closed_at for stamp in stamps)
        # Taken while the training thread only waited (those after the one that may have been
        # under way at logged_at), and never closer than the interval (a slow machine makes
        # the gaps longer, never shorter).
        while_waiting = stamps[before[rank] + 1 :]
        assert len(while_waiting) >= 2 and all(stamp > logged_at for stamp in while_waiting)
        gaps_s = [(b - a) / 1e9 for a, b in itertools.pairwise(stamps)]
        assert min(gaps_s) >= 0.9 * interval_s, gaps_s
        cpu = [e["metrics"]["process_cpu_seconds_total"] for e in mine]
        assert cpu == sorted(cpu) and cpu[0] > 0
        assert all(e["metrics"]["process_resident_memory_bytes"] > 0 for e in mine)
        assert all(e["world_size"] == 2 for e in mine)
    quiet_events = events_of(kafka_bootstrap, topics, "quiet")
    # off unless set; close() ended the run
    assert [(e["kind"], e["stage"]) for e in quiet_events] == [
        ("metrics", "actor"),
        ("run_end", "trainer"),
    ]


def test_run_end_and_step_less_records_carry_the_training_step_not_the_sample_index(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    producer = {"system_metrics_interval_s": 0.05, "spool_dir": tmp_path / "spool"}
    link = RunLink("stepped", settings=settings_at(kafka_bootstrap, topics, producer=producer))
    system = link.system
    assert system is not None
    for step in range(1, 4):
        link.log({"loss": 1.0 / step}, step, "actor")
    wait_for(lambda: system.samples >= 10, "10 system samples", timeout_s=30.0, every_s=0.02)
    link.log_record("INFO", 20, "trainer", "no step given")
    assert link.close(30) == 0
    events = events_of(kafka_bootstrap, topics, "stepped")
    samples = [e["step"] for e in events if e["stage"] == "system"]
    assert samples == list(range(len(samples))) and len(samples) >= 10  # past step 3
    ends = [(e["step"], e["message"]) for e in events if e["kind"] == "run_end"]
    assert ends == [(3, "closed")]
    records = log_records_on_topic(kafka_bootstrap, topics.logs)
    assert [(r["run_id"], r["message"], r["step"]) for r in records] == [
        ("stepped", "no step given", 3)
    ]
