"""Every panel of the committed dashboard, against a real Prometheus scraping a real exporter.

Broker (session fixture), a worker process with the seed rules, ``rlpulse exporter`` as a
process, and Debian's Prometheus with compose/'s config and alert rules (targets on 127.0.0.1,
scraping every second) watch the scripted 8-rank run of :mod:`tests.integration.watched_run`.
Then each panel's PromQL from compose/grafana/dashboards/rlpulse.json, its variables
substituted, goes through Prometheus's HTTP API and must return the series the run implies.
A panel without an expectation here fails the test.
"""

from __future__ import annotations

import json
import math
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import pytest
from confluent_kafka import Producer

from rlpulse.local.child_process import free_port
from rlpulse.local.exporter_process import ExporterProcess
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.rules.arith import exact_mean, exact_std
from rlpulse.schemas.topics import Topics
from rlpulse.streams.exporter.naming import DropReason
from rlpulse.streams.exporter.state import DEAD_LETTER_KINDS
from tests.integration.monitoring import COMPOSE, Prometheus
from tests.integration.watched_run import (
    ERRORS_FROM,
    KL_GUARD_STEP,
    RANKS,
    SPIKE,
    STEPS,
    ZSCORE_WINDOW,
    WatchedRun,
    actor_loss,
    critic_loss,
    kl,
    reward,
    throughput,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]

DASHBOARD = COMPOSE / "grafana" / "dashboards" / "rlpulse.json"
NAMESPACE = "verl"
RANK_SET = {str(rank) for rank in range(RANKS)}
Series = list[dict[str, Any]]


def substitute(expr: str, run_id: str) -> str:
    """Grafana's variables as a user with this run selected (every stage) would have them."""
    values = {"namespace": NAMESPACE, "run": run_id, "stage": ".*"}
    values["__rate_interval"] = "4s"  # Grafana: 4 x the 1 s scrape interval
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)


def by(label: str, series: Series) -> dict[str, float]:
    """Instant-query results keyed by one label's value."""
    keyed = {s["metric"].get(label, ""): float(s["value"][1]) for s in series}
    assert len(keyed) == len(series), f"{label} does not tell the series apart: {series}"
    return keyed


def labelled(series: Series, *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(s["metric"].get(n, "") for n in labels): float(s["value"][1]) for s in series}


class Run:
    """What the scripted run logged, reduced the way the worker reduces it (bit for bit)."""

    def __init__(self, run_id: str, prefix: str) -> None:
        self.run_id = run_id
        self.prefix = prefix
        self.hostname = socket.gethostname()
        last = STEPS
        self.rewards = [reward(last, r) for r in range(RANKS)]
        self.kls = [kl(last, r) for r in range(RANKS)]
        self.reward_mean = exact_mean(self.rewards)
        self.reward_std = exact_std(self.rewards)
        self.kl_mean = exact_mean(self.kls)


