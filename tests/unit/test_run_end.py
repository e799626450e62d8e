"""One ``run_end`` per run attempt, from rank 0, with its reason, whichever paths end the run.

Without a broker: the events a link could not deliver stay in its write-ahead log at close,
and the log is read back to see what the link sent.
"""

from __future__ import annotations

import pytest

from rlpulse.producers import RunLink, Settings, StopRequested
from rlpulse.producers.caller.ending import CLOSED, FINISHED, RunEnding, exited, stopped_by
from rlpulse.producers.delivery.wal import EVENT, LOG, WalReader, read_source
from rlpulse.producers.encoding.logs import batch_body
from rlpulse.schemas import default_codec
from rlpulse.schemas.records import ControlCommand, LogRecord, TrainerEvent
from rlpulse.settings import ProducerSettings
from tests.waiting import wait_for


def unreachable(system_metrics_interval_s: float | None = None) -> Settings:
    """Settings for a broker that is not there: every event stays in the log at close."""
    producer = ProducerSettings(
        close_timeout_s=0.1, system_metrics_interval_s=system_metrics_interval_s
    )
    return Settings(bootstrap="127.0.0.1:1", prefix="unit", producer=producer)


def a_stop(rule_id: str | None = "kl-guard") -> ControlCommand:
    return {
        "command_id": "cmd-7",
        "run_id": "run-a",
        "attempt": 0,
        "stage": "actor",
        "step": 4,
        "origin": "rule" if rule_id else "operator",
        "rule_id": rule_id,
        "rule_version": "1" if rule_id else None,
        "dry_run": False,
        "actions": [{"type": "checkpoint", "params": {}}, {"type": "stop", "params": {}}],
        "reason": "kl_divergence 0.5 > 0.3",
        "evidence": {},
        "issued_ns": 0,
    }


def sent(link: RunLink) -> list[TrainerEvent]:
    """The events ``link`` (closed) sent, read back from its write-ahead log, in order."""
    codec = default_codec()
    reader = WalReader(link.events.wal_dir)
    try:
        return [codec.decode_event(f.payload) for f in reader.frames(0) if f.kind == EVENT]
    finally:
        reader.close()


def records_sent(link: RunLink) -> list[LogRecord]:
    """The text log records ``link`` (closed) sent, read back from its write-ahead log."""
    head = read_source(link.events.wal_dir)
    assert head is not None, "the link wrote no text record"
    reader = WalReader(link.events.wal_dir)
    try:
        entries = [f.payload for f in reader.frames(0) if f.kind == LOG]
    finally:
        reader.close()
    return default_codec().decode_logs(head + batch_body(entries))


def ends(link: RunLink) -> list[tuple[int, str | None]]:
    return [(e["step"], e["message"]) for e in sent(link) if e["kind"] == "run_end"]


def a_link(rank: int = 0, world_size: int = 1, settings: Settings | None = None) -> RunLink:
    chosen = settings if settings is not None else unreachable()
    link = RunLink("run-a", rank=rank, world_size=world_size, settings=chosen)
    if link.control is not None:
        link.control.ack_timeout_s = 0.0  # nothing would confirm it
    return link


def test_only_the_first_claim_on_rank_0_sends() -> None:
    ending = RunEnding(rank=0)
    assert (ending.ended, ending.reason) == (False, None)
    assert ending.claim("stopped by command c (kl-guard)")
    assert not ending.claim(CLOSED)
    assert (ending.ended, ending.reason) == (True, "stopped by command c (kl-guard)")
    other = RunEnding(rank=3)
    assert not other.claim(FINISHED)
    assert (other.ended, other.reason) == (False, None)


def test_reasons_name_the_command_and_its_rule_or_the_exit_code() -> None:
    assert stopped_by(a_stop()) == "stopped by command cmd-7 (kl-guard)"
    assert stopped_by(a_stop(rule_id=None)) == "stopped by command cmd-7 (operator)"
    assert exited(0) == FINISHED == "training finished"
    assert exited(3) == "exited with code 3"


