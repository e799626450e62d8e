"""What the exporter serves: the latest value of every series, built from decoded records.

Pure: no Kafka, no HTTP, no clock of its own. The consumer hands it each decoded record with
``live`` — whether the record was written after the exporter started (``False`` for the
lookback it reads at start). Gauges (latest values, a run's step, whether it stopped) are
rebuilt from the lookback; counters (commands, acks, events and log records per host, dead
letters) count only live records, so a restart never counts a record twice (Prometheus sees
a counter reset, not a jump). Time comes in as ``now_ns`` where it matters (expiry).

Latest means: per rank and stage, the event of the newest (attempt, step) — a resumed attempt
overrides its run's older values, a late or replayed event for an older step does not (a
producer's events arrive in order, so that is only ever a duplicate); per stage, the summary
of the newest step, a revision replacing the one before it.

Bounded: a run's series go ``expire_ended_s`` after its ``run_end`` or ``expire_silent_s``
after its last record (the records' own timestamps); per-rank series can be limited to an
allow-list; at most ``max_series`` series of runs exist, and every sample that was not
exported is counted by reason (:data:`~rlpulse.streams.exporter.naming.DropReason`).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, TypeVar, get_args

from rlpulse.rules.arith import zscore
from rlpulse.schemas.records import (
    ActionVerdict,
    CommandAck,
    ControlCommand,
    MetricStats,
    StepSummary,
    TrainerEvent,
)
from rlpulse.schemas.validation import (
    count_problem,
    name_problem,
    position_problem,
    run_problem,
    stage_problem,
)
from rlpulse.settings import EventLimits, ExporterSettings
from rlpulse.streams.exporter.naming import DropReason, FamilyNames

__all__ = [
    "DEAD_LETTER_KINDS",
    "LOG_LEVELS",
    "OPERATOR_RULE",
    "SUMMARY_SERIES_PER_METRIC",
    "UNKNOWN_RULE",
    "ExporterState",
    "LagKey",
    "LogTally",
    "RankKey",
    "RankRow",
    "RunState",
    "StageState",
    "SummaryStats",
    "command_rule",
]

RankKey = tuple[str, str, str]
"""A rank's row of per-rank series: run, stage, rank."""
LagKey = tuple[str, str, int]
"""A consumer group, topic and partition."""

SUMMARY_SERIES_PER_METRIC: Final = 6
"""Series one metric of a stage's summaries exports: mean, std, min, max, non-finite, z-score."""
OPERATOR_RULE: Final = "operator"
"""The ``rule`` label of commands an operator issued (``rlpulse control ...``)."""
UNKNOWN_RULE: Final = "unknown"
"""The ``rule`` label of acks whose command the exporter has not seen."""
MAX_COMMANDS_REMEMBERED: Final = 4096
"""Command ids remembered per run, to attribute acks to their rule (and verdict ids, to count
each once)."""
_V = TypeVar("_V")

MAX_PLACES_REMEMBERED: Final = 100_000
"""(producer, stage, rank, world size) combinations remembered as valid."""

NS_PER_S: Final = 1_000_000_000
DEAD_LETTER_KINDS: Final = (
    "undecodable", "invalid", "too_large", "too_late", "error", "rejected"
)  # fmt: skip
"""The kinds of reason the worker (and ``rejected``: the indexer) writes into a dead letter's
``rlpulse-reason`` header."""
LOG_LEVELS: Final = frozenset({"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"})
"""The ``level`` label's values; a custom level's records count as ``OTHER``."""


@dataclass(frozen=True, slots=True)
class LogTally:
    """What the exporter takes from one ``<prefix>.logs`` message: whose, and each level."""

    run_id: str
    hostname: str
    levels: list[str]


def command_rule(command: ControlCommand) -> str:
    """The ``rule`` label of a command: its rule id, or ``operator``."""
    return command["rule_id"] or OPERATOR_RULE


