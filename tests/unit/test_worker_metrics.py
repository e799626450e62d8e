"""The worker's own metrics: garbage-collector pauses and the process collector."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry

from rlpulse.streams.labels import label_flag
from rlpulse.streams.worker.metrics import GcPauseTimer, WorkerMetrics


def test_every_collection_is_timed_by_generation() -> None:
    registry = CollectorRegistry()
    timer = GcPauseTimer(WorkerMetrics(registry))
    timer.install()
    try:
        gc.collect()
        gc.collect(0)
    finally:
        timer.uninstall()
    full = registry.get_sample_value("rlpulse_gc_pause_seconds_count", {"generation": "2"})
    young = registry.get_sample_value("rlpulse_gc_pause_seconds_count", {"generation": "0"})
    assert full is not None and full >= 1 and young is not None and young >= 1
    longest = registry.get_sample_value("rlpulse_gc_longest_pause_seconds")
    assert longest is not None and longest > 0
    gc.collect()  # uninstalled: no longer counted
    after = registry.get_sample_value("rlpulse_gc_pause_seconds_count", {"generation": "2"})
    assert after == full


def test_process_metrics_are_exported() -> None:
    registry = CollectorRegistry()
    WorkerMetrics(registry)
    assert (registry.get_sample_value("process_resident_memory_bytes") or 0) > 0
    assert registry.get_sample_value("process_cpu_seconds_total") is not None


def test_a_command_is_counted_with_dry_run_as_the_exporter_writes_it() -> None:
    """``dry_run="false"``/``"true"``: the exporter's spelling, not Python's ``False``."""
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    metrics.count_command("kl-guard", dry_run=False)
    metrics.count_command("kl-guard", dry_run=True)
    metrics.count_command(None, dry_run=False)  # an operator command has no rule
    for labels in (
        {"rule_id": "kl-guard", "dry_run": "false"},
        {"rule_id": "kl-guard", "dry_run": "true"},
        {"rule_id": "", "dry_run": "false"},
    ):
        assert registry.get_sample_value("rlpulse_commands_total", labels) == 1
    assert label_flag(False) == "false" and label_flag(True) == "true"
