"""The README's commands on a fresh machine: `rlpulse broker up`, then at once `rlpulse worker`.

A fresh ``RLPULSE_HOME`` (only the Kafka jars are reused, to spare the download); the worker
runs exactly as the README writes it — no ``--bootstrap``, no ``--data-dir`` — and is started
the moment ``broker up`` returns, while the broker may still be electing leaders for the
topics the worker creates. The local broker's port comes from the environment
(``RLPULSE_BROKER__PORT``) so that the test cannot collide with a broker on 9092.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlpulse.local.broker import tail
from rlpulse.local.child_process import free_port
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from tests.integration.fresh import environment
from tests.integration.scripted_run import KL_GUARD_STEP, STEPS, ScriptedRun

pytestmark = pytest.mark.broker


def rlpulse(
    *args: str, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlpulse", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def local_broker(fresh_home: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """`rlpulse broker up` in the fresh home; its bootstrap address and the environment."""
    port = free_port()
    env = environment(fresh_home, RLPULSE_BROKER__PORT=str(port))
    up = rlpulse("broker", "up", env=env)
    assert up.returncode == 0, up.stderr
    try:
        yield f"127.0.0.1:{port}", env
    finally:
        down = rlpulse("broker", "down", env=env)
        assert down.returncode == 0, down.stderr


@pytest.mark.slow
def test_worker_started_right_after_broker_up_runs_the_seed_rules(
    local_broker: tuple[str, dict[str, str]], fresh_home: Path
) -> None:
    bootstrap, env = local_broker
    log = fresh_home / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "rlpulse", "worker"],  # as the README writes it
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    run = ScriptedRun(bootstrap, Topics(Settings().prefix))
    try:
        run.log_steps(range(1, STEPS + 1))
        run.receive_commands(want=2, timeout_s=240, settle_s=1.0)
        assert worker.poll() is None, tail(log, 40)
    finally:
        run.close()
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(timeout=60)
        finally:
            if worker.poll() is None:  # no worker outlives a failed test
                worker.kill()
    guard = [c for c in run.received if c["rule_id"] == "kl-guard"]
    assert [(c["stage"], c["step"]) for c in guard] == [("actor", KL_GUARD_STEP)], tail(log, 40)
    assert code == 0, tail(log, 40)
    # faust's data directory, created with its parents under the fresh home
    assert (fresh_home / "worker-data" / "rlpulse-worker").is_dir()


def test_worker_with_the_broker_down_exits_with_one_sentence(fresh_home: Path) -> None:
    port = free_port()  # nothing listens there: as after `rlpulse broker down`
    env = environment(
        fresh_home,
        RLPULSE_BOOTSTRAP=f"127.0.0.1:{port}",
        RLPULSE_WORKER__STARTUP_TIMEOUT_S="8",
    )
    result = rlpulse("worker", env=env, timeout=120)
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr
    assert lines[-1].startswith("error: Kafka at 127.0.0.1:")
    assert "did not answer within 8 s" in lines[-1]
    assert any(line.startswith("waiting for Kafka at") for line in lines), lines
