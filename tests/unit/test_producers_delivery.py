"""What counts as undeliverable, and what the delivery thread does with it (no broker)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from rlpulse.producers import EventLogger, Settings
from rlpulse.producers.delivery import DeliveryPump, undeliverable
from rlpulse.producers.spool import Spool, SpooledEvent, read_spool_file, spool_files
from rlpulse.transport.clients import new_producer


def unreachable() -> Settings:
    """Settings for a broker that is not there (built per test: the home is the test's own)."""
    return Settings(bootstrap="127.0.0.1:1", prefix="unit")


class FakeMessage:
    def __init__(self, value: bytes) -> None:
        self._value = value

    def topic(self) -> str:
        return "unit.events"

    def key(self) -> bytes:
        return b"run-a"

    def value(self) -> bytes:
        return self._value


def in_spool_mode(pump: DeliveryPump) -> bool:
    return pump.spooling


@pytest.fixture
def pump(tmp_path: Path) -> Iterator[DeliveryPump]:
    spool = Spool(tmp_path, "p1", file_bytes=1 << 20, max_bytes=1 << 20)
    producer = new_producer(unreachable(), "test")
    pump = DeliveryPump(producer, spool, "unit.events", "p1", "test", threading.RLock())
    yield pump
    pump.close(timeout_s=0)


@pytest.mark.parametrize(
    ("code", "spooled"),
    [
        (KafkaError._MSG_TIMED_OUT, True),
        (KafkaError._PURGE_QUEUE, True),
        (KafkaError._PURGE_INFLIGHT, True),
        (KafkaError._TRANSPORT, True),
        (KafkaError.NOT_LEADER_FOR_PARTITION, True),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, True),
        (KafkaError._FATAL, True),
        (KafkaError.MSG_SIZE_TOO_LARGE, False),
        (KafkaError.INVALID_RECORD, False),
    ],
)
def test_undeliverable_is_transport_trouble_not_a_refused_event(code: int, spooled: bool) -> None:
    assert undeliverable(KafkaError(code)) is spooled


def test_failed_reports_switch_to_spool_mode_and_are_spooled_in_seq_order(
    pump: DeliveryPump, tmp_path: Path
) -> None:
    assert not in_spool_mode(pump)
    pump.report(9, None, FakeMessage(b"nine"))  # type: ignore[arg-type]
    pump.report(8, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), FakeMessage(b"big"))  # type: ignore[arg-type]
    assert not in_spool_mode(pump)  # a refused event is dropped, not a transport problem
    pump.report(11, KafkaError(KafkaError._MSG_TIMED_OUT), FakeMessage(b"eleven"))  # type: ignore[arg-type]
    assert in_spool_mode(pump)  # from now on log() hands events to the pump
    pump.hold(SpooledEvent("unit.events", b"run-a", b"twelve", "p1", 12))
    pump.report(10, KafkaError(KafkaError._PURGE_QUEUE), FakeMessage(b"ten"))  # type: ignore[arg-type]
    deadline = time.monotonic() + 5
    while pump.counts.spooled < 3 and time.monotonic() < deadline:
        time.sleep(0.05)  # the thread writes the spool
    assert (pump.counts.delivered, pump.counts.spooled, pump.counts.dropped) == (1, 3, 1)
    (path,) = spool_files(tmp_path)[(tmp_path, "p1")]
    events, bad = read_spool_file(path)
    assert bad == 0
    assert [(e.producer_id, e.seq, e.value, e.key) for e in events] == [
        ("p1", 10, b"ten", b"run-a"),
        ("p1", 11, b"eleven", b"run-a"),
        ("p1", 12, b"twelve", b"run-a"),
    ]


def test_close_spools_what_is_queued_and_keeps_the_files(tmp_path: Path) -> None:
    settings = unreachable().updated({"producer.spool_dir": tmp_path})
    logger = EventLogger("run-a", settings=settings)
    for step in range(50):
        logger.log({"loss": 1.0}, step)
    assert logger.close(timeout_s=0.5) == 50
    files = spool_files(tmp_path)[(logger.spool_dir, logger.producer_id)]
    assert [e.seq for path in files for e in read_spool_file(path)[0]] == list(range(50))


def test_a_spool_that_cannot_be_written_drops_and_counts(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the spool directory should be")
    settings = unreachable().updated({"producer.spool_dir": blocker})
    logger = EventLogger("run-a", settings=settings)
    logger.log({"loss": 1.0}, 0)
    assert logger.close(timeout_s=0.1) == 1
    assert (logger.spooled, logger.dropped) == (0, 1)
