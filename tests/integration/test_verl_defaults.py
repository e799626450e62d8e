"""A verl run logging verl's own names only, against ``rlpulse worker`` with no rules given.

verl's real ``Tracking`` with the ``rlpulse`` backend, in the loop of the stand-in v1 trainer of
:mod:`tests.integration.test_verl` (verl's trainer itself needs GPUs), logs only verl 0.9.1's
metric names: ``critic/score/mean`` swinging between 0 and 2 from step 1 (population variance
1.0 > 0.5 once the 5-step window is full, at step 5), ``actor/kl_loss`` above 0.3 from step 10.
The worker runs its default rules (the seed preset), the exporter ``--namespace verl``, and
Debian's Prometheus scrapes both with compose/'s config and alert rules. With no rule or name
configured by the user: unstable-reward doubles the batch at step 5 and again at step 11 (its
cooldown is 5 evaluations), kl-guard checkpoints and stops the run for step 12, the exporter
serves the seed's gauges, every dashboard panel's query returns data (but those of notifications
and text log records: this run has neither) and the two training alerts' conditions hold.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from rlpulse.local.child_process import free_port
from rlpulse.local.exporter_process import ExporterProcess
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers.integrations import verl as integration
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import CommandAck, ControlCommand
from rlpulse.schemas.topics import Topics
from tests.integration.monitoring import COMPOSE, Prometheus
from tests.integration.test_verl import StandInTrainer, verl_config
from tests.integration.topic_reader import read_until

pytestmark = [pytest.mark.broker, pytest.mark.slow]

DASHBOARD = COMPOSE / "grafana" / "dashboards" / "rlpulse.json"
KL_FROM = 10
SPIKE_STEP = 8
NO_DATA_HERE = {(14, "C"), (14, "D"), (21, "B")}
"""Panels this run leaves empty: notifications forwarded to Alertmanager (none runs here), and
text log records (the stand-in loop logs none; verl's driver logs at WARN and above). Those
are checked by test_dashboard_prometheus and test_verl_workers."""


def verl_metrics(step: int) -> dict[str, Any]:
    """One step of verl's driver dict, verl's names only."""
    return {
        "critic/score/mean": 2.0 if step % 2 else 0.0,
        "critic/score/max": 2.0,
        "actor/kl_loss": 0.5 if step >= KL_FROM else 0.05,
        "actor/pg_loss": 4.0 if step == SPIKE_STEP else 0.2 + 0.01 * (step % 3),
        "actor/ppo_kl": 0.001,
        "critic/vf_loss": 0.8 + 0.01 * (step % 4),
        "perf/throughput": 1000.0 + step,
        "response_length/mean": 200.0,
        "timing_s/step": 1.0,
    }


def substitute(expr: str, run_id: str) -> str:
    values = {"namespace": "verl", "run": run_id, "stage": ".*", "__rate_interval": "4s"}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)


def test_a_verl_run_is_stopped_scaled_and_shown_by_the_defaults(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    run_id = f"verl-defaults-{uuid.uuid4().hex[:8]}"
    worker_port, exporter_port = free_port(), free_port()
    prometheus = Prometheus(
        tmp_path / "prometheus",
        {
            "rlpulse-exporter": f"127.0.0.1:{exporter_port}",
            "rlpulse-worker": f"127.0.0.1:{worker_port}",
        },
    )
    worker = WorkerProcess(
        kafka_bootstrap,
        topics.prefix,
        tmp_path / "worker.log",
        rules=None,  # as the README starts it: the seed preset until rules are published
        partitions=3,
        extra_args=("--metrics-port", str(worker_port), "--metrics-host", "127.0.0.1"),
    )
    exporter = ExporterProcess(
        kafka_bootstrap,
        topics.prefix,
        tmp_path / "exporter.log",
        exporter_port,
        namespace="verl",
        extra_args=("--zscore-window", "5"),
    )
    block = {
        "run_id": run_id,
        "bootstrap": kafka_bootstrap,
        "prefix": topics.prefix,
        "settings": {"producer": {"system_metrics_interval_s": 1.0}},
    }
    trainer = StandInTrainer(verl_config(str(tmp_path / "ckpt")))
    try:
        prometheus.start()
        worker.start()
        exporter.start()
        worker.wait_consuming(timeout_s=90.0)
        exporter.wait_ready(timeout_s=90.0)
        prometheus.wait_for('up{job="rlpulse-worker"} == 1')
        prometheus.wait_for('up{job="rlpulse-exporter"} == 1')
        started = time.time()
        integration.install()
        trainer.fit("rlpulse-tests", "exp", block, metrics=verl_metrics, step_s=1.2)
        selector = f'run="{run_id}"'
        prometheus.wait_for(f"rlpulse_run_ended{{{selector}}} == 1")
        prometheus.wait_for(f'ALERTS{{alertname="RlpulseRunStopped", {selector}}}')
        prometheus.wait_scraped_after(time.time())  # one more scrape of every target
        ended = time.time()

        codec = default_codec()
        commands: list[ControlCommand] = read_until(
            kafka_bootstrap,
            topics.control,
            codec.decode_command,
            lambda found: any(c["rule_id"] == "kl-guard" for c in found),
        )
        fired = [(c["rule_id"], c["stage"], c["step"]) for c in commands if c["run_id"] == run_id]
        assert fired == [
            ("unstable-reward", "rollout", 5),
            ("unstable-reward", "rollout", 11),
            ("kl-guard", "actor", 12),
        ]
        acks: list[CommandAck] = read_until(
            kafka_bootstrap, topics.acks, codec.decode_ack, lambda found: len(found) >= 3
        )
        by_rule = {c["rule_id"]: c["command_id"] for c in commands}
        statuses = {a["command_id"]: a for a in acks}
        assert statuses[by_rule["kl-guard"]]["status"] == "applied"
        stopped_at = statuses[by_rule["kl-guard"]]["applied_at_step"]
        # The command for step 12 is polled when a later step logs (step 13, 1.2 s later, unless
        # the worker took longer to issue it); the v1 loop ends at the step that applied it.
        assert stopped_at is not None and stopped_at >= 13
        assert trainer.total_training_steps == stopped_at
        assert trainer.saved.steps == [stopped_at]
        assert trainer.config.data.train_batch_size == 256  # 64 -> 128 -> 256

        gauges = {
            name: exporter.value(f"verl_{name}", {"run": run_id, "stage": stage, "rank": "0"})
            for name, stage in (
                ("reward_mean", "rollout"),
                ("kl_divergence", "actor"),
                ("actor_loss", "actor"),
                ("critic_loss", "critic"),
                ("throughput_tokens_per_sec", "trainer"),
            )
        }
        last = verl_metrics(stopped_at)  # the last step logged
        assert gauges == {
            "reward_mean": last["critic/score/mean"],
            "kl_divergence": last["actor/kl_loss"],
            "actor_loss": last["actor/pg_loss"],
            "critic_loss": last["critic/vf_loss"],
            "throughput_tokens_per_sec": last["perf/throughput"],
        }

        dashboard = json.loads(DASHBOARD.read_text())
        empty = []
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                key = (panel["id"], target["refId"])
                expr = substitute(target["expr"], run_id)
                if key in NO_DATA_HERE:
                    continue
                if not (prometheus.query(expr) or prometheus.query_range(expr, started, ended)):
                    empty.append(f"{panel['title']!r} {key}: {expr}")
        assert empty == [], "panels without data for the verl run:\n" + "\n".join(empty)

        alerts = {"RlpulseKLHigh", "RlpulseRewardVarianceHigh"}
        rules = prometheus.api("rules")["groups"]
        conditions = {
            r["name"]: r["query"] for g in rules for r in g["rules"] if r["name"] in alerts
        }
        assert set(conditions) == alerts
        for name, condition in conditions.items():
            held = prometheus.query_range(condition, started, ended)
            runs = {series["metric"].get("run") for series in held}
            assert run_id in runs, f"{name}'s condition never held for the verl run: {condition}"
    finally:
        exporter.stop()
        worker.stop()
        prometheus.stop()
