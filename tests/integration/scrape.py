"""Reading a Prometheus /metrics page the way Prometheus does (prometheus_client's parser)."""

from __future__ import annotations

import urllib.request

import psutil
from prometheus_client.parser import text_string_to_metric_families

from rlpulse.local.worker_process import WorkerProcess


def scrape(url: str) -> dict[str, float]:
    """Every sample of the page: ``name`` or ``name{a="x",b="y"}`` (labels sorted) -> value."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def listening_addresses(worker: WorkerProcess) -> set[tuple[str, int]]:
    """The (address, port) pairs the worker's process listens on."""
    assert worker.process is not None
    connections = psutil.Process(worker.process.pid).net_connections(kind="tcp")
    return {(c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN}
