"""The exporter's Prometheus collector: the families of :class:`ExporterState`, at each scrape.

A custom collector (prometheus-client's ``Collector``): at a scrape it builds every family from
the state under the state's lock, then lets prometheus-client render them outside it. The
exporter's own families are declared once, in :data:`FAMILIES` (name, type, labels, HELP);
docs/watching.md lists the same, and a test checks the two agree.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Literal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from rlpulse.streams.exporter.naming import DropReason, is_counter, rank_help
from rlpulse.streams.exporter.state import ExporterState
from rlpulse.streams.labels import label_flag

__all__ = [
    "FAMILIES",
    "PROCESS_FAMILIES",
    "RANK_LABELS",
    "ExporterCollector",
    "Family",
    "reserved_names",
]

RANK_LABELS: Final = ("run", "stage", "rank")


@dataclass(frozen=True)
class Family:
    """One metric family the exporter serves besides the per-rank ones."""

    name: str
    """The name samples carry (a counter's ends in ``_total``)."""
    kind: Literal["gauge", "counter", "info"]
    labels: tuple[str, ...]
    help: str


_STAGE = ("run", "stage")
_STAT = ("run", "stage", "metric")

FAMILIES: Final = {
    family.name: family
    for family in (
        # Across ranks, from StepSummaries: the stage's latest step.
        Family("rlpulse_step_mean", "gauge", _STAT, "Mean of a metric across the ranks"),
        Family("rlpulse_step_std", "gauge", _STAT, "Std of a metric across the ranks"),
        Family("rlpulse_step_min", "gauge", _STAT, "Smallest value of a metric across the ranks"),
        Family("rlpulse_step_max", "gauge", _STAT, "Largest value of a metric across the ranks"),
        Family("rlpulse_step_non_finite_ranks", "gauge", _STAT, "Ranks whose value was NaN or inf"),
        Family(
            "rlpulse_step_zscore",
            "gauge",
            _STAT,
            "(mean - mean of the previous steps) / their std, over the z-score window of steps",
        ),
        Family("rlpulse_step_ranks_reported", "gauge", _STAGE, "Ranks in the latest summary"),
        Family(
            "rlpulse_step_ranks_missing", "gauge", _STAGE, "Ranks missing from the latest summary"
        ),
        Family(
            "rlpulse_step_ranks_missing_streak",
            "gauge",
            _STAGE,
            "Consecutive steps, up to the latest, that closed with ranks missing",
        ),
        Family(
            "rlpulse_step_stragglers",
            "gauge",
            _STAGE,
            "Ranks that were last in at least straggler_min of the last straggler_window steps",
        ),
        Family(
            "rlpulse_step_last_rank_lag_seconds",
            "gauge",
            _STAGE,
            "How long after the first rank the last rank reported, in the latest step",
        ),
        Family("rlpulse_run_step", "gauge", _STAGE, "The latest step summarised"),
        # Per run.
        Family("rlpulse_run_attempt", "gauge", ("run",), "The run's newest attempt"),
        Family(
            "rlpulse_run_last_event_timestamp_seconds",
            "gauge",
            ("run",),
            "When the run's newest event was written (Unix time)",
        ),
        Family("rlpulse_run_ended", "gauge", ("run",), "1 after the run's run_end, else 0"),
        Family(
            "rlpulse_run_stopped",
            "gauge",
            ("run", "rule"),
            "1 when a stop command was issued to the run's newest attempt, by rule",
        ),
        Family(
            "rlpulse_run_commands_total",
            "counter",
            ("run", "rule", "action", "dry_run"),
            "Commands issued, per action type, since the exporter started",
        ),
        Family(
            "rlpulse_run_acks_total",
            "counter",
            ("run", "rule", "status"),
            "Command acknowledgements, since the exporter started",
        ),
        Family(
            "rlpulse_run_action_verdicts_total",
            "counter",
            ("run", "rule", "verdict"),
            "Verdicts on rule commands (effective, ineffective, unknown), since the exporter "
            "started",
        ),
        Family(
            "rlpulse_run_last_command_timestamp_seconds",
            "gauge",
            ("run", "rule", "actions", "dry_run"),
            "When the latest command of a rule was issued (Unix time)",
        ),
        Family(
            "rlpulse_host_events_total",
            "counter",
            ("run", "host", "kind"),
            "Trainer events per host, since the exporter started",
        ),
        Family(
            "rlpulse_host_log_records_total",
            "counter",
            ("run", "host", "level"),
            "Trainer log records per host and level (DEBUG ... CRITICAL, OTHER), since the "
            "exporter started",
        ),
        # Pipeline health.
        Family(
            "rlpulse_dlq_messages_total",
            "counter",
            ("reason",),
            "Messages on the dead-letter topic, by the kind of reason, since the exporter started",
        ),
        Family(
            "rlpulse_consumer_lag_messages",
            "gauge",
            ("group", "topic", "partition"),
            "Messages after a consumer group's committed offset",
        ),
        # The exporter itself.
        Family(
            "rlpulse_exporter_messages_total",
            "counter",
            ("topic",),
            "Messages read, by topic, lookback included",
        ),
        Family(
            "rlpulse_exporter_undecodable_total",
            "counter",
            ("topic",),
            "Messages that did not decode, by topic",
        ),
        Family(
            "rlpulse_exporter_dropped_samples_total",
            "counter",
            ("reason",),
            "Samples not exported: cap, not_allowed, collision, unnamable or invalid",
        ),
        Family("rlpulse_exporter_series", "gauge", (), "Series of runs held"),
        Family("rlpulse_exporter_runs", "gauge", (), "Runs held"),
        Family(
            "rlpulse_exporter_name_collision_info",
            "info",
            ("name", "metric", "kept"),
            "A logged metric whose sanitised name another one (kept) already owns",
        ),
        Family("rlpulse_exporter_caught_up", "gauge", (), "1 once the start-up lookback was read"),
        Family(
            "rlpulse_exporter_kafka_up",
            "gauge",
            (),
            "1 when the latest consumer-lag measurement got an answer from Kafka",
        ),
        Family(
            "rlpulse_exporter_notifications_total",
            "counter",
            ("outcome",),
            "Alerts for Alertmanager: sent, failed (retried) or dropped",
        ),
    )
}
"""The exporter's own families, by sample name."""

PROCESS_FAMILIES: Final = (
    "process_cpu_seconds_total",
    "process_virtual_memory_bytes",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_open_fds",
    "process_max_fds",
)
"""What prometheus-client's process collector adds about the exporter's own process."""


class ExporterCollector(Collector):
    """Renders an :class:`ExporterState` (guarded by ``lock``) as Prometheus families."""

    def __init__(self, state: ExporterState, lock: threading.Lock) -> None:
        self.state = state
        self.lock = lock

    def collect(self) -> Iterable[Metric]:
        """Every family, built under the lock."""
        with self.lock:
            return list(self._rank_families()) + list(self._own_families())

    def _new(self, name: str) -> GaugeMetricFamily | CounterMetricFamily:
        spec = FAMILIES[name]
        if spec.kind == "counter":
            return CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
        return GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)

    def _rank_families(self) -> Iterator[Metric]:
        state = self.state
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for name, logged in state.family_help.items():
            kind = CounterMetricFamily if is_counter(name) else GaugeMetricFamily
            families[name] = kind(name, rank_help(logged), labels=RANK_LABELS)
        # A row's labels dict is shared by its samples (prometheus-client's add_metric would
        # build one per sample; at 20,000 series that is a third of a scrape's time).
        samples = {name: family.samples for name, family in families.items()}
        for row in state.rows.values():
            labels = row.labels
            for name, value in row.values.items():
                samples[name].append(Sample(name, labels, value, None))
        yield from families.values()

    def _own_families(self) -> Iterator[Metric]:
        state = self.state
        stats = {name: self._new(name) for name in FAMILIES if name.startswith("rlpulse_step_")}
        stage_gauges = {name: self._new(name) for name in ("rlpulse_run_step",)}
        runs = {
            name: self._new(name)
            for name in FAMILIES
            if name.startswith(("rlpulse_run_", "rlpulse_host_")) and name not in stage_gauges
        }
        for run_id, run in state.runs.items():
            for stage_name, stage in run.stages.items():
                labels = (run_id, stage_name)
                stats["rlpulse_step_ranks_reported"].add_metric(labels, stage.ranks_reported)
                stats["rlpulse_step_ranks_missing"].add_metric(labels, stage.ranks_missing)
                stats["rlpulse_step_ranks_missing_streak"].add_metric(labels, stage.missing_streak)
                stats["rlpulse_step_stragglers"].add_metric(labels, stage.stragglers)
                stats["rlpulse_step_last_rank_lag_seconds"].add_metric(
                    labels, stage.last_rank_lag_s
                )
                stage_gauges["rlpulse_run_step"].add_metric(labels, stage.step)
                for metric, summary in stage.metrics.items():
                    labels3 = (run_id, stage_name, metric)
                    stats["rlpulse_step_mean"].add_metric(labels3, summary.mean)
                    stats["rlpulse_step_std"].add_metric(labels3, summary.std)
                    stats["rlpulse_step_min"].add_metric(labels3, summary.min)
                    stats["rlpulse_step_max"].add_metric(labels3, summary.max)
                    stats["rlpulse_step_non_finite_ranks"].add_metric(labels3, summary.non_finite)
                    score = summary.zscore
                    if not math.isnan(score):
                        stats["rlpulse_step_zscore"].add_metric(labels3, score)
            runs["rlpulse_run_attempt"].add_metric((run_id,), run.attempt)
            if run.last_event_ns:
                runs["rlpulse_run_last_event_timestamp_seconds"].add_metric(
                    (run_id,), run.last_event_ns / 1e9
                )
            runs["rlpulse_run_ended"].add_metric((run_id,), int(run.ended_ns is not None))
            rule = state.stopped_by(run_id)
            if rule is not None:
                runs["rlpulse_run_stopped"].add_metric((run_id, rule), 1)
            for (rule, action, dry_run), count in run.commands.items():
                runs["rlpulse_run_commands_total"].add_metric(
                    (run_id, rule, action, label_flag(dry_run)), count
                )
            for (rule, status), count in run.acks.items():
                runs["rlpulse_run_acks_total"].add_metric((run_id, rule, status), count)
            for (rule, verdict), count in run.verdicts.items():
                runs["rlpulse_run_action_verdicts_total"].add_metric((run_id, rule, verdict), count)
            for (rule, actions, dry_run), issued_s in run.last_command_s.items():
                runs["rlpulse_run_last_command_timestamp_seconds"].add_metric(
                    (run_id, rule, actions, label_flag(dry_run)), issued_s
                )
            for (host, kind), count in run.host_events.items():
                runs["rlpulse_host_events_total"].add_metric((run_id, host, kind), count)
            for (host, level), count in run.host_records.items():
                runs["rlpulse_host_log_records_total"].add_metric((run_id, host, level), count)
        yield from stats.values()
        yield from stage_gauges.values()
        yield from runs.values()
        yield from self._pipeline_families()

    def _pipeline_families(self) -> Iterator[Metric]:
        state = self.state
        dlq = self._new("rlpulse_dlq_messages_total")
        for reason, count in state.dead_letters.items():
            dlq.add_metric((reason,), count)
        lag = self._new("rlpulse_consumer_lag_messages")
        for (group, topic, partition), behind in sorted(state.lag.items()):
            lag.add_metric((group, topic, str(partition)), behind)
        counters: dict[str, Counter[str] | Counter[DropReason]] = {
            "rlpulse_exporter_messages_total": state.messages,
            "rlpulse_exporter_undecodable_total": state.undecodable,
            "rlpulse_exporter_dropped_samples_total": state.dropped,
            "rlpulse_exporter_notifications_total": state.notifications,
        }
        yield dlq
        yield lag
        for name, counts in counters.items():
            family = self._new(name)
            for label, count in counts.items():
                family.add_metric((label,), count)
            yield family
        gauges = {
            "rlpulse_exporter_series": state.series,
            "rlpulse_exporter_runs": len(state.runs),
            "rlpulse_exporter_caught_up": int(state.caught_up),
            "rlpulse_exporter_kafka_up": int(state.kafka_up),
        }
        for name, value in gauges.items():
            family = self._new(name)
            family.add_metric((), value)
            yield family
        spec = FAMILIES["rlpulse_exporter_name_collision_info"]
        collisions = InfoMetricFamily(spec.name.removesuffix("_info"), spec.help, labels=())
        for collision in state.names.collisions.values():
            collisions.add_metric(
                (),
                {"name": collision.family, "metric": collision.metric, "kept": collision.kept},
            )
        yield collisions


def reserved_names() -> list[str]:
    """Names per-rank families must not take: the exporter's own and its process's."""
    return [*FAMILIES, *PROCESS_FAMILIES]
