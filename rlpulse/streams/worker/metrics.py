"""Prometheus metrics of the worker; the registry is passed in so tests start fresh."""

from __future__ import annotations

import gc
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from rlpulse.streams.labels import label_flag

__all__ = ["GcPauseTimer", "WorkerMetrics"]


class WorkerMetrics:
    """The pipeline counters one worker exposes on /metrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.events = Counter("rlpulse_events_total", "Trainer events consumed.", registry=registry)
        self.duplicates = Counter(
            "rlpulse_duplicate_events_total",
            "Events dropped as duplicates by (producer_id, seq).",
            registry=registry,
        )
        self.dead_letters = Counter(
            "rlpulse_dead_letters_total",
            "Messages sent to the dead-letter topic.",
            ["reason"],
            registry=registry,
        )
        self.summaries = Counter(
            "rlpulse_step_summaries_total",
            "Step summaries published.",
            ["closed_by"],
            registry=registry,
        )
        self.commands = Counter(
            "rlpulse_commands_total",
            "Control commands issued by rules.",
            ["rule_id", "dry_run"],
            registry=registry,
        )
        self.verdicts = Counter(
            "rlpulse_verdicts_total",
            "Verdicts on rule commands published (a re-sent one after a crash counts again).",
            ["rule_id", "verdict"],
            registry=registry,
        )
        self.rules_updates = Counter(
            "rlpulse_rules_updates_total",
            "Rules texts offered to the worker, by outcome (loaded or refused).",
            ["outcome"],
            registry=registry,
        )
        self.rules_refused = Counter(
            "rlpulse_rules_refused_total",
            "Rules texts refused, by reason (invalid, too_large, not_utf8, unreadable).",
            ["reason"],
            registry=registry,
        )
        self.ticks_deferred = Counter(
            "rlpulse_grace_ticks_deferred_total",
            "Grace timer ticks skipped because the worker was behind on that partition's events.",
            registry=registry,
        )
        self.rewinds = Counter(
            "rlpulse_partition_rewinds_total",
            "Times offsets faust skipped were read again, or a stalled partition sought back.",
            registry=registry,
        )
        self.join_lag = Histogram(
            "rlpulse_step_join_seconds",
            "From a step's first event to its summary.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=registry,
        )
        self.gc_pauses = Histogram(
            "rlpulse_gc_pause_seconds",
            "Garbage-collector pauses of the worker process, by generation.",
            ["generation"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=registry,
        )
        self.gc_longest = Gauge(
            "rlpulse_gc_longest_pause_seconds",
            "The longest garbage-collector pause of the worker process so far.",
            registry=registry,
        )
        ProcessCollector(registry=registry)  # process_cpu_seconds_total, resident memory, ...

    def count_command(self, rule_id: str | None, *, dry_run: bool) -> None:
        """Count one command issued: ``rlpulse_commands_total{rule_id, dry_run}``."""
        self.commands.labels(rule_id or "", label_flag(dry_run)).inc()


class GcPauseTimer:
    """Times every garbage collection of this process into :class:`WorkerMetrics`.

    A full collection walks every object the collector tracks; with many of them alive (the
    worker keeps released steps for the late window) one pause can stall the event loop, so
    the worker reports them. :meth:`install` adds a ``gc.callbacks`` hook; one per process.
    """

    def __init__(self, metrics: WorkerMetrics) -> None:
        self._metrics = metrics
        self._started = 0.0
        self._longest = 0.0

    def install(self) -> None:
        """Start timing collections."""
        gc.callbacks.append(self._on_gc)

    def uninstall(self) -> None:
        """Stop timing collections."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        self._metrics.gc_pauses.labels(str(info.get("generation", -1))).observe(pause)
        if pause > self._longest:
            self._longest = pause
            self._metrics.gc_longest.set(pause)
