"""The trainer side without a reachable broker: argument checks, the write-ahead log, no I/O up
front."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

import pytest

import rlpulse
import rlpulse.producers
from rlpulse.producers import (
    ControlClient,
    EventLogger,
    InvalidFieldError,
    InvalidValueError,
    ProducerClosedError,
    ProducerError,
    RefusedSourceError,
    RunLink,
    Settings,
)
from rlpulse.producers.delivery.wal import LogMeta, unsent_frames
from rlpulse.schemas.records import ControlCommand
from rlpulse.settings import AgentSettings
from rlpulse.transport import clients as clients_module
from rlpulse.transport.clients import trainer_producer
from rlpulse.transport.exceptions import ClientConfigError


def unreachable() -> Settings:
    """Settings for a broker that is not there and a host whose agent runs only by hand (built
    per test: the home is the test's own): the records wait in the write-ahead log."""
    return Settings(bootstrap="127.0.0.1:1", prefix="unit", agent=AgentSettings(start="never"))


def a_command(run_id: str = "run-a") -> ControlCommand:
    return {
        "command_id": "cmd-1",
        "run_id": run_id,
        "attempt": 0,
        "stage": "trainer",
        "step": 1,
        "origin": "operator",
        "rule_id": None,
        "rule_version": None,
        "dry_run": False,
        "actions": [{"type": "stop", "params": {}}],
        "reason": "operator asked",
        "evidence": {},
        "issued_ns": 0,
    }


def test_a_property_librdkafka_refuses_is_one_line_in_the_rank_s_log_and_logging_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The training process builds no Kafka client: the agent it starts refuses the property,
    before it forks, and the rank says why once; its records wait in the write-ahead log."""
    caplog.set_level(logging.WARNING, logger="rlpulse.producers")
    settings = Settings(
        bootstrap="127.0.0.1:1",
        librdkafka={"no.such.property": 1},
        agent=AgentSettings(start="auto"),
    )
    logger = EventLogger("run-a", settings=settings)
    logger.log({"loss": 1.0}, step=0)
    assert logger._watch is not None and logger._watch.wait_checked(30)
    logger.log({"loss": 0.5}, step=1)
    assert logger.close(timeout_s=0) == 2
    said = [r.getMessage() for r in caplog.records if "no agent could be started" in r.getMessage()]
    assert len(said) == 1 and "no.such.property" in said[0], said
    with pytest.raises(ClientConfigError, match=r"no\.such\.property"):  # as the agent found
        trainer_producer(settings, "a check")


def _no_client(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise AssertionError("a Kafka client was created")


def test_constructors_do_no_network_io(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clients_module, "Producer", _no_client)
    monkeypatch.setattr(clients_module, "Consumer", _no_client)
    logger = EventLogger("run-a", rank=3, world_size=8, settings=unreachable())
    client = ControlClient("run-a", attempt=1, settings=unreachable())
    link = RunLink("run-a", tags={"team": "rl"}, settings=unreachable())
    assert (logger.logged, logger.delivered, logger.resent, logger.dropped) == (0, 0, 0, 0)
    assert not client.started
    # Closing what never connected creates nothing either.
    assert logger.close() == 0
    client.close()
    assert link.close() == 0


def test_log_with_unreachable_broker_keeps_every_event_in_the_write_ahead_log() -> None:
    """log() appends each event to the write-ahead log and returns: with no agent and no
    broker, all 200 wait there, none delivered; close() leaves them in the log for the host's
    agent or ``rlpulse spool send``. How long a call takes is measured in
    benchmarks/producer_overhead.py (p50/p99 in microseconds)."""
    logger = EventLogger("run-a", settings=unreachable())
    for step in range(200):
        logger.log({"loss": 1.0 / (step + 1), "tokens": step}, step=step)
    assert (logger.logged, logger.delivered, logger.pending) == (200, 0, 200)
    assert logger.close(timeout_s=0.1) == 200
    assert (logger.dropped, logger.pending) == (0, 200)
    assert unsent_frames(logger.wal_dir) == 200
    meta = LogMeta.read(logger.wal_dir)
    assert meta is not None and (meta.run_id, meta.producer_id) == ("run-a", logger.producer_id)


def test_a_full_write_ahead_log_drops_the_newest_counts_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At ``producer.spool_max_bytes`` nothing more is written: the newest records are dropped,
    counted in ``dropped`` (their seqs are taken: the audit sees the loss), warned once."""
    settings = unreachable().updated(
        {"producer.spool_file_bytes": 4096, "producer.spool_max_bytes": 4096}
    )
    caplog.set_level(logging.WARNING, logger="rlpulse.producers")
    logger = EventLogger("run-a", settings=settings)
    for step in range(200):
        logger.log({"loss": 1.0}, step=step)
    kept = unsent_frames(logger.wal_dir)
    assert 0 < kept < 200
    assert (logger.logged, logger.dropped) == (200, 200 - kept)
    logger.close(timeout_s=0.1)
    full = [r for r in caplog.records if "producer.spool_max_bytes" in r.getMessage()]
    assert len(full) == 1


def strict() -> Settings:
    """:func:`unreachable` with ``producer.strict`` on: bad input at ``log()`` raises."""
    return unreachable().updated({"producer.strict": True})


@pytest.mark.parametrize("value", ["1.0", b"1", None, [1.0, 2.0], {"a": 1}, object()])
def test_non_numeric_metric_is_a_type_error_naming_the_key_in_strict_mode(value: object) -> None:
    logger = EventLogger("run-a", settings=strict())
    with pytest.raises(TypeError, match=r"metrics\['reward_mean'\]") as raised:
        logger.log({"loss": 0.5, "reward_mean": value}, step=1)  # type: ignore[dict-item]
    assert isinstance(raised.value, InvalidFieldError)
    assert isinstance(raised.value, ProducerError)
    assert raised.value.key == "reward_mean"
    assert logger.logged == 0


def test_numeric_like_metric_values_are_converted() -> None:
    class Scalar:
        def __float__(self) -> float:
            return 0.25

    logger = EventLogger("run-a", settings=unreachable())
    logger.log({"int": 3, "bool": True, "nan": float("nan"), "scalar": Scalar()}, step=1)  # type: ignore[dict-item]
    assert logger.logged == 1
    logger.close(timeout_s=0)


def test_bad_arguments_are_refused_with_their_context() -> None:
    with pytest.raises(InvalidValueError, match="run_id"):
        EventLogger("", settings=unreachable())
    with pytest.raises(InvalidValueError, match="world_size=0"):
        EventLogger("run-a", world_size=0, settings=unreachable())
    with pytest.raises(InvalidFieldError, match=r"tags\['gpu'\]"):
        EventLogger("run-a", tags={"gpu": 8}, settings=unreachable())  # type: ignore[dict-item]
    logger = EventLogger("run-a", settings=strict())
    with pytest.raises(InvalidValueError, match="'metrics', 'log', 'run_start', 'run_end'"):
        logger.log({}, 1, kind="metric")  # type: ignore[arg-type]
    with pytest.raises(InvalidFieldError, match="step"):
        logger.log({}, 1.5)  # type: ignore[arg-type]
    client = ControlClient("run-a", settings=unreachable())
    with pytest.raises(InvalidValueError, match="'applied', 'noop', 'rejected', 'failed'"):
        client.ack(a_command(), "done")  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match="this client's run"):
        client.ack(a_command("run-b"), "applied")
    with pytest.raises(InvalidFieldError, match=r"detail\['new'\]"):
        client.ack(a_command(), "applied", detail={"new": 128})  # type: ignore[dict-item]


