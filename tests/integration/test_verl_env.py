"""rlpulse's settings reach verl's Ray workers through verl's runtime env, not by inheritance.

A Ray cluster started beforehand (``ray start --head``) from an environment with no rlpulse
variable stands for the other nodes of a multi-node job: its workers inherit nothing from the
driver. The driver, as verl's ``run_ppo`` does, calls ``ray.init`` with
``get_ppo_ray_runtime_env(config)`` after ``import verl`` loaded rlpulse's plugin. A task on the
cluster then reports what it sees.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlpulse.local.child_process import free_port
from rlpulse.producers.caller.trace import TRACE_ENV
from rlpulse.producers.integrations import verl_env

pytestmark = [pytest.mark.slow]

RAY = [sys.executable, "-m", "ray.scripts.scripts"]


def clean_env(tmp_path: Path) -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "PYTHONPATH")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["RAY_AUTH_MODE"] = "disabled"  # a token is one more secret to hand around; loopback only
    return env


@pytest.fixture
def ray_cluster(tmp_path: Path) -> Iterator[str]:
    """A one-node Ray cluster that knows nothing of rlpulse; yields its address."""
    port = free_port()
    env = clean_env(tmp_path)
    sockets = Path(tempfile.mkdtemp(prefix="rl-ray-", dir="/tmp"))  # short: Unix socket paths
    starter = subprocess.Popen(
        [
            *RAY,
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=1",
            "--include-dashboard=false",
            "--object-store-memory=100000000",
            "--node-ip-address=127.0.0.1",
            f"--temp-dir={sockets}",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the cluster's processes are one group: ours to stop alone
    )
    said, _ = starter.communicate(timeout=180)
    try:
        assert starter.returncode == 0, said
        yield f"127.0.0.1:{port}"
    finally:
        stop_group(starter.pid)
        shutil.rmtree(sockets, ignore_errors=True)


def stop_group(group: int) -> None:
    """End the processes of one process group: SIGTERM, then SIGKILL after 30 s.

    Not `ray stop`: it ends every Ray process on the machine, and with it the cluster another
    xdist worker's test runs on (test_verl_trainer.py's raylet died mid-test that way).
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def test_worker_env_holds_the_run_and_never_a_secret() -> None:
    config = {
        "trainer": {"experiment_name": "grpo-7b"},
        "rlpulse": {
            "bootstrap": "kafka-1:9092",
            "settings": {"producer": {"linger_ms": 20}, "librdkafka": {"socket.timeout.ms": 9}},
        },
    }
    environ = {
        "RLPULSE_PREFIX": "team-a",
        "RLPULSE_SECURITY__PASSWORD": "hunter2",
        "RLPULSE_SECURITY__PASSWORD_FILE": "/etc/rlpulse/password",
        TRACE_ENV: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "VERL_USE_EXTERNAL_MODULES": "my.plugin",
        "UNRELATED": "x",
    }
    env = verl_env.worker_env(config, environ)
    assert env == {
        "RLPULSE_PREFIX": "team-a",
        "RLPULSE_SECURITY__PASSWORD_FILE": "/etc/rlpulse/password",
        "RLPULSE_BOOTSTRAP": "kafka-1:9092",
        "RLPULSE_PRODUCER__LINGER_MS": "20",
        "RLPULSE_LIBRDKAFKA": json.dumps({"socket.timeout.ms": 9}),
        TRACE_ENV: "4bf92f3577b34da6a3ce929d0e0e4736",
        "VERL_USE_EXTERNAL_MODULES": f"my.plugin,{verl_env.PLUGIN_MODULE}",
    }
    one, two = (verl_env.worker_env({}, {})[TRACE_ENV] for _ in range(2))
    assert one != two and len(one) == 32  # a run without a trace context gets a new one


DRIVER = textwrap.dedent(
    """
    import json, os, sys
    import verl  # loads rlpulse's plugin from VERL_USE_EXTERNAL_MODULES, as in every verl process
    import ray
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    config = OmegaConf.create({
        "trainer": {"experiment_name": "multi-node-run"},
        "rlpulse": {"bootstrap": "kafka-7:9092", "prefix": "team-b"},
    })
    ray.init(address=sys.argv[1], runtime_env=get_ppo_ray_runtime_env(config),
             log_to_driver=False, _node_ip_address="127.0.0.1")

    @ray.remote(num_cpus=0)
    def seen():
        import sys
        import verl  # noqa: F401  (what a verl worker process does first)
        names = ("RLPULSE_", "VERL_USE_EXTERNAL_MODULES")
        env = {k: v for k, v in os.environ.items() if k.startswith(names)}
        plugin = "rlpulse.producers.integrations.verl_plugin" in sys.modules
        return {"env": env, "plugin": plugin}

    print(json.dumps({"driver_trace": os.environ["RLPULSE_TRACE_CONTEXT"],
                      "worker": ray.get(seen.remote(), timeout=120)}))
    """
)


def test_a_worker_on_a_cluster_started_beforehand_gets_rlpulses_settings(
    ray_cluster: str, tmp_path: Path
) -> None:
    env = {
        **clean_env(tmp_path),
        "VERL_USE_EXTERNAL_MODULES": verl_env.PLUGIN_MODULE,
        "RLPULSE_PRODUCER__LINGER_MS": "7",
        "RLPULSE_SECURITY__PASSWORD": "hunter2",
    }
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, ray_cluster],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    worker = report["worker"]
    assert worker["plugin"], "the worker did not load rlpulse's plugin"
    assert worker["env"] == {
        "RLPULSE_PRODUCER__LINGER_MS": "7",
        "RLPULSE_BOOTSTRAP": "kafka-7:9092",
        "RLPULSE_PREFIX": "team-b",
        TRACE_ENV: report["driver_trace"],
        "VERL_USE_EXTERNAL_MODULES": verl_env.PLUGIN_MODULE,
    }
    assert "not forwarded to verl's Ray workers" in result.stderr
