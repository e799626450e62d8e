"""EventHandler: stdlib logging records to events and log records, against a recording sink."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest

from rlpulse.producers import EventHandler, ProducerClosedError
from rlpulse.producers.encoding.fields import EventFields, LogFields


class Sink:
    """Records what the handler publishes."""

    def __init__(self, fail: bool = False) -> None:
        self.events: list[dict[str, Any]] = []
        self.fail = fail

    def log_event(self, event: EventFields) -> None:
        if self.fail:
            raise ProducerClosedError("closed")
        self.events.append({**asdict(event), "metrics": dict(event.metrics)})

    def log_line(self, line: LogFields) -> None:
        if self.fail:
            raise ProducerClosedError("closed")
        self.events.append({**asdict(line), "kind": "log"})


@pytest.fixture
def wired() -> Iterator[tuple[logging.Logger, Sink]]:
    sink = Sink()
    logger = logging.getLogger(f"trainer-{uuid.uuid4().hex}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    handler = EventHandler(sink, stage="trainer")
    logger.addHandler(handler)
    yield logger, sink
    logger.removeHandler(handler)


def test_a_dict_record_becomes_a_metrics_event(wired: tuple[logging.Logger, Sink]) -> None:
    logger, sink = wired
    logger.info(
        {
            "step": 120,
            "stage": "rollout",
            "reward_mean": 2.4,
            "tokens": 4096,
            "actor": {"loss": 0.5, "lr": 1e-6},
            "model": "qwen-7b",
            "world_size": 8,
        }
    )
    (event,) = sink.events
    assert (event["step"], event["stage"], event["level"]) == (120, "rollout", "INFO")
    assert event["metrics"] == {
        "reward_mean": 2.4,
        "tokens": 4096.0,
        "actor/loss": 0.5,
        "actor/lr": 1e-6,
    }
    assert event["message"] == '{"model": "qwen-7b"}'
    assert event["world_size"] == 8
    assert event.get("kind", "metrics") == "metrics"


def test_a_text_record_becomes_a_log_event_at_the_last_step(
    wired: tuple[logging.Logger, Sink],
) -> None:
    logger, sink = wired
    logger.info({"step": 7, "loss": 1.0})
    logger.warning("grad norm %.1f is high", 12.5)
    logger.error("checkpoint failed", extra={"step": 9, "stage": "actor"})
    _, warning, error = sink.events
    assert (warning["kind"], warning["step"], warning["stage"]) == ("log", 7, "trainer")
    assert (warning["level"], warning["message"]) == ("WARNING", "grad norm 12.5 is high")
    assert (error["kind"], error["step"], error["stage"], error["level"]) == (
        "log",
        9,
        "actor",
        "ERROR",
    )


def test_a_dict_without_step_or_stage_takes_the_defaults(
    wired: tuple[logging.Logger, Sink],
) -> None:
    logger, sink = wired
    logger.info({"loss": 2.0})
    (event,) = sink.events
    assert (event["step"], event["stage"], event["message"]) == (0, "trainer", None)


def test_rlpulse_own_records_are_ignored() -> None:
    sink = Sink()
    handler = EventHandler(sink)
    for name in ("rlpulse", "rlpulse.producers.delivery.sender"):
        handler.handle(logging.LogRecord(name, logging.WARNING, __file__, 1, "x", None, None))
    handler.handle(logging.LogRecord("rlpulsex", logging.WARNING, __file__, 1, "y", None, None))
    assert [e["message"] for e in sink.events] == ["y"]


def test_sink_errors_go_to_handle_error_not_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handled: list[logging.LogRecord] = []
    handler = EventHandler(Sink(fail=True))
    monkeypatch.setattr(handler, "handleError", handled.append)
    record = logging.LogRecord("trainer", logging.INFO, __file__, 1, {"loss": 1.0}, None, None)
    handler.handle(record)
    assert handled == [record]