def test_use_after_close_is_an_error() -> None:
    logger = EventLogger("run-a", settings=unreachable())
    assert not logger.closed
    logger.close()
    assert logger.closed
    with pytest.raises(ProducerClosedError):
        logger.log({"loss": 1.0}, step=0)
    client = ControlClient("run-a", settings=unreachable())
    client.close()
    with pytest.raises(ProducerClosedError):
        client.poll()


def test_a_link_says_when_it_is_closed() -> None:
    link = RunLink("run-a", settings=unreachable())
    assert not link.closed
    link.close()
    assert link.closed and link.events.closed


def test_poll_with_unreachable_broker_never_waits_for_start_up() -> None:
    """Start-up cannot finish (nothing listens), yet every poll() returns: it never waits for
    start-up, which runs and retries in its own thread. Durations are measured in
    benchmarks/producer_overhead.py."""
    client = ControlClient("run-a", settings=unreachable(), startup_timeout_s=0.3)
    for _ in range(20):
        assert client.poll() == []
        assert not client.started
        time.sleep(0.05)
    assert client.poll(timeout_s=0.3) == []  # waits up to its timeout, then returns
    (starter,) = [t for t in threading.enumerate() if t.name == "rlpulse-control-run-a"]
    assert not client.started and starter.is_alive()  # still retrying
    client.close()  # the start-up thread notices and ends
    starter.join(10)
    assert not starter.is_alive()


