"""Rule commands reach a person: exporter -> real Alertmanager -> a webhook receiver.

The worker runs the seed's kl-guard and a rule with an ``alert`` action; the exporter forwards
both commands to Debian's Alertmanager (compose/'s config, its webhook pointed at a receiver in
this test). Each must arrive once, with the run, the rule and the command's reason, and an
exporter that restarts (and reads the commands again in its lookback) must not notify again.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rlpulse.local.child_process import free_port
from rlpulse.local.exporter_process import ExporterProcess
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers import ControlClient, EventLogger
from rlpulse.schemas.records import ControlCommand
from rlpulse.schemas.topics import Topics
from tests.integration.monitoring import Alertmanager, WebhookReceiver
from tests.kafka import settings_at

pytestmark = [pytest.mark.broker, pytest.mark.slow]

RULES = """\
version: 1
rules:
  - id: reward-low
    metric: reward_mean
    stage: rollout
    when: "< 0.5"
    once: true
    actions:
      - alert: {severity: warning, message: "reward fell below 0.5"}
  - id: kl-guard
    metric: kl_divergence
    stage: actor
    when: "> 0.3"
    for_steps: 3
    once: true
    actions: [{checkpoint: {tag: kl_violation}}, {stop: {}}]
"""
RANKS, STEPS = 4, 8


def play(bootstrap: str, topics: Topics, run_id: str) -> list[ControlCommand]:
    """Reward 0.2 at step 3 (reward-low), KL 0.5 from step 6 (kl-guard at 8); ack both."""
    settings = settings_at(bootstrap, topics)
    ranks = [EventLogger(run_id, rank=r, world_size=RANKS, settings=settings) for r in range(RANKS)]
    control = ControlClient(run_id, settings=settings)
    received: list[ControlCommand] = []
    try:
        for step in range(1, STEPS + 1):
            for logger in ranks:
                logger.log({"reward_mean": 0.2 if step == 3 else 1.0}, step, "rollout")
                logger.log({"kl_divergence": 0.5 if step >= 6 else 0.1}, step, "actor")
        for logger in ranks:
            assert logger.flush(timeout_s=30.0) == 0
        deadline = time.monotonic() + 60.0
        while len(received) < 2 and time.monotonic() < deadline:
            for command in control.poll(timeout_s=0.2):
                received.append(command)
                control.ack(command, "applied", applied_at_step=command["step"])
    finally:
        for logger in ranks:
            logger.close(timeout_s=10.0)
        control.close()
    assert sorted(c["rule_id"] or "" for c in received) == ["kl-guard", "reward-low"], received
    return received


def wait_for_alerts(receiver: WebhookReceiver, want: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(receiver.alerts()) < want and time.monotonic() < deadline:
        time.sleep(0.2)


def test_an_alert_action_and_a_kl_guard_stop_each_notify_once(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    run_id = f"alerted-{topics.prefix[-6:]}"
    with WebhookReceiver() as receiver:
        alertmanager = Alertmanager(tmp_path / "alertmanager", receiver.url)
        worker = WorkerProcess(
            kafka_bootstrap, topics.prefix, tmp_path / "worker.log", rules=str(rules), partitions=3
        )
        exporter_args = ("--alertmanager-url", alertmanager.url, "--log-level", "info")
        exporters = [
            ExporterProcess(
                kafka_bootstrap,
                topics.prefix,
                tmp_path / f"exporter-{n}.log",
                free_port(),
                extra_args=exporter_args,
            )
            for n in (1, 2)
        ]
        try:
            alertmanager.start()
            worker.start()
            exporters[0].start()
            worker.wait_consuming(timeout_s=90.0)
            exporters[0].wait_ready(timeout_s=90.0)
            commands = {c["rule_id"]: c for c in play(kafka_bootstrap, topics, run_id)}

            wait_for_alerts(receiver, want=2, timeout_s=60.0)  # group_wait is 10 s
            time.sleep(3.0)  # room for a duplicate to show up
            first = receiver.alerts()
            assert exporters[0].value("rlpulse_exporter_notifications_total", {"outcome": "sent"})

            # A restarted exporter posts the commands of its lookback again: no new notification.
            exporters[0].stop()
            exporters[1].start().wait_ready(timeout_s=90.0)
            deadline = time.monotonic() + 30.0
            while time.monotonic() < deadline and not exporters[1].value(
                "rlpulse_exporter_notifications_total", {"outcome": "sent"}
            ):
                time.sleep(0.2)
            assert exporters[1].value("rlpulse_exporter_notifications_total", {"outcome": "sent"})
            time.sleep(3.0)
            active = [a for a in alertmanager.alerts() if a["labels"]["run"] == run_id]
        finally:
            for exporter in exporters:
                exporter.stop()
            worker.stop()
            alertmanager.stop()

    assert receiver.alerts() == first, "the restarted exporter's re-post notified again"
    ours = [a for a in first if a["labels"]["run"] == run_id]
    by_rule = {a["labels"]["rule"]: a for a in ours}
    assert len(ours) == len(by_rule) == 2, ours
    stop, alert = by_rule["kl-guard"], by_rule["reward-low"]
    assert stop["status"] == alert["status"] == "firing"
    assert (stop["labels"]["alertname"], stop["labels"]["severity"]) == (
        "RlpulseRunStopped",
        "critical",
    )
    assert (alert["labels"]["alertname"], alert["labels"]["severity"]) == (
        "RlpulseRuleAlert",
        "warning",
    )
    for rule, received in by_rule.items():
        assert received["labels"]["run"] == run_id
        assert received["annotations"]["description"] == commands[rule]["reason"]
        assert received["labels"]["command_id"] == commands[rule]["command_id"]
    assert alert["annotations"]["message"] == "reward fell below 0.5"
    assert "kl_divergence" in stop["annotations"]["description"]
    assert len(active) == 2  # the re-posted copies were the same two alerts
