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


def test_systemd_checks_the_agent_s_unit(tmp_path: Path) -> None:
    """The unit is a template (``rlpulse-agent@USER``): checked as an instance of it."""
    instance = tmp_path / "rlpulse-agent@root.service"
    instance.write_text((COMPOSE / "agent" / "rlpulse-agent@.service").read_text())
    run("systemd-analyze", "verify", str(instance), cwd=tmp_path)
    text = instance.read_text()
    assert "ExecStart=/usr/bin/env rlpulse agent" in text
    assert "Environment=RLPULSE_AGENT__IDLE_EXIT_S=0" in text  # systemd keeps it up


def test_the_agent_s_daemonset_shares_the_spool_and_the_node_s_name_with_the_ranks() -> None:
    """What docs/worker.md says the DaemonSet needs to serve the training pods' logs."""
    daemonset = yaml.safe_load((COMPOSE / "agent" / "daemonset.yaml").read_text())
    pod = daemonset["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {item["name"]: item for item in container["env"]}
    spool = env["RLPULSE_PRODUCER__SPOOL_DIR"]["value"]
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == spool]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"]["path"] == spool  # the training pods mount the same path
    host = env["RLPULSE_PRODUCER__HOSTNAME"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert host == "spec.nodeName"
    assert env["RLPULSE_AGENT__IDLE_EXIT_S"]["value"] == "0"
    assert pod["hostPID"] is True and container["command"] == ["rlpulse", "agent"]