def test_an_explicit_run_end_is_not_repeated_at_close() -> None:
    link = a_link()
    for step in range(1, 4):
        link.log({"loss": 1.0}, step)
    assert link.run_end(3)
    assert not link.run_end(3, "again")
    link.close(timeout_s=0.1)
    assert ends(link) == [(3, FINISHED)]


def test_a_plain_close_ends_the_run_at_the_last_step() -> None:
    link = a_link()
    link.run_start(0)
    for step in range(1, 6):
        link.log({"loss": 1.0}, step)
    link.close(timeout_s=0.1)
    link.close(timeout_s=0.1)
    assert ends(link) == [(5, CLOSED)]
    assert [e["kind"] for e in sent(link)] == ["run_start"] + ["metrics"] * 5 + ["run_end"]


def test_close_without_end_and_a_link_that_logged_nothing_send_no_run_end() -> None:
    link = a_link()
    link.log({"loss": 1.0}, 1)
    link.close(timeout_s=0.1, end=False)
    assert ends(link) == []
    silent = a_link()
    assert silent.close() == 0
    assert not silent.ending.ended


def test_exit_if_stopped_ends_the_run_with_the_stop_and_close_adds_nothing() -> None:
    link = a_link()
    for step in range(1, 5):
        link.log({"kl_divergence": 0.5}, step)
    link.stop_command = a_stop()  # what poll_commands() sets when the stop arrives
    with pytest.raises(StopRequested) as stopped:
        link.exit_if_stopped(4)
    assert stopped.value.code == 0
    link.close()
    assert ends(link) == [(4, "stopped by command cmd-7 (kl-guard)")]
    assert link.ending.reason == "stopped by command cmd-7 (kl-guard)"


def test_close_after_a_stop_gives_the_stop_as_the_reason() -> None:
    link = a_link()
    link.log({"kl_divergence": 0.5}, 9)
    link.stop_command = a_stop(rule_id=None)
    link.close(timeout_s=0.1)
    assert ends(link) == [(9, "stopped by command cmd-7 (operator)")]


def test_other_ranks_never_send_a_run_end() -> None:
    link = a_link(rank=1, world_size=2)
    link.log({"loss": 1.0}, 1)
    assert not link.run_end(1)
    link.stop_command = a_stop()
    with pytest.raises(StopRequested):
        link.exit_if_stopped(1)
    assert ends(link) == []
    assert [e["kind"] for e in sent(link)] == ["metrics"]


def test_a_with_block_ends_the_run_unless_an_error_left_it() -> None:
    with a_link() as finished:
        finished.log({"loss": 1.0}, 2)
    assert ends(finished) == [(2, CLOSED)]
    crashed = a_link()
    with pytest.raises(RuntimeError), crashed:
        crashed.log({"loss": 1.0}, 2)
        raise RuntimeError("CUDA error: an illegal memory access")
    assert ends(crashed) == []
    assert crashed.events.closed


def test_system_samples_leave_the_run_end_and_step_less_records_at_the_training_step() -> None:
    """The sampler numbers its samples 0, 1, 2, ...: ten of them pass the trainer's step 3."""
    link = a_link(settings=unreachable(system_metrics_interval_s=0.01))
    system = link.system
    assert system is not None
    for step in range(1, 4):
        link.log({"loss": 1.0}, step)
    wait_for(lambda: system.samples >= 10, "10 system samples", timeout_s=10.0, every_s=0.01)
    link.log_record("INFO", 20, "trainer", "no step given")
    link.close(timeout_s=0.1)
    assert link.events.last_step == 3
    assert ends(link) == [(3, CLOSED)]
    assert [(r["message"], r["step"]) for r in records_sent(link)] == [("no step given", 3)]
    samples = [e["step"] for e in sent(link) if e["stage"] == "system"]
    assert samples == list(range(len(samples))) and len(samples) >= 10  # the sample index
