"""``rlpulse demo`` end to end: stopped by kl-guard, with the exporter's gauges at the end."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.broker


def test_the_demo_shows_the_exporters_url_and_seed_gauges(kafka_bootstrap: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rlpulse", "demo", "--bootstrap", kafka_bootstrap,
         "--step-interval", "0.05"],
        capture_output=True, text=True, timeout=240, check=False,
        env={**os.environ, "COLUMNS": "200"},  # long lines stay whole
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    url = re.search(r"Prometheus metrics of the run: (http://127\.0\.0\.1:\d+/metrics)", output)
    assert url, output
    assert "Run stopped by kl-guard at step" in output
    assert f"What Prometheus scrapes from {url.group(1)} (ranks 0 and 1):" in output
    for gauge, stage in (("verl_reward_mean", "rollout"), ("verl_kl_divergence", "actor")):
        for rank in (0, 1):
            line = rf'  {gauge}\{{rank="{rank}",run="demo-ppo-\w+",stage="{stage}"\}} [0-9.e+-]+'
            assert re.search(line, output), f"{gauge} rank {rank} missing:\n{output}"