def expectations(
    run: Run, prometheus: Prometheus, window: tuple[float, float], exporter_series: float
) -> dict[tuple[int, str], Callable[[Series, str], None]]:
    """(panel id, refId) -> a check of the instant result (and, given the expr, a range)."""

    def ranged(expr: str) -> Series:
        return prometheus.query_range(expr, *window)

    def equals(expected: dict[str, float], label: str) -> Callable[[Series, str], None]:
        def check(series: Series, _expr: str) -> None:
            assert by(label, series) == expected

        return check

    def reward_band(offset: int) -> Callable[[Series, str], None]:
        value = run.reward_mean + offset * run.reward_std
        return equals({"rollout": value}, "stage")

    def per_rank_kl(series: Series, _expr: str) -> None:
        assert by("rank", series) == {str(r): kl(STEPS, r) for r in range(RANKS)}

    def three_sigma(series: Series, expr: str) -> None:
        assert series == []  # now: the spike is steps ago
        marked = ranged(expr)
        assert [s["metric"]["metric"] for s in marked] == ["actor_loss"], marked
        points = marked[0]["values"]
        assert points, "the spike was never marked"
        assert {float(v) for _t, v in points} == {SPIKE}

    def cpu_per_rank(series: Series, expr: str) -> None:
        now = by("rank", series)
        assert set(now) == RANK_SET and all(v >= 0 for v in now.values())
        peaks = {s["metric"]["rank"]: max(float(v) for _t, v in s["values"]) for s in ranged(expr)}
        assert set(peaks) == RANK_SET and all(v > 0 for v in peaks.values()), peaks

    def steps(series: Series, _expr: str) -> None:
        got = by("stage", series)
        assert (got.pop("rollout"), got.pop("actor")) == (STEPS, STEPS)
        assert set(got) == {"system"} and got["system"] >= 5  # samples, one a second

    def since_last_event(series: Series, _expr: str) -> None:
        (age,) = by("run", series).values()
        assert 0 <= age < 120

    def stragglers(series: Series, _expr: str) -> None:
        got = by("stage", series)
        assert (got["rollout"], got["actor"]) == (1.0, 1.0)  # rank 7, always last
        assert set(got) == {"rollout", "actor", "system"}

    def missing(series: Series, _expr: str) -> None:
        got = by("stage", series)
        assert (got["rollout"], got["actor"]) == (0.0, 0.0)
        assert set(got) == {"rollout", "actor", "system"}

    def commands(series: Series, _expr: str) -> None:
        assert labelled(series, "rule", "action") == {
            ("kl-guard", "checkpoint"): 1.0,
            ("kl-guard", "stop"): 1.0,
        }

    def firing(series: Series, _expr: str) -> None:
        assert by("alertname", series) == {"RlpulseRunStopped": 1.0}

    def nothing(series: Series, _expr: str) -> None:
        assert series == []

    def no_drops(series: Series, _expr: str) -> None:
        assert by("reason", series) == dict.fromkeys(get_args(DropReason), 0.0)

    def events_per_host(series: Series, expr: str) -> None:
        assert set(by("host", series)) == {run.hostname}
        (busiest,) = [max(float(v) for _t, v in s["values"]) for s in ranged(expr)]
        assert busiest > 0

    def records_per_host(series: Series, expr: str) -> None:
        assert set(by("host", series)) == {run.hostname}
        (busiest,) = [max(float(v) for _t, v in s["values"]) for s in ranged(expr)]
        assert busiest > 0

    def lag(series: Series, _expr: str) -> None:
        groups = {s["metric"]["group"] for s in series}
        assert groups == {f"{run.prefix}-worker", f"{run.prefix}-exporter"}, groups
        assert all(float(s["value"][1]) >= 0 for s in series)
        topics = {s["metric"]["topic"] for s in series}
        assert f"{run.prefix}.events" in topics

    def dead_letters(series: Series, expr: str) -> None:
        assert set(by("reason", series)) == set(DEAD_LETTER_KINDS)  # each starts at 0
        peaks = {
            s["metric"]["reason"]: max(float(v) for _t, v in s["values"]) for s in ranged(expr)
        }
        assert {reason for reason, peak in peaks.items() if peak > 0} == {"undecodable"}

    def targets_up(series: Series, _expr: str) -> None:
        assert by("job", series) == {"rlpulse-exporter": 1.0, "rlpulse-worker": 1.0}

    def series_held(series: Series, _expr: str) -> None:
        assert [float(s["value"][1]) for s in series] == [exporter_series]

    rewards = {f"{r}": reward(STEPS, r) for r in range(RANKS)}
    tokens = {f"{r}": throughput(STEPS, r) for r in range(RANKS)}
    return {
        (2, "A"): reward_band(0),
        (2, "B"): reward_band(1),
        (2, "C"): reward_band(-1),
        (3, "A"): equals({"rollout": run.reward_mean}, "stage"),
        (3, "B"): equals({"actor": run.kl_mean}, "stage"),
        (4, "A"): per_rank_kl,
        (5, "A"): equals({"actor": actor_loss(STEPS)}, "stage"),
        (5, "B"): equals({"actor": critic_loss(STEPS)}, "stage"),
        (5, "C"): three_sigma,
        (6, "A"): cpu_per_rank,
        (6, "B"): equals(tokens, "rank"),
        (7, "A"): equals({run.run_id: math.fsum(tokens.values())}, "run"),
        (8, "A"): equals(rewards, "rank"),
        **{(panel, "S"): equals({run.run_id: STEPS}, "run") for panel in (2, 3, 5, 7, 8)},
        (10, "A"): steps,
        (11, "A"): since_last_event,
        (12, "A"): equals({"kl-guard": 1.0}, "rule"),
        (13, "A"): missing,
        (13, "B"): stragglers,
        (14, "A"): commands,
        (14, "B"): firing,
        (14, "C"): nothing,  # no Alertmanager in this test: nothing forwarded
        (14, "D"): equals({"ERROR": float(STEPS - ERRORS_FROM + 1)}, "level"),
        (21, "A"): events_per_host,
        (21, "B"): records_per_host,
        (22, "A"): lag,
        (23, "A"): dead_letters,
        (24, "A"): targets_up,
        (25, "A"): series_held,
        (25, "B"): no_drops,
    }


