"""Local per-rank files: rotation at a size, deletion after the retention, never blocking."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest

from rlpulse.producers import EventHandler, EventLogger
from rlpulse.producers.caller.rankfiles import RankFileSink, rotated_files
from rlpulse.schemas.jsonl import RankLogWriter, RankRecord, list_rank_files, read_rank_logs
from rlpulse.settings import load_settings


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def lines_of(paths: list[Path]) -> list[dict[str, object]]:
    return [json.loads(line) for path in paths for line in path.read_text().splitlines()]


def test_files_rotate_at_the_size_and_keep_every_line_once_in_order(tmp_path: Path) -> None:
    clock = Clock()
    sink = RankFileSink(tmp_path, "rollout", 3, rotation_bytes=1024, retention_s=60, clock=clock)
    for number in range(300):
        sink.put({"step": number, "stage": "rollout", "text": "x" * 20})
        clock.now += 0.001
    assert sink.flush(10)
    sink.close()
    rotated = rotated_files(sink.path)
    assert len(rotated) >= 8
    assert all(path.stat().st_size <= 1024 for path in rotated)
    assert [line["step"] for line in lines_of([*rotated, sink.path])] == list(range(300))
    assert not any(path.name.endswith(".jsonl") for path in rotated)  # tails read live files
    assert sink.written == 300 and sink.dropped == 0


def test_rotated_files_past_the_retention_are_deleted(tmp_path: Path) -> None:
    clock = Clock()
    sink = RankFileSink(tmp_path, "actor", 0, rotation_bytes=1024, retention_s=3600, clock=clock)
    for number in range(100):
        sink.put({"step": number, "pad": "y" * 40})
    assert sink.flush(10)
    old = rotated_files(sink.path)
    assert old
    for path in old:  # rotated long ago
        os.utime(path, (clock.now - 7200, clock.now - 7200))
    clock.now += 1
    assert sorted(sink.sweep()) == sorted(old)
    assert rotated_files(sink.path) == [] and sink.path.exists()
    sink.close()


def test_lines_beyond_the_queue_are_dropped_and_counted(tmp_path: Path) -> None:
    sink = RankFileSink(tmp_path, "t", 0, rotation_bytes=10**9, retention_s=60, queue_max=5)
    sink._thread = object()  # type: ignore[assignment]  # a writer that never runs
    for number in range(8):
        sink.put({"step": number})
    assert sink.dropped == 3


def test_an_event_logger_writes_events_and_records_readers_tell_apart(tmp_path: Path) -> None:
    settings = load_settings(
        {
            "bootstrap": "127.0.0.1:1",
            "producer": {"spool_dir": tmp_path / "spool", "hostname": "node-9"},
            "logging": {"log_dir": tmp_path / "logs", "component": "verl_rollout", "level": "WARN"},
        }
    )
    logger = EventLogger("run-1", rank=2, world_size=4, settings=settings)
    handler = EventHandler(logger)
    log = logging.getLogger("rankfiles-test")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    for step in range(3):
        logger.log({"reward_mean": 1.0 + step}, step, "rollout")
        log.info("below the WARN threshold")
        log.warning("step %d warned", step)
    assert logger.local is not None and logger.local.flush(10)
    logger.close(timeout_s=0)
    assert [(f.component, f.rank) for f in list_rank_files(tmp_path / "logs")] == [
        ("verl_rollout", 2)
    ]
    lines = lines_of([tmp_path / "logs" / "verl_rollout_rank2.jsonl"])
    records = [line for line in lines if line.get("kind") == "log"]
    assert [r["message"] for r in records] == [f"step {s} warned" for s in range(3)]
    assert all(r["hostname"] == "node-9" and r["pid"] == os.getpid() for r in lines)
    assert [r["step"] for r in records] == [0, 1, 2]  # the step of the last metrics event
    metrics = [i for i in read_rank_logs(tmp_path / "logs") if isinstance(i, RankRecord)]
    assert [(m.step, m.metrics) for m in metrics] == [
        (s, {"reward_mean": 1.0 + s}) for s in range(3)
    ]


def test_a_line_the_layout_cannot_hold_is_left_out_counted_and_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The logger's rule is RankLogWriter's: a metric named like a line's field is refused."""
    settings = load_settings(
        {
            "bootstrap": "127.0.0.1:1",
            "producer": {"spool_dir": tmp_path / "spool"},
            "logging": {"log_dir": tmp_path / "logs"},
        }
    )
    logger = EventLogger("run-1", settings=settings)
    with caplog.at_level(logging.WARNING, logger="rlpulse"):
        logger.log({"loss": 1.0}, 1)
        logger.log({"loss": 2.0, "hostname": 3.0}, 2)  # sent, but no line could hold it
        logger.log({"loss": 3.0, "seq": 4.0}, 3)
        logger.log({"loss": 4.0}, 4)
    assert logger.local is not None and logger.local.flush(10)
    logger.close(timeout_s=0)
    assert logger.logged == 4 and logger.refused == {}
    assert logger.local.refused == 2
    assert [line["step"] for line in lines_of([logger.local.path])] == [1, 4]
    warned = [r.getMessage() for r in caplog.records if "is not written to" in r.getMessage()]
    assert len(warned) == 1 and "'hostname' cannot be a metric name" in warned[0]
    with RankLogWriter(tmp_path / "direct", "trainer", 0) as writer, pytest.raises(ValueError):
        writer.write(2, "trainer", {"loss": 2.0, "hostname": 3.0})


def test_the_layouts_writer_rotates_and_sweeps_by_itself(tmp_path: Path) -> None:
    """RankLogWriter is the one writer of rank files: the sink's rotation is its rotation."""
    clock = Clock()
    with RankLogWriter(
        tmp_path, "actor", 1, rotation_bytes=256, retention_s=60, clock=clock
    ) as writer:
        for step in range(20):
            writer.write(step, "actor", {"loss": float(step)})
        assert writer.write_lines([{"kind": "log", "message": "done", "step": 20}]) == 1
    rotated = rotated_files(writer.path)
    assert rotated and all(path.stat().st_size <= 256 for path in rotated)
    steps = [line["step"] for line in lines_of([*rotated, writer.path])]
    assert steps == list(range(21))
    for path in rotated:
        os.utime(path, (clock.now - 120, clock.now - 120))
    with RankLogWriter(tmp_path, "actor", 1, retention_s=60, clock=clock) as again:
        assert sorted(again.sweep()) == sorted(rotated) == sorted(again.deleted)
