"""The files compose/ mounts, checked by the tools that read them (Debian's packages here).

promtool and amtool come with the ``prometheus`` and ``prometheus-alertmanager`` packages,
docker-compose with ``docker-compose``; .ci/run installs them when they are missing. A missing
tool fails these tests: a skipped check would look like a passing one.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "compose"
INSTALL = (
    "apt-get install --no-install-recommends prometheus prometheus-alertmanager docker-compose"
)


def run(tool: str, *args: str, cwd: Path = COMPOSE) -> str:
    """Run ``tool`` with ``args``; fail the test with its output unless it exits 0."""
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not on PATH; install it: {INSTALL}")
    result = subprocess.run(
        [path, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    output = (result.stdout + result.stderr).strip()
    if result.returncode != 0:
        pytest.fail(f"{tool} {' '.join(args)} exited {result.returncode}:\n{output}")
    return output


def test_promtool_checks_the_prometheus_config_and_its_rule_files() -> None:
    output = run("promtool", "check", "config", "prometheus/prometheus.yml")
    assert "SUCCESS: 1 rule files found" in output


def test_promtool_checks_the_alert_rules() -> None:
    output = run("promtool", "check", "rules", "prometheus/alerts.yml")
    assert "SUCCESS: 13 rules found" in output


def test_every_alert_rule_is_tested_firing_and_quiet_and_the_tests_pass() -> None:
    rules = yaml.safe_load((COMPOSE / "prometheus" / "alerts.yml").read_text())
    tests = yaml.safe_load((COMPOSE / "prometheus" / "alerts_test.yml").read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    cases: dict[str, set[bool]] = {name: set() for name in alerts}
    for test in tests["tests"]:
        for case in test["alert_rule_test"]:
            cases[case["alertname"]].add(bool(case["exp_alerts"]))
    assert {name: seen for name, seen in cases.items() if seen != {True, False}} == {}, (
        "every alert needs a case where it fires and one where it stays quiet"
    )
    output = run("promtool", "test", "rules", "prometheus/alerts_test.yml")
    assert "SUCCESS" in output


def test_amtool_checks_the_alertmanager_config() -> None:
    output = run("amtool", "check-config", "alertmanager/alertmanager.yml")
    assert "SUCCESS" in output and "1 receivers" in output


def test_docker_compose_validates_the_stack() -> None:
    run("docker-compose", "-f", "docker-compose.yml", "config", "-q")
    services = run("docker-compose", "-f", "docker-compose.yml", "config", "--services")
    assert set(services.split()) == {
        "kafka",
        "worker",
        "exporter",
        "prometheus",
        "alertmanager",
        "grafana",
        "opensearch",
        "opensearch-dashboards",
        "indexer",
    }
