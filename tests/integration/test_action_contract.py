"""Adding an action is one declaration: the rules loader, screening and the CLI all take it.

The test declares a hypothetical action, ``scale_learning_rate{factor}``, in the action
contract (:mod:`rlpulse.schemas.actions`) and nowhere else; then a rules file may use it
(and is refused, with file:line, out of its bounds), a trainer's screening passes it (and
refuses it beyond ``commands.scale_factor_max``), ``rlpulse control send`` sends it to the
run, and a trainer without a handler for it acks it ``rejected``.
"""

from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from rlpulse.cli import app
from rlpulse.producers import ControlClient
from rlpulse.producers.control.screening import command_problem
from rlpulse.producers.integrations.commands import alert, apply_command
from rlpulse.rules.exceptions import RulesFileError
from rlpulse.rules.loader import parse_rules
from rlpulse.schemas import actions
from rlpulse.schemas.actions import ActionContract, ParamKind, ParamSpec
from rlpulse.schemas.records import ControlCommand
from rlpulse.schemas.topics import Topics
from rlpulse.settings import CommandLimits
from tests.kafka import settings_at

pytestmark = pytest.mark.broker

SCALE_LR = ActionContract(
    "scale_learning_rate",
    "Multiply the learning rate.",
    (
        ParamSpec(
            "factor",
            ParamKind.NUMBER,
            "Multiplier of the learning rate.",
            required=True,
            gt=0,
            low_limit="scale_factor_min",
            high_limit="scale_factor_max",
        ),
    ),
)

RULES = """\
version: 1
rules:
  - id: lr-down
    metric: grad_norm
    when: "> 10"
    actions:
      - scale_learning_rate: {{factor: {factor}}}
"""


@pytest.fixture
def contract(monkeypatch: pytest.MonkeyPatch) -> None:
    """The action contract with the hypothetical action declared: the one edit."""
    monkeypatch.setattr(actions, "ACTIONS", actions.ACTIONS.with_action(SCALE_LR))


def command_with(factor: float) -> ControlCommand:
    return {
        "command_id": "c-1",
        "run_id": "run-lr",
        "attempt": 0,
        "stage": "trainer",
        "step": 1,
        "origin": "operator",
        "rule_id": None,
        "rule_version": None,
        "dry_run": False,
        "actions": [{"type": "scale_learning_rate", "params": {"factor": factor}}],
        "reason": "test",
        "evidence": {},
        "issued_ns": time.time_ns(),
    }


@pytest.mark.usefixtures("contract")
def test_the_rules_loader_takes_a_declared_action_and_bounds_it() -> None:
    rule = parse_rules(RULES.format(factor=0.5), "lr.yaml").rule("lr-down")
    assert [(a.type, a.params.wire_params()) for a in rule.actions] == [
        ("scale_learning_rate", {"factor": 0.5})
    ]
    with pytest.raises(RulesFileError) as refused:
        parse_rules(RULES.format(factor=0), "lr.yaml")
    assert str(refused.value).startswith("lr.yaml:7:")
    assert "scale_learning_rate.factor must be > 0, got 0" in str(refused.value)


def test_without_the_declaration_the_loader_refuses_it() -> None:
    with pytest.raises(RulesFileError, match=r"unknown action 'scale_learning_rate'"):
        parse_rules(RULES.format(factor=0.5), "lr.yaml")


@pytest.mark.usefixtures("contract")
def test_screening_takes_a_declared_action_and_bounds_it_with_the_trainers_limits() -> None:
    limits = CommandLimits()
    assert command_problem(command_with(0.5), limits) is None
    problem = command_problem(command_with(100.0), limits)
    assert problem is not None
    assert "factor 100 is outside [0.0625, 16] (commands.scale_factor_min/max)" in problem


@pytest.mark.usefixtures("contract")
def test_the_cli_sends_a_declared_action_and_a_trainer_without_its_handler_rejects_it(
    kafka_bootstrap: str, topics: Topics
) -> None:
    where = ["--bootstrap", kafka_bootstrap, "--prefix", topics.prefix]
    runner = CliRunner()
    beyond = ["control", "send", "run-lr", "scale_learning_rate", "factor=100", *where]
    refused = runner.invoke(app, beyond)
    assert refused.exit_code == 1
    assert "not sent: the trainer would reject it" in refused.stderr
    settings = settings_at(kafka_bootstrap, topics)
    with ControlClient("run-lr", settings=settings) as client:
        client.poll()
        sound = ["control", "send", "run-lr", "scale_learning_rate", "factor=0.5", "--no-wait"]
        sent = runner.invoke(app, [*sound, *where])
        assert sent.exit_code == 0, sent.stderr
        got: list[ControlCommand] = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got += client.poll(timeout_s=0.2)
    assert [c["actions"] for c in got] == [
        [{"type": "scale_learning_rate", "params": {"factor": 0.5}}]
    ]
    outcome = apply_command(got[0], {"alert": alert})  # a trainer that has no handler for it
    assert outcome.status == "rejected"
    assert (
        "'scale_learning_rate' is not supported here"
        in outcome.detail["scale_learning_rate.reason"]
    )
