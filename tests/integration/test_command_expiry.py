"""A trainer polling late gets no stale scale-up (acked expired); the stop still applies."""

from __future__ import annotations

import time

import pytest

from rlpulse.ops.commands import action, operator_command, publish_command
from rlpulse.producers import RunLink
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import Action, CommandAck, ControlCommand
from rlpulse.schemas.topics import Topics
from tests.integration.topic_reader import read_until
from tests.kafka import settings_at

pytestmark = pytest.mark.broker


def rule_command(run_id: str, step: int, actions: list[Action]) -> ControlCommand:
    command = operator_command(run_id, actions, step=step)
    return {
        **command,
        "origin": "rule",
        "rule_id": "seed-rule",
        "rule_version": "v1",
        "stage": "rollout",
    }


def test_commands_queued_behind_a_stall_do_not_burst(kafka_bootstrap: str, topics: Topics) -> None:
    settings = settings_at(kafka_bootstrap, topics)
    run_id = f"expiry-{time.time_ns()}"
    scale = [action("scale_rollout_batch", factor=2, max=256)]
    queued = [rule_command(run_id, step, scale) for step in (31, 36, 41, 46, 51, 56)]
    stop = rule_command(run_id, 62, [action("checkpoint", tag="kl"), action("stop")])
    for command in (*queued, stop):
        publish_command(settings, command)
    link = RunLink(run_id, settings=settings)
    try:
        got: list[ControlCommand] = []
        deadline = time.monotonic() + 60
        while len(got) < 2 and time.monotonic() < deadline:
            got += link.poll_commands(timeout_s=0.5, step=64)
        assert [c["step"] for c in got] == [56, 62]  # 8 steps old: applied; older: not
        codec = default_codec()
        acks: list[CommandAck] = read_until(
            kafka_bootstrap, topics.acks, codec.decode_ack, lambda found: len(found) >= 5
        )
        expired = {a["command_id"]: a for a in acks}
        assert set(expired) == {c["command_id"] for c in queued[:5]}
        for ack in expired.values():
            assert (ack["status"], ack["detail"]["check"], ack["applied_at_step"]) == (
                "rejected",
                "expired",
                64,
            )
    finally:
        link.close(10)
