"""Which rule commands become Alertmanager alerts, and what those alerts say."""

from __future__ import annotations

import pytest

from rlpulse.settings import ExporterSettings
from rlpulse.streams.exporter.alerts import command_alert, notified_actions
from rlpulse.streams.exporter.exceptions import ExporterError
from tests.unit.exporter_records import command

DEFAULTS = ExporterSettings()


def test_a_kl_guard_stop_is_one_critical_alert_with_the_reason() -> None:
    guard = command([("checkpoint", {"tag": "kl_violation"}), ("stop", {})], run="ppo-7b")
    alert = command_alert(guard, DEFAULTS)
    assert alert is not None
    assert alert["labels"] == {
        "alertname": "RlpulseRunStopped",
        "run": "ppo-7b",
        "rule": "kl-guard",
        "severity": "critical",
        "command_id": guard["command_id"],
    }
    assert alert["annotations"]["description"] == guard["reason"]
    assert alert["annotations"]["summary"] == (
        "kl-guard: checkpoint, stop for run ppo-7b at step 42 (stage actor, attempt 0)"
    )
    assert alert["startsAt"] == "2027-01-15T08:00:00.000+00:00"
    assert alert["endsAt"] == "2027-01-15T09:00:00.000+00:00"  # alert_ttl_s later


def test_an_alert_action_takes_its_severity_and_message() -> None:
    low = command(
        [("alert", {"severity": "info", "message": "reward below 0.5"})],
        rule="reward-low",
        reason="reward_mean 0.42 < 0.5; mean over 8 ranks",
    )
    alert = command_alert(low, DEFAULTS)
    assert alert is not None
    assert (alert["labels"]["alertname"], alert["labels"]["severity"]) == (
        "RlpulseRuleAlert",
        "info",
    )
    assert alert["annotations"]["message"] == "reward below 0.5"
    assert alert["annotations"]["description"] == "reward_mean 0.42 < 0.5; mean over 8 ranks"


def test_by_default_checkpoints_notify_and_batch_scaling_does_not() -> None:
    checkpoint = command([("checkpoint", {"tag": "nightly"})], rule="save")
    scale = command([("scale_rollout_batch", {"factor": 2.0})], rule="unstable-reward")
    alert = command_alert(checkpoint, DEFAULTS)
    assert alert is not None
    assert (alert["labels"]["alertname"], alert["labels"]["severity"]) == (
        "RlpulseRunCheckpointed",
        "warning",
    )
    assert command_alert(scale, DEFAULTS) is None
    chatty = ExporterSettings(notify_actions=["scale_rollout_batch"])
    scaled = command_alert(scale, chatty)
    assert scaled is not None and scaled["labels"]["alertname"] == "RlpulseRuleCommand"
    assert command_alert(checkpoint, chatty) is None


def test_dry_run_commands_never_notify_and_operator_commands_do() -> None:
    assert command_alert(command([("stop", {})], dry_run=True), DEFAULTS) is None
    by_hand = command_alert(command([("stop", {})], rule=None, reason="diverging"), DEFAULTS)
    assert by_hand is not None and by_hand["labels"]["rule"] == "operator"


def test_each_command_is_its_own_alert() -> None:
    """Two firings of one rule notify twice; the same command posted again is the same alert."""
    first = command([("alert", {"severity": "warning", "message": "m"})], rule="r", step=10)
    again = command([("alert", {"severity": "warning", "message": "m"})], rule="r", step=20)
    one, two = command_alert(first, DEFAULTS), command_alert(again, DEFAULTS)
    assert one is not None and two is not None
    assert one["labels"] != two["labels"]
    assert {k: v for k, v in one["labels"].items() if k != "command_id"} == {
        k: v for k, v in two["labels"].items() if k != "command_id"
    }


def test_notify_actions_are_actions_of_the_contract_and_a_typo_is_refused() -> None:
    assert notified_actions(DEFAULTS) == ["stop", "checkpoint", "alert"]
    chosen = ExporterSettings(notify_actions=["set", "stop"])
    assert notified_actions(chosen) == ["set", "stop"]
    typo = ExporterSettings(notify_actions=["stpo"])
    with pytest.raises(ExporterError, match=r"exporter\.notify_actions: 'stpo' .*'stop'"):
        notified_actions(typo)
