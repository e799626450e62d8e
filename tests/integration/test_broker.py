"""`rlpulse broker up|down|status` against the real Kafka jars, including its failure messages."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from rlpulse.local.broker import LocalBroker
from rlpulse.local.child_process import free_port
from rlpulse.local.exceptions import BrokerError
from rlpulse.settings import Settings

pytestmark = pytest.mark.broker


def rlpulse(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlpulse", *args],
        capture_output=True,
        text=True,
        env=env or dict(os.environ),
        timeout=180,
        check=False,
    )


def test_up_status_down_cycle(tmp_path: Path) -> None:
    state = str(tmp_path / "broker")
    up = rlpulse("broker", "up", "--port", "0", "--state-dir", state)
    assert up.returncode == 0, up.stderr
    match = re.search(r"up at (127\.0\.0\.1:\d+)", up.stdout)
    assert match, up.stdout
    try:
        again = rlpulse("broker", "up", "--port", "0", "--state-dir", state)
        assert again.returncode == 0 and match.group(1) in again.stdout, "up reuses"
        status = rlpulse("broker", "status", "--state-dir", state)
        assert status.returncode == 0
        assert f"is up at {match.group(1)}" in status.stdout
    finally:
        down = rlpulse("broker", "down", "--state-dir", state)
    assert down.returncode == 0 and "stopped" in down.stdout
    status = rlpulse("broker", "status", "--state-dir", state)
    assert status.returncode == 1 and "down" in status.stdout


def test_missing_java_is_one_clear_sentence(tmp_path: Path) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    env = {**os.environ, "PATH": str(empty_bin)}
    result = rlpulse("broker", "up", "--port", "0", "--state-dir", str(tmp_path / "b"), env=env)
    assert result.returncode == 1
    assert "java is not on PATH" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_maven_is_one_clear_sentence(tmp_path: Path) -> None:
    java_only = tmp_path / "bin"
    java_only.mkdir()
    java = shutil.which("java")
    assert java is not None
    (java_only / "java").symlink_to(java)
    env = {**os.environ, "PATH": str(java_only), "RLPULSE_HOME": str(tmp_path / "home")}
    result = rlpulse("broker", "up", "--port", "0", env=env)
    assert result.returncode == 1
    assert "Maven (mvn) is not on PATH" in result.stderr
    assert "Traceback" not in result.stderr


def test_port_in_use_is_refused(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = rlpulse("broker", "up", "--port", str(port), "--state-dir", str(tmp_path))
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr


@pytest.mark.slow
def test_the_ports_after_the_clients_stay_free(tmp_path: Path) -> None:
    """Alertmanager's 9093 and 9094 beside a broker on 9092: up, down and up again."""
    state = str(tmp_path / "broker")
    with socket.socket() as taken:  # the port after a free one, held as Alertmanager would
        for _ in range(50):
            port = free_port()
            try:
                taken.bind(("127.0.0.1", port + 1))
                break
            except OSError:
                continue
        else:
            pytest.fail("found no free port whose successor is free")
        taken.listen()
        try:
            for _ in range(2):  # the second start: its data directory, another controller port
                up = rlpulse("broker", "up", "--port", str(port), "--state-dir", state)
                assert up.returncode == 0, up.stderr
                assert f"is up at 127.0.0.1:{port}" in up.stdout
                down = rlpulse("broker", "down", "--state-dir", state)
                assert down.returncode == 0 and "stopped" in down.stdout
        finally:
            rlpulse("broker", "down", "--state-dir", state)


def test_broker_dying_during_start_up_reports_its_log(tmp_path: Path) -> None:
    broker = LocalBroker(Settings(), state_dir=tmp_path / "b", port=0)
    broker.up()
    broker.down()
    meta = tmp_path / "b" / "data" / "meta.properties"
    meta.write_text(meta.read_text().replace("node.id=1", "node.id=7"))
    with pytest.raises(BrokerError) as info:
        broker.up()
    message = str(info.value)
    assert "exited with code" in message
    assert "node" in message.lower()  # the broker's own words about the mismatch
    assert broker.info() is None
