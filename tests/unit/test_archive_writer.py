"""The archiver's writer thread, without Kafka: order, bounded queue, failures, waiting.

:class:`FlushWriter` is driven with jobs that record what ran (gated by events where the
test needs the thread to be busy); the archiver's use of it writes real flushes to a
``tmp_path`` archive, with the store's ``stage`` or ``commit`` slowed or failing.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition

from rlpulse.archive.exceptions import ArchiveError
from rlpulse.archive.layout import plan_resume
from rlpulse.archive.store import ArchiveStore, StagedFile
from rlpulse.settings import ArchiveSettings, Settings
from rlpulse.streams.archiver.archiver import Archiver
from rlpulse.streams.archiver.writer import FlushWriter
from tests.unit.test_archive import buffered, events, tables

WAIT_S = 10.0


def recorder(
    done: list[int], number: int, gate: threading.Event | None = None
) -> Callable[[], None]:
    """A job that waits for ``gate`` (if any), then appends ``number`` to ``done``."""

    def job() -> None:
        if gate is not None:
            assert gate.wait(WAIT_S)
        done.append(number)

    return job


def started(depth: int = 2) -> FlushWriter:
    writer = FlushWriter(depth)
    writer.start()
    return writer


def test_jobs_run_in_the_order_submitted_on_one_named_daemon_thread() -> None:
    writer = started()
    done: list[int] = []
    threads: set[threading.Thread] = set()

    def job(number: int) -> Callable[[], None]:
        def run() -> None:
            threads.add(threading.current_thread())
            time.sleep(0.001 * (number % 3))  # uneven durations: order is still kept
            done.append(number)

        return run

    for number in range(50):
        writer.submit(job(number))
    writer.wait()
    assert done == list(range(50))
    (thread,) = threads
    assert thread.name == "rlpulse-archive-writer" and thread.daemon
    assert thread is not threading.current_thread()
    writer.close()
    assert not thread.is_alive()


def test_submit_returns_at_once_until_depth_jobs_wait_then_blocks() -> None:
    writer = started(depth=2)
    gate = threading.Event()
    done: list[int] = []
    writer.submit(recorder(done, 0, gate))  # the thread takes it and waits at the gate
    deadline = time.monotonic() + WAIT_S
    while writer._jobs.qsize() and time.monotonic() < deadline:
        time.sleep(0.001)
    writer.submit(recorder(done, 1))
    writer.submit(recorder(done, 2))  # two waiting: the queue is full
    returned = threading.Event()

    def third() -> None:
        writer.submit(recorder(done, 3))
        returned.set()

    submitter = threading.Thread(target=third)
    submitter.start()
    assert not returned.wait(0.2)  # blocked while the writer is behind
    gate.set()
    assert returned.wait(WAIT_S)
    submitter.join()
    writer.wait()
    assert done == [0, 1, 2, 3]
    writer.close()


def test_wait_returns_only_when_every_job_submitted_has_run() -> None:
    writer = started()
    gate = threading.Event()
    done: list[int] = []
    writer.submit(recorder(done, 0, gate))
    writer.submit(recorder(done, 1))
    timer = threading.Timer(0.2, gate.set)
    timer.start()
    writer.wait()
    assert done == [0, 1]
    timer.join()
    writer.close()


def test_a_failed_job_stops_every_later_one_and_is_raised_to_the_caller() -> None:
    writer = started()
    gate = threading.Event()
    done: list[int] = []
    failure = OSError(28, "No space left on device")

    def fails() -> None:
        assert gate.wait(WAIT_S)
        raise failure

    writer.submit(recorder(done, 0))
    writer.submit(fails)
    writer.submit(recorder(done, 2))  # queued behind the failing one
    gate.set()
    with pytest.raises(OSError, match="No space") as raised:
        writer.wait()
    assert raised.value is failure and writer.error is failure
    with pytest.raises(OSError, match="No space"):
        writer.check()
    with pytest.raises(OSError, match="No space"):
        writer.submit(recorder(done, 3))
    writer.close()  # does not raise: the failure was handed over already
    assert done == [0]


def test_close_lets_the_queued_jobs_run_and_can_be_repeated() -> None:
    writer = started()
    gate = threading.Event()
    done: list[int] = []
    writer.submit(recorder(done, 0, gate))
    writer.submit(recorder(done, 1))
    gate.set()
    writer.close()
    assert done == [0, 1]
    writer.close()
    writer.wait()  # nothing left to wait for
    with pytest.raises(RuntimeError, match="not running"):
        writer.submit(recorder(done, 2))


# -- the archiver's flushes on the writer thread ------------------------------------------


def archiver_writing(tmp_path: Path) -> tuple[Archiver, FlushWriter]:
    """An archiver with its writer thread as :meth:`Archiver.run` sets it up, no consumer."""
    settings = Settings(prefix="unit", archive=ArchiveSettings(root=str(tmp_path / "archive")))
    archiver = Archiver(settings, say=lambda _line: None)
    writer = archiver._writer = started()
    return archiver, writer


def test_a_revoked_partition_s_flush_is_renamed_and_its_hint_taken_before_revoke_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archiver, writer = archiver_writing(tmp_path)
    store = archiver.store
    commit = store.commit

    def slow_commit(staged: list[StagedFile]) -> None:
        time.sleep(0.3)
        commit(staged)

    monkeypatch.setattr(store, "commit", slow_commit)
    table = tables()["events"]
    key = (table.topic, 0)
    archiver._expected[key] = 0  # assigned
    archiver._buffers[key] = buffered(table, 0, events(0, 1, 2))
    # The callback's consumer argument is not used: a real client that never connects.
    unused = Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "unit"})
    try:
        archiver._on_revoke(unused, [TopicPartition(table.topic, 0)])
    finally:
        unused.close()
    assert plan_resume(store.files(table.topic), 0).next_offset == 3  # renamed by then
    assert key not in archiver._buffers and key not in archiver._expected
    assert (archiver.counts.flushes, archiver.counts.records) == (1, 3)
    # Its hint was taken by the consuming thread (here without a consumer: none committed).
    assert not archiver._hints
    writer.close()


def test_after_a_failed_flush_no_later_flush_of_the_partition_is_renamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archiver, writer = archiver_writing(tmp_path)
    store = archiver.store
    stage = store.stage
    gate = threading.Event()
    calls = 0

    def full_once(relative: str, data: pa.Table, compression: str) -> StagedFile:
        nonlocal calls
        calls += 1
        if calls == 1:
            assert gate.wait(WAIT_S)
            raise ArchiveError("cannot write: disk full")
        return stage(relative, data, compression)

    monkeypatch.setattr(store, "stage", full_once)
    table = tables()["events"]
    key = (table.topic, 0)
    archiver._buffers[key] = buffered(table, 0, events(0, 1))
    archiver._flush(archiver._buffers[key])
    archiver._buffers[key] = buffered(table, 0, events(2, 3))
    archiver._flush(archiver._buffers[key])  # queued behind the one that fails
    assert archiver._expected[key] == 4  # set at once, on the consuming thread
    gate.set()
    with pytest.raises(ArchiveError, match="disk full"):
        archiver._written()
    with pytest.raises(ArchiveError, match="disk full"):
        archiver._buffers[key] = buffered(table, 0, events(4))
        archiver._flush(archiver._buffers[key])
    assert calls == 1  # the later flushes were never staged
    assert plan_resume(store.files(table.topic), 0).next_offset is None  # resumes at 0
    assert archiver.counts.flushes == 0 and not archiver._hints
    writer.close()


def test_staging_survives_a_prune_removing_the_directories_it_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prune (on the consuming thread) may empty and remove a directory as it is made."""
    store = ArchiveStore(str(tmp_path))
    table = tables()["events"]
    (planned,) = buffered(table, 0, events(0, 1)).flush_plan()
    makedirs = os.makedirs
    raced = 0

    def pruned_meanwhile(name: str, exist_ok: bool = False) -> None:
        nonlocal raced
        if raced < 2:  # its parent went between makedirs' steps
            raced += 1
            raise FileNotFoundError(2, "No such file or directory", name)
        makedirs(name, exist_ok=exist_ok)

    monkeypatch.setattr("rlpulse.archive.store.os.makedirs", pruned_meanwhile)
    store.commit([store.stage(planned.relative, planned.table, "zstd")])
    assert raced == 2
    assert plan_resume(store.files(table.topic), 0).next_offset == 2