@dataclass(slots=True)
class RankRow:
    """The latest values one rank logged for one stage of a run."""

    labels: dict[str, str]
    """``run``, ``stage`` and ``rank``: the labels of every sample of the row (shared)."""
    attempt: int
    step: int
    values: dict[str, float] = field(default_factory=dict)
    """Per-rank family -> latest value."""


@dataclass
class SummaryStats:
    """One metric of a stage's latest summary, and the means of its recent steps."""

    mean: float
    std: float
    min: float
    max: float
    non_finite: int
    position: tuple[int, int]
    """(attempt, step) the values are from."""
    recent: deque[float]
    """Means of the last ``zscore_window`` steps of this attempt, oldest first."""

    @property
    def zscore(self) -> float:
        """(latest mean - mean of the steps before) / their std, with a full window; else NaN."""
        if self.recent.maxlen is None or len(self.recent) < self.recent.maxlen:
            return math.nan
        return zscore(list(self.recent))


@dataclass
class StageState:
    """What a run's StepSummaries of one stage say, as of the latest step."""

    attempt: int = -1
    step: int = -1
    revision: int = 0
    ranks_reported: int = 0
    ranks_missing: int = 0
    missing_streak: int = 0
    stragglers: int = 0
    last_rank_lag_s: float = 0.0
    metrics: dict[str, SummaryStats] = field(default_factory=dict)