def test_public_api() -> None:
    assert sorted(rlpulse.producers.__all__) == [
        "Broadcast",
        "CommandBus",
        "ControlClient",
        "EXIT_STOPPED_BY_RULE",
        "EventFields",
        "EventHandler",
        "EventLogger",
        "InvalidFieldError",
        "InvalidValueError",
        "LogFields",
        "ProducerClosedError",
        "ProducerError",
        "RankLogWriter",
        "RefusedSourceError",
        "RunLink",
        "SamplingFilter",
        "Settings",
        "StopRequested",
        "current_trace_id",
        "new_trace_id",
        "single_process_broadcast",
        "trace",
    ]
    for name in rlpulse.producers.__all__:
        assert getattr(rlpulse.producers, name).__doc__


def test_import_does_not_load_the_worker_stack() -> None:
    forbidden = ["faust", "aiokafka", "aiohttp", "prometheus_client", "mode"]
    code = (
        "import sys, rlpulse.producers\n"
        f"print(','.join(sorted(m for m in {forbidden!r} if m in sys.modules)))\n"
    )
    root = str(Path(rlpulse.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    assert result.stdout.strip() == ""


def test_events_the_worker_would_refuse_are_counted_not_sent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Once per reason per logger: each EventLogger remembers what it has warned about.
    caplog.set_level(logging.WARNING, logger="rlpulse.producers")
    logger = EventLogger("run-a", rank=1, world_size=4, settings=unreachable())
    logger.log({"loss": 1.0}, step=1, stage="a|b")
    logger.log({"loss": 1.0}, step=2, stage="a|b")
    logger.log({f"m{i}": 0.0 for i in range(2000)}, step=1)
    logger.log({"x" * 300: 1.0}, step=1)
    logger.log({"loss": 1.0}, step=-1)
    logger.log({"loss": 1.0}, step=1, world_size=1)  # rank 1 outside a world of 1
    logger.log({"loss": 1.0}, step=1, stage="")
    assert logger.refused == {
        "stage_separator": 2,
        "metrics": 1,
        "name_chars": 1,
        "negative_step": 1,
        "rank": 1,
        "stage": 1,
    }
    assert logger.logged == 0  # none took a seq: the next event is seq 0
    logger.log({"loss": 1.0}, step=1)
    assert logger.logged == 1
    warnings = [r.getMessage() for r in caplog.records if "not sent" in r.getMessage()]
    assert len(warnings) == 6  # one per reason, not per event
    assert any("contains '|'" in w and "stage_separator" in w for w in warnings)
    logger.close(timeout_s=0)


def test_bad_input_at_log_is_counted_and_warned_once_per_reason_never_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="rlpulse.producers")
    link = RunLink("run-a", settings=unreachable())
    for _ in range(2):
        link.log({"reward_mean": None}, step=1)  # type: ignore[dict-item]
        link.log({"reward_mean": "0.5"}, step=1)  # type: ignore[dict-item]
        link.log({"loss": 1.0}, step=2.5)  # type: ignore[arg-type]
        link.log({"loss": 1.0}, step=1, stage="s" * 10_000)
        link.log({"loss": 1.0}, step=-1)
        link.log({"loss": 1.0}, step=1, kind="metric")  # type: ignore[arg-type]
        link.log({"loss": 1.0}, step=1, message=3)  # type: ignore[arg-type]
    assert link.events.refused == {
        "metrics_type": 4,
        "step_type": 2,
        "name_chars": 2,
        "negative_step": 2,
        "kind_value": 2,
        "message_type": 2,
    }
    assert link.events.logged == 0
    link.log({"loss": 1.0}, step=1)
    assert link.events.logged == 1
    warnings = [r.getMessage() for r in caplog.records if "not sent" in r.getMessage()]
    assert len(warnings) == 6  # one per reason, not per event
    assert any("metrics['reward_mean'] is NoneType" in w for w in warnings)
    assert any("step is float (2.5)" in w for w in warnings)
    link.events.close(timeout_s=0)


def test_a_message_too_large_for_the_worker_is_refused() -> None:
    settings = unreachable().updated({"limits.max_event_bytes": 1024})
    logger = EventLogger("run-a", settings=settings)
    logger.log({}, step=1, kind="log", message="x" * 2000)
    assert (logger.refused, logger.logged) == ({"event_bytes": 1}, 0)
    logger.close(timeout_s=0)


def test_a_logger_whose_events_would_all_be_refused_is_an_error() -> None:
    with pytest.raises(RefusedSourceError, match="run_id of 300 chars"):
        EventLogger("r" * 300, settings=unreachable())
    with pytest.raises(RefusedSourceError, match="65 tags"):
        EventLogger("run-a", tags={f"t{i}": "v" for i in range(65)}, settings=unreachable())


def test_the_old_name_spooled_still_counts_resent_records_and_says_it_is_deprecated() -> None:
    with (
        EventLogger("run-old-name", settings=unreachable()) as logger,
        pytest.warns(DeprecationWarning, match="EventLogger.resent"),
    ):
        assert logger.spooled == logger.resent == 0
