"""The trainer checks a command's contents: absurd ones refused with a reason, sound ones kept."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlpulse.ops.commands import action, operator_command
from rlpulse.producers.control.screening import command_problem
from rlpulse.producers.integrations.commands import apply_command
from rlpulse.rules.loader import list_presets, load_preset
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import ControlCommand
from rlpulse.settings import CommandLimits
from tests.command_strategies import ToyTrainer, commands

LIMITS = CommandLimits()


def with_actions(*actions: dict[str, Any]) -> ControlCommand:
    return operator_command("run-1", [{"type": a["type"], "params": a["params"]} for a in actions])


def scale(**params: Any) -> dict[str, Any]:
    return {"type": "scale_rollout_batch", "params": params}


@pytest.mark.parametrize(
    ("actions", "reason"),
    [
        ([], "no actions"),
        ([{"type": "explode", "params": {}}], "unknown action"),
        ([{"type": "stop", "params": {"now": True}}], "unknown parameter 'now'"),
        ([scale(max=256)], "parameter 'factor' is missing"),
        ([scale(factor="2", max=256)], "factor must be a finite number"),
        ([scale(factor=True, max=256)], "factor must be a finite number"),
        ([scale(factor=float("nan"), max=256)], "factor must be a finite number"),
        ([scale(factor=1000.0, max=256)], "factor 1000 is outside [0.0625, 16]"),
        ([scale(factor=0.001)], "factor 0.001 is outside"),
        ([scale(factor=2.0, max=0)], "max 0 is outside [1, 1048576]"),
        ([scale(factor=0.5, min=-5)], "min -5 is outside"),
        ([scale(factor=2.0, max=10**12)], "max 1000000000000 is outside"),
        ([scale(factor=2.0, max=2.5)], "max must be a whole number"),
        ([scale(factor=2.0, min=300, max=256)], "min 300 is above max 256"),
        ([scale(factor=2.0)], "grows the batch without a bound"),
        ([{"type": "checkpoint", "params": {"tag": "../../etc"}}], "must not start with '.'"),
        ([{"type": "checkpoint", "params": {"tag": "a/b"}}], "hold '/'"),
        ([{"type": "checkpoint", "params": {"tag": 7}}], "tag must be non-empty text"),
        ([{"type": "set", "params": {"key": "lr"}}], "parameter 'value' is missing"),
        ([{"type": "set", "params": {"key": "", "value": 1}}], "key must be non-empty text"),
        ([{"type": "set", "params": {"key": "lr", "value": float("inf")}}], "must be finite"),
        ([{"type": "alert", "params": {"message": "x", "severity": "doom"}}], "severity must"),
        ([{"type": "alert", "params": {"message": "x" * 5000}}], "more than commands.max_text"),
        ([{"type": "stop", "params": {}}] * 17, "17 actions"),
    ],
)
def test_absurd_contents_are_refused_with_the_reason(actions: list[Any], reason: str) -> None:
    problem = command_problem(with_actions(*actions), LIMITS)
    assert problem is not None and reason in problem, problem


def test_the_problem_names_the_action() -> None:
    command = with_actions({"type": "stop", "params": {}}, scale(factor=99.0, max=256))
    problem = command_problem(command, LIMITS)
    assert problem is not None and problem.startswith("action 2 ('scale_rollout_batch'): factor")


def test_limits_are_settings() -> None:
    command = with_actions(scale(factor=2.0, max=4096))
    assert command_problem(command, LIMITS) is None
    assert "outside" in str(command_problem(command, CommandLimits(max_batch_size=1024)))
    assert "outside" in str(command_problem(command, CommandLimits(scale_factor_max=1.5)))


@pytest.mark.parametrize(
    "actions",
    [
        [action("checkpoint", tag="operator_stop"), action("stop")],
        [action("checkpoint", tag="kl violation 2")],
        [action("scale_rollout_batch", factor=0.5, min=16)],
        [action("scale_rollout_batch", factor=2.0, max=256)],
        [action("alert", message="noisy")],
        [{"type": "set", "params": {"key": "lr", "value": None}}, action("set", key="n", value=3)],
    ],
)
def test_what_operators_send_passes(actions: list[Any]) -> None:
    assert command_problem(operator_command("run-1", actions), LIMITS) is None


@pytest.mark.parametrize("preset", list_presets())
def test_every_preset_action_passes(preset: str) -> None:
    for rule in load_preset(preset).rules:
        for spec in rule.actions:
            command = with_actions({"type": spec.type, "params": spec.params.wire_params()})
            assert command_problem(command, LIMITS) is None, (preset, rule.id, spec)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_commands_are_refused_or_applied_never_failed(data: st.DataObject) -> None:
    """Through the trainer's path: decode, check, apply. Nothing raises; nothing fails."""
    command = data.draw(commands("run-1"))
    codec = default_codec()
    decoded = codec.decode_command(codec.encode("ControlCommand", command))
    problem = command_problem(decoded, LIMITS)
    if problem is not None:
        assert isinstance(problem, str) and problem
        return
    outcome = apply_command(decoded, ToyTrainer().handlers())
    assert outcome.status in ("applied", "noop", "rejected"), outcome
    if outcome.status == "rejected":
        assert any(key.endswith(".reason") and value for key, value in outcome.detail.items())
