"""The README's first set-up command, `rlpulse demo`, end to end on a fresh rlpulse home."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlpulse.local.broker import LocalBroker
from rlpulse.local.child_process import free_port
from rlpulse.settings import Settings
from tests.integration.fresh import environment

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_demo_runs_its_own_broker_scales_the_batch_and_stops_at_kl_guard(fresh_home: Path) -> None:
    port = free_port()  # the local broker the demo starts listens here, not on 9092
    env = environment(fresh_home, RLPULSE_BROKER__PORT=str(port), COLUMNS="200")
    result = subprocess.run(
        [sys.executable, "-m", "rlpulse", "demo"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    batches = [int(b) for b in re.findall(r"rollout batch +(\d+)", out)]
    assert batches[0] == 64 and max(batches) == 256
    assert sorted(set(batches)) == [64, 128, 256]  # doubled twice, capped at 256
    assert "ack applied at step" in out and "new_batch=128" in out and "new_batch=256" in out
    assert re.search(r"command kl-guard \(issued for step 42\)", out), out[-2000:]
    # applied at the step the trainer polls it: 42 on a quiet machine, maybe a step later
    assert re.search(r"Run stopped by kl-guard at step 4\d; rollout batch 64 -> 256", out)
    # it served the run page while the run played (tests/integration/test_run_page.py drives it)
    assert re.search(r"The run's page: http://127\.0\.0\.1:\d+/", out), out[:2000]
    # it ran an exporter: its URL first, the seed's gauges of ranks 0 and 1 at the end
    url = re.search(r"Prometheus metrics of the run: (http://127\.0\.0\.1:\d+/metrics)", out)
    assert url, out[:2000]
    assert f"What Prometheus scrapes from {url.group(1)} (ranks 0 and 1):" in out
    for gauge, stage in (("verl_reward_mean", "rollout"), ("verl_kl_divergence", "actor")):
        for rank in (0, 1):
            line = rf'  {gauge}\{{rank="{rank}",run="demo-ppo-\w+",stage="{stage}"\}} [0-9.e+-]+'
            assert re.search(line, out), f"{gauge} of rank {rank} missing:\n{out[-2000:]}"
    # it started the broker, so it stopped it again
    assert LocalBroker(Settings(home=fresh_home)).info() is None
