"""Prometheus counters of the worker; the registry is passed in so tests start fresh."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


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
            "Times a partition was sought back: its delivery stalled or skipped offsets.",
            registry=registry,
        )
        self.join_lag = Histogram(
            "rlpulse_step_join_seconds",
            "From a step's first event to its summary.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=registry,
        )
