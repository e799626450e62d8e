"""What a rank's system sample holds (the sampler's thread is tested with the broker)."""

from __future__ import annotations

import importlib.util
import time

from rlpulse.producers.caller.system import GpuProbe, sample_process


def test_a_process_sample_has_cpu_seconds_that_grow_and_the_resident_memory() -> None:
    before = sample_process()
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    after = sample_process()
    assert after["process_cpu_seconds_total"] >= before["process_cpu_seconds_total"] + 0.05
    assert after["process_resident_memory_bytes"] > 10 * 2**20  # Linux: from /proc


def test_the_gpu_probe_samples_only_where_nvml_finds_a_device() -> None:
    sample = GpuProbe().sample()
    if importlib.util.find_spec("pynvml") is None:
        assert sample == {}
    else:  # with a GPU: both; without one NVML fails to start and there is nothing
        assert set(sample) in ({"gpu_utilization_ratio", "gpu_memory_used_bytes"}, set())
