"""Which late commands a trainer drops: only a rule's batch scaling, past its age limit."""

from __future__ import annotations

from rlpulse.ops.commands import action, operator_command
from rlpulse.producers.caller.link import expiry
from rlpulse.schemas.records import Action, ControlCommand


def rule_command(step: int, actions: list[Action]) -> ControlCommand:
    command = operator_command("run", actions, step=step)
    return {
        **command,
        "origin": "rule",
        "rule_id": "unstable-reward",
        "rule_version": "v1",
        "stage": "rollout",
    }


def test_a_rules_scaling_expires_past_the_limit_and_nothing_else_does() -> None:
    scale = [action("scale_rollout_batch", factor=2, max=256)]
    assert expiry(rule_command(31, scale), step=41, max_age_steps=10) is None
    why = expiry(rule_command(31, scale), step=42, max_age_steps=10)
    assert why == (
        "issued for step 31, polled at step 42: 11 steps old, more than "
        "producer.scale_max_age_steps=10"
    )
    assert expiry(rule_command(31, scale), step=500, max_age_steps=None) is None
    stop = [action("checkpoint", tag="kl"), action("stop")]
    assert expiry(rule_command(31, stop), step=500, max_age_steps=10) is None
    assert expiry(rule_command(31, [*scale, action("stop")]), step=500, max_age_steps=10) is None
    operator = operator_command("run", scale)  # step -1: "at the next step"
    assert expiry(operator, step=500, max_age_steps=10) is None
