"""docs/worker.md documents every metric a worker serves, with its labels."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.metrics import MetricWrapperBase

from rlpulse.streams.worker.metrics import WorkerMetrics

GUIDE = (Path(__file__).resolve().parents[2] / "docs" / "worker.md").read_text()


def test_every_worker_metric_is_in_the_guide_with_its_labels() -> None:
    metrics = vars(WorkerMetrics(CollectorRegistry()))
    wrappers = [value for value in metrics.values() if isinstance(value, MetricWrapperBase)]
    assert len(wrappers) >= 10
    rows = [line for line in GUIDE.splitlines() if line.startswith("| `rlpulse_")]
    for metric in wrappers:
        name = metric._name + ("_total" if isinstance(metric, Counter) else "")
        written = (
            f"`{name}{{{','.join(metric._labelnames)}}}`" if metric._labelnames else f"`{name}`"
        )
        assert any(written in row for row in rows), f"{written} is not in docs/worker.md"