@dataclass
class RunState:
    """Everything the exporter knows of one run."""

    attempt: int = 0
    last_event_ns: int = 0
    """Timestamp of the newest event (the trainer's clock)."""
    last_seen_ns: int = 0
    """Timestamp of the newest record of any kind."""
    ended_ns: int | None = None
    stopped: tuple[int, str] | None = None
    """(attempt, rule) of the first stop command of the run's newest attempt."""
    stages: dict[str, StageState] = field(default_factory=dict)
    rows: set[RankKey] = field(default_factory=set)
    """The run's rows of per-rank series."""
    commands: Counter[tuple[str, str, bool]] = field(default_factory=Counter)
    """Live commands by (rule, action type, dry run)."""
    acks: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Live acks by (rule, status)."""
    verdicts: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Live verdicts by (rule, verdict), each verdict id once."""
    verdict_ids: dict[str, None] = field(default_factory=dict)
    """The verdict ids seen (the newest :data:`MAX_COMMANDS_REMEMBERED`): a copy re-sent
    after a worker's crash counts once."""
    last_command_s: dict[tuple[str, str, bool], float] = field(default_factory=dict)
    """Issue time of the latest command by (rule, its action types joined by ',', dry run)."""
    command_rules: dict[str, str] = field(default_factory=dict)
    host_events: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Live events by (hostname, kind)."""
    host_records: Counter[tuple[str, str]] = field(default_factory=Counter)
    """Live log records by (hostname, level)."""

    def seen(self, timestamp_ns: int) -> None:
        """Note a record of this run written at ``timestamp_ns``."""
        self.last_seen_ns = max(self.last_seen_ns, timestamp_ns)


class ExporterState:
    """The latest values of every series the exporter serves (see the module docstring)."""

    def __init__(
        self,
        settings: ExporterSettings,
        limits: EventLimits | None = None,
        reserved: Iterable[str] = (),
    ) -> None:
        self.settings = settings
        self.limits = limits if limits is not None else EventLimits()
        self.names = FamilyNames(
            settings.namespace, settings.allow_metrics, reserved, self.limits.max_name_chars
        )
        self.rows: dict[RankKey, RankRow] = {}
        """Per-rank series, a row per (run, stage, rank)."""
        self.family_help: dict[str, str] = {}
        """Per-rank family -> the logged name that feeds it (for its HELP text), in the order
        the families appeared."""
        self.family_series: dict[str, int] = {}
        """Per-rank family -> how many rows hold a value of it."""
        self.runs: dict[str, RunState] = {}
        self.dead_letters: Counter[str] = Counter(dict.fromkeys(DEAD_LETTER_KINDS, 0))
        """Live dead letters by the kind of their reason (``undecodable``, ``invalid``...).

        The known kinds start at 0, so that Prometheus sees the first one arrive.
        """
        self.lag: dict[LagKey, int] = {}
        self.dropped: Counter[DropReason] = Counter(dict.fromkeys(get_args(DropReason), 0))
        self.messages: Counter[str] = Counter()
        """Messages read, by topic role (``events``, ``steps``...), lookback included."""
        self.undecodable: Counter[str] = Counter()
        """Messages that did not decode, by topic role."""
        self.notifications: Counter[str] = Counter()
        """Alerts sent to Alertmanager, by outcome."""
        self.caught_up = False
        """Whether the lookback has been read."""
        self.kafka_up = False
        """Whether the last consumer-lag measurement got an answer from Kafka."""
        self.rank_series = 0
        self.summary_metrics = 0
        self._good_places: set[tuple[str, str, int, int]] = set()

    @property
    def series(self) -> int:
        """Series of runs held: per-rank series and the summaries' per-metric series."""
        return self.rank_series + SUMMARY_SERIES_PER_METRIC * self.summary_metrics

    def _run(self, run_id: str) -> RunState:
        run = self.runs.get(run_id)
        if run is None:
            run = self.runs[run_id] = RunState()
        return run

    # -- records -------------------------------------------------------------------------

    def add_event(self, event: TrainerEvent, live: bool) -> None:
        """A TrainerEvent: per-rank gauges, the run's liveness and events per host."""
        run = self.runs.get(event["run_id"])
        if run is None:
            if run_problem(event["run_id"], event["attempt"], self.limits) is not None:
                self.dropped["invalid"] += 1
                return
            run = self.runs[event["run_id"]] = RunState()
        timestamp, attempt, kind = event["timestamp_ns"], event["attempt"], event["kind"]
        if kind in ("metrics", "log") and self._placement_problem(event):
            self.dropped["invalid"] += 1
            return
        if timestamp > run.last_event_ns:  # events are most records: no call for seen()
            run.last_event_ns = timestamp
            run.last_seen_ns = max(run.last_seen_ns, timestamp)
        if attempt > run.attempt:
            run.attempt = attempt
            run.ended_ns = None
        if live:
            run.host_events[(event["hostname"], kind)] += 1
        if kind == "run_end" and attempt == run.attempt:
            run.ended_ns = timestamp
        elif kind == "run_start" and attempt == run.attempt:
            run.ended_ns = None
        if event["metrics"] and attempt == run.attempt:
            self._add_rank_values(run, event)

    def _placement_problem(self, event: TrainerEvent) -> bool:
        """Whether the worker would dead-letter this metrics or log event.

        :func:`~rlpulse.schemas.validation.event_problem`'s checks that the Avro schema does
        not already make (field types): a negative step, counts and name lengths on every
        event; stage, rank, world size and producer id once per combination of them. A metric
        name that is too long drops that metric only (names are decided once each, in
        :class:`FamilyNames`); the worker refuses the whole event.
        """
        limits, tags = self.limits, event["tags"]
        if event["step"] < 0 or count_problem(len(event["metrics"]), len(tags), limits):
            return True
        if tags and name_problem(max((*tags, *tags.values()), key=len), limits):
            return True
        stage, rank, world_size = event["stage"], event["rank"], event["world_size"]
        place = (event["producer_id"], stage, rank, world_size)
        if place in self._good_places:
            return False
        if (
            stage_problem(stage)
            or name_problem(stage, limits)
            or name_problem(event["producer_id"], limits)
            or position_problem(0, rank, world_size, limits)
        ):
            return True
        if len(self._good_places) >= MAX_PLACES_REMEMBERED:
            self._good_places.clear()
        self._good_places.add(place)
        return False

    def _add_rank_values(self, run: RunState, event: TrainerEvent) -> None:
        key: RankKey = (event["run_id"], event["stage"], str(event["rank"]))
        attempt, step = event["attempt"], event["step"]
        row = self.rows.get(key)
        if row is None:
            labels = {"run": key[0], "stage": key[1], "rank": key[2]}
            row = self.rows[key] = RankRow(labels, attempt, step)
            run.rows.add(key)
        elif attempt < row.attempt or (attempt == row.attempt and step < row.step):
            return
        row.attempt, row.step = attempt, step
        values, decided, resolve = row.values, self.names.decided, self.names.resolve
        for metric, value in event["metrics"].items():
            family, reason = decided.get(metric) or resolve(metric)
            if family is None:
                self.dropped[reason or "invalid"] += 1
            elif family in values:
                values[family] = value
            elif self.series >= self.settings.max_series:
                self.dropped["cap"] += 1
            else:
                values[family] = value
                self.rank_series += 1
                known = self.family_series.get(family)
                if known is None:
                    self.family_help[family] = metric
                self.family_series[family] = (known or 0) + 1

    def add_summary(self, summary: StepSummary) -> None:
        """A StepSummary: the across-ranks statistics of its stage's latest step."""
        run = self._run(summary["run_id"])
        run.seen(summary["emitted_ns"])
        attempt, step, revision = summary["attempt"], summary["step"], summary["revision"]
        if attempt < run.attempt:
            return
        run.attempt = attempt
        stage = run.stages.get(summary["stage"])
        if stage is None:
            stage = run.stages[summary["stage"]] = StageState()
        position, latest = (attempt, step), (stage.attempt, stage.step)
        if position < latest or (position == latest and revision <= stage.revision):
            return
        if position > latest:
            missing = bool(summary["missing_ranks"])
            stage.missing_streak = stage.missing_streak + 1 if missing else 0
        stage.attempt, stage.step, stage.revision = attempt, step, revision
        stage.ranks_reported = len(summary["ranks_reported"])
        stage.ranks_missing = len(summary["missing_ranks"])
        stage.stragglers = len(summary.get("stragglers") or [])
        stage.last_rank_lag_s = summary["last_rank_lag_ns"] / NS_PER_S
        for metric, stats in summary["metrics"].items():
            self._add_stats(stage, metric, stats, position)

    def _add_stats(
        self, stage: StageState, metric: str, stats: MetricStats, position: tuple[int, int]
    ) -> None:
        mean = stats["mean"]
        known = stage.metrics.get(metric)
        if known is None:
            if self.series + SUMMARY_SERIES_PER_METRIC > self.settings.max_series:
                self.dropped["cap"] += 1
                return
            window = self.settings.zscore_window
            known = SummaryStats(mean, 0.0, 0.0, 0.0, 0, position, deque(maxlen=window))
            stage.metrics[metric] = known
            self.summary_metrics += 1
        if position[0] != known.position[0]:
            known.recent.clear()  # a new attempt: a fresh window, as the rules keep
        if position == known.position and known.recent:
            known.recent[-1] = mean  # a revision of the same step
        else:
            known.recent.append(mean)
        known.mean, known.std, known.min, known.max = mean, stats["std"], stats["min"], stats["max"]
        known.non_finite, known.position = stats["non_finite"], position

    def add_command(self, command: ControlCommand, live: bool) -> None:
        """A ControlCommand: counts per rule and action, whether the run was stopped, by whom."""
        run = self._run(command["run_id"])
        run.seen(command["issued_ns"])
        rule, dry_run = command_rule(command), command["dry_run"]
        types = [action["type"] for action in command["actions"]]
        if live:
            for action in types:
                run.commands[(rule, action, dry_run)] += 1
        run.last_command_s[(rule, ",".join(types), dry_run)] = command["issued_ns"] / NS_PER_S
        _remember(run.command_rules, command["command_id"], rule)
        attempt = command["attempt"]
        first_stop = run.stopped is None or run.stopped[0] < attempt
        if not dry_run and "stop" in types and attempt >= run.attempt and first_stop:
            run.stopped = (attempt, rule)

    def add_ack(self, ack: CommandAck, live: bool) -> None:
        """A CommandAck: counts per rule and status."""
        run = self._run(ack["run_id"])
        run.seen(ack["acked_ns"])
        if live:
            run.acks[(run.command_rules.get(ack["command_id"], UNKNOWN_RULE), ack["status"])] += 1

    def add_verdict(self, verdict: ActionVerdict, live: bool) -> None:
        """An ActionVerdict: counted per rule and verdict, each verdict id once."""
        run = self._run(verdict["run_id"])
        run.seen(verdict["emitted_ns"])
        if verdict["verdict_id"] in run.verdict_ids:
            return
        _remember(run.verdict_ids, verdict["verdict_id"], None)
        if live:
            run.verdicts[(verdict["rule_id"], verdict["verdict"])] += 1

    def add_logs(self, tally: LogTally, live: bool) -> None:
        """The log records of one message: counted per host and level (live ones only)."""
        if not live:
            return
        run = self.runs.get(tally.run_id)
        if run is None:
            if run_problem(tally.run_id, 0, self.limits) is not None:
                self.dropped["invalid"] += 1
                return
            run = self.runs[tally.run_id] = RunState()
        counts, host = run.host_records, tally.hostname
        for level in tally.levels:
            counts[(host, level if level in LOG_LEVELS else "OTHER")] += 1

    def add_dead_letter(self, reason: str, live: bool) -> None:
        """A message on the dead-letter topic, with its ``rlpulse-reason`` header."""
        if live:
            self.dead_letters[reason.split(":", 1)[0].strip() or "unknown"] += 1

    def set_lag(self, lag: Mapping[LagKey, int] | None) -> None:
        """The latest consumer-lag measurement; ``None`` when Kafka did not answer."""
        self.kafka_up = lag is not None
        if lag is not None:
            self.lag = dict(lag)

    # -- expiry --------------------------------------------------------------------------

    def stopped_by(self, run_id: str) -> str | None:
        """The rule that stopped the run's newest attempt, if one did."""
        run = self.runs.get(run_id)
        if run is None or run.stopped is None or run.stopped[0] < run.attempt:
            return None
        return run.stopped[1]

    def expire(self, now_ns: int) -> list[str]:
        """Remove the runs that ended or went silent long enough ago; returns their ids."""
        ended_ns = round(self.settings.expire_ended_s * NS_PER_S)
        silent_ns = round(self.settings.expire_silent_s * NS_PER_S)
        gone = [
            run_id
            for run_id, run in self.runs.items()
            if now_ns - run.last_seen_ns > silent_ns
            or (
                run.ended_ns is not None and now_ns - max(run.ended_ns, run.last_seen_ns) > ended_ns
            )
        ]
        emptied: list[str] = []
        for run_id in gone:
            run = self.runs.pop(run_id)
            for key in run.rows:
                row = self.rows.pop(key)
                self.rank_series -= len(row.values)
                for family in row.values:
                    self.family_series[family] -= 1
                    if not self.family_series[family]:
                        del self.family_series[family], self.family_help[family]
                        emptied.append(family)
            self.summary_metrics -= sum(len(stage.metrics) for stage in run.stages.values())
        if emptied:
            self.names.release(emptied)
        return gone


def _remember(kept: dict[str, _V], key: str, value: _V) -> None:
    """Put ``key`` in ``kept``, dropping the oldest key past :data:`MAX_COMMANDS_REMEMBERED`."""
    kept[key] = value
    if len(kept) > MAX_COMMANDS_REMEMBERED:
        del kept[next(iter(kept))]