def test_every_dashboard_panel_returns_the_runs_series(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
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
        rules="seed",
        partitions=3,
        grace_s=5.0,
        extra_args=("--metrics-port", str(worker_port), "--metrics-host", "127.0.0.1"),
    )
    exporter = ExporterProcess(
        kafka_bootstrap,
        topics.prefix,
        tmp_path / "exporter.log",
        exporter_port,
        namespace=NAMESPACE,
        extra_args=("--zscore-window", str(ZSCORE_WINDOW), "--log-level", "info"),
    )
    run = WatchedRun(kafka_bootstrap, topics)
    try:
        prometheus.start()
        worker.start()
        exporter.start()
        worker.wait_consuming(timeout_s=90.0)
        exporter.wait_ready(timeout_s=90.0)
        prometheus.wait_for('up{job="rlpulse-exporter"} == 1')
        prometheus.wait_for('up{job="rlpulse-worker"} == 1')
        started = time.time()
        garbage = Producer({"bootstrap.servers": kafka_bootstrap})
        garbage.produce(topics.events, key=run.run_id.encode(), value=b"not avro")
        assert garbage.flush(10) == 0
        run.play()
        run.receive_commands(want=1, timeout_s=60.0)
        run.end()
        selector = f'run="{run.run_id}"'
        prometheus.wait_for(f'rlpulse_run_acks_total{{{selector}, status="applied"}} == 1')
        prometheus.wait_for(f'ALERTS{{alertname="RlpulseRunStopped", {selector}}}')
        prometheus.wait_for(f"rlpulse_run_ended{{{selector}}} == 1")
        prometheus.wait_for('rlpulse_dlq_messages_total{reason="undecodable"} == 1')
        prometheus.wait_scraped_after(time.time())  # every target once more after the last change
        ended = time.time()
        exporter_series = exporter.value("rlpulse_exporter_series")
        assert exporter_series is not None and exporter_series > 0

        (guard,) = run.commands
        assert (guard["rule_id"], guard["step"]) == ("kl-guard", KL_GUARD_STEP)
        expected = Run(run.run_id, topics.prefix)
        checks = expectations(expected, prometheus, (started, ended), exporter_series)
        dashboard = json.loads(DASHBOARD.read_text())
        checked = set()
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                key = (panel["id"], target["refId"])
                assert key in checks, f"panel {panel['title']!r} {key} has no expectation"
                expr = substitute(target["expr"], run.run_id)
                try:
                    checks[key](prometheus.query(expr), expr)
                except AssertionError as exc:
                    raise AssertionError(f"panel {panel['title']!r} {key}: {expr}: {exc}") from exc
                checked.add(key)
        assert checked == set(checks)

        # The variables' options and the annotations.
        assert run.run_id in prometheus.label_values("run", "rlpulse_run_attempt")
        stage_match = substitute(dashboard["templating"]["list"][3]["query"], run.run_id)
        stage_series = stage_match.removeprefix("label_values(").removesuffix(", stage)")
        assert prometheus.label_values("stage", stage_series) == {"rollout", "actor", "system"}
        annotations = {a["name"]: a for a in dashboard["annotations"]["list"]}
        marks = prometheus.query(substitute(annotations["Commands"]["expr"], run.run_id))
        # Milliseconds near 1.8e12 are a float's last bit apart (2.4e-4 ms), wherever it rounds.
        assert labelled(marks, "rule", "actions") == {
            ("kl-guard", "checkpoint,stop"): pytest.approx(guard["issued_ns"] / 1e6, abs=1e-3)
        }
        alerts = prometheus.query(substitute(annotations["Alerts"]["expr"], run.run_id))
        assert by("alertname", alerts) == {"RlpulseRunStopped": 1.0}
    finally:
        exporter.stop()
        worker.stop()
        prometheus.stop()
