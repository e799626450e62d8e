"""Backtesting rules: recorded events through the worker's own step pipeline, offline.

:func:`run_backtest` drives the same :class:`~rlpulse.streams.pipeline.StepPipeline` as
the worker (step joiner and rule engine), with plain dicts for its tables, so a recording
yields the commands -- the same ``ControlCommand`` records, with the same ids and reasons --
the worker would have issued for it:

- **time**: each event's ``timestamp_ns`` is the clock (``now_ns``), never going back (an
  earlier timestamp leaves the clock where it is; a missing one, as in verl files, is 0).
  Before each event the joiner expires what the clock has made due, like the worker's
  timer with a perfect resolution, so a step with a missing rank closes ``grace_s`` after
  its first event, as it would have.
- **end of the recording**: groups still open are closed as the worker's timer would close
  them if the runs went quiet: ``expire`` at the last clock value plus the grace period
  (``closed_by`` ``grace``), so the last steps are evaluated too; or plus the revision
  linger, if that is longer, so pending revisions of late ranks are emitted too.
- **attempts**: events without one get it inferred (docs/design.md, "Attempts"): a step at
  or below the last
  seen step of the same run, stage and rank starts that rank's next attempt; a (stage,
  rank) seen for the first time joins the run's highest attempt so far; ``run_start`` and
  ``run_end`` join the run's current attempt.

Inputs (:func:`read_recording`, detected from the path):

- rlpulse JSON Lines: one TrainerEvent dict per line. ``run_id`` and ``step`` are required,
  and ``stage``, ``rank`` and ``world_size`` for ``metrics`` and ``log`` events; the other
  fields get defaults (``kind`` metrics, ``attempt`` inferred, ``timestamp_ns`` 0, ``tags``
  empty, ``producer_id`` the file, ``seq`` the line number).
- a directory in the per-rank layout ``<component>_rank<N>.jsonl``
  (:mod:`rlpulse.schemas.jsonl`), or one such file: the run id is each line's ``run_id``
  (EventLogger writes it, so runs that share a ``log_dir`` and append to the same files stay
  apart); a line without one belongs to ``--run`` (default: the directory's name). World
  size of a run's component = its rank files that hold a line of that run (1 for a single
  file); stage from each line. The files are merged by ``timestamp_ns`` (ties by step,
  rank, component), each keeping its own order.
- verl's file-backend JSON Lines ``{"step": N, "data": {...}}``: rank 0's reduced dict as
  stage ``trainer`` with world size 1; keys (``actor/ppo_kl``) are metric names as they
  are; run id from ``--run`` (default: the file name without ``.jsonl``).

**verdicts**: the checks of rules with ``expect`` (:mod:`rlpulse.rules.verdicts`) need the
applied step of each command. Given the run's acks (``read_acks``: the ``acks`` view of the
archive, or the acks topic, as JSON Lines), each command gets its own; without them each is
assumed applied at the step after the one it was issued for (:func:`assumed_ack`).

A line that cannot be read, or that the joiner refuses, is reported with its file and line
number and skipped. :func:`run_backtest` is pure (no I/O beyond iterating its input);
``rlpulse rules backtest`` (:mod:`rlpulse.cli.rules`) is the command line around it.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, TypeGuard, get_args

from rlpulse.rules.evaluator import RuleEngine
from rlpulse.rules.model import RuleSet
from rlpulse.schemas.jsonl import (
    MalformedLine,
    RankFile,
    RankRecord,
    list_rank_files,
    number_fields,
    parse_rank_file,
    read_json_lines,
    read_rank_file,
    read_rank_logs,
)
from rlpulse.schemas.records import (
    AckStatus,
    ActionVerdict,
    CommandAck,
    ControlCommand,
    EventKind,
    TrainerEvent,
)
from rlpulse.settings import JoinerSettings
from rlpulse.streams.pipeline import PipelineTables, StepOutput, StepPipeline

__all__ = [
    "VERL_STAGE",
    "BacktestResult",
    "InputFormat",
    "Recorded",
    "RecordedEvent",
    "Rejection",
    "assumed_ack",
    "detect_format",
    "infer_attempts",
    "read_acks",
    "read_per_rank",
    "read_recording",
    "read_rlpulse_jsonl",
    "read_verl_jsonl",
    "run_backtest",
]

VERL_STAGE: Final = "trainer"
"""Stage of the events read from a verl file (rank 0's dict, reduced across ranks)."""

_KINDS: Final = frozenset(get_args(EventKind))
_BOUNDARY_KINDS: Final = frozenset({"run_start", "run_end"})
_SECOND_NS: Final = 1_000_000_000
_SHOWN_CHARS: Final = 120


# -- recorded events -------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedEvent:
    """One event of a recording and the line it was read from.

    ``attempt_given`` is False when the input had no attempt; :func:`infer_attempts` then
    sets ``event["attempt"]`` (until then it holds 0).
    """

    event: TrainerEvent
    path: Path = Path("<events>")
    line: int = 0
    attempt_given: bool = True

    def with_attempt(self, attempt: int) -> RecordedEvent:
        """A copy whose event has ``attempt``, marked as given."""
        return replace(self, event={**self.event, "attempt": attempt}, attempt_given=True)


Recorded = RecordedEvent | MalformedLine
"""What the readers yield: an event, or a line that could not be read in its place."""


class InputFormat(enum.StrEnum):
    """The recordings :func:`read_recording` reads; ``auto`` detects one from the path."""

    AUTO = "auto"
    RLPULSE = "rlpulse"
    PER_RANK = "per-rank"
    VERL = "verl"


def detect_format(path: Path) -> InputFormat:
    """Tell the format of a recording from its path and first readable line.

    A directory is the per-rank layout; a file is verl's if its first JSON object has a
    ``data`` object and no ``run_id``; a file named ``<component>_rank<N>.jsonl`` whose first
    object has no ``world_size`` is one file of the per-rank layout; else rlpulse JSON Lines.
    """
    if path.is_dir():
        return InputFormat.PER_RANK
    for item in read_json_lines(path):
        if isinstance(item, MalformedLine):
            continue
        _, found = item
        if isinstance(found.get("data"), dict) and "run_id" not in found:
            return InputFormat.VERL
        if parse_rank_file(path) is not None and "world_size" not in found:
            return InputFormat.PER_RANK
        return InputFormat.RLPULSE
    return InputFormat.RLPULSE


def read_recording(
    path: Path, *, run: str | None = None, input_format: InputFormat = InputFormat.AUTO
) -> Iterator[Recorded]:
    """Read a recording in any supported format (see the module docstring), lazily.

    ``run`` names the run of verl recordings and of per-rank lines without a ``run_id``;
    for rlpulse JSON Lines and per-rank recordings it keeps only that run's events. Raises
    ``ValueError`` for a per-rank directory without rank files, ``OSError`` when the path
    cannot be read.
    """
    chosen = detect_format(path) if input_format is InputFormat.AUTO else input_format
    if chosen is InputFormat.PER_RANK:
        directory = path.resolve() if path.is_dir() else path.resolve().parent
        return read_per_rank(path, run or directory.name, only=run)
    if chosen is InputFormat.VERL:
        return read_verl_jsonl(path, run or path.name.removesuffix(".jsonl"))
    events = read_rlpulse_jsonl(path)
    if run is None:
        return events
    return (i for i in events if isinstance(i, MalformedLine) or i.event["run_id"] == run)


def read_rlpulse_jsonl(path: Path) -> Iterator[Recorded]:
    """Read rlpulse JSON Lines: one TrainerEvent dict per line; defaults as documented."""
    for item in read_json_lines(path):
        if isinstance(item, MalformedLine):
            yield item
            continue
        number, fields = item
        try:
            event, attempt_given = _event_from_fields(fields, path, number)
        except ValueError as exc:
            yield MalformedLine(path, number, str(exc), _shown(fields))
            continue
        yield RecordedEvent(event, path, number, attempt_given)


def read_per_rank(source: Path, run_id: str, *, only: str | None = None) -> Iterator[Recorded]:
    """Read a per-rank layout directory, or one rank file, as events (module docstring).

    Lines without a ``run_id`` belong to run ``run_id``; with ``only``, lines of other runs
    are left out. Raises ``ValueError`` (when called) if a directory holds no rank files or
    a file is not named like one.
    """
    if source.is_dir():
        files = list_rank_files(source)
        if not files:
            raise ValueError(f"{source} holds no <component>_rank<N>.jsonl files")
    else:
        file = parse_rank_file(source)
        if file is None:
            raise ValueError(f"{source} is not named <component>_rank<N>.jsonl")
        files = [file]
    sizes = _run_world_sizes(files, run_id)
    for item in read_rank_logs(source, files):
        if isinstance(item, MalformedLine):
            yield item
            continue
        run = _line_run(item, run_id)
        if only is None or run == only:
            yield _rank_event(item, run, sizes[run, item.component])


def _line_run(record: RankRecord, default: str) -> str:
    """The run of a rank file line: its ``run_id`` field, else ``default``."""
    value = record.fields.get("run_id")
    return value if isinstance(value, str) and value else default


def _run_world_sizes(files: Iterable[RankFile], default_run: str) -> dict[tuple[str, str], int]:
    """(run, component) -> how many of the component's rank files hold a line of the run."""
    sizes: dict[tuple[str, str], int] = {}
    for file in files:
        runs = {
            _line_run(i, default_run) for i in read_rank_file(file) if isinstance(i, RankRecord)
        }
        for run in runs:
            sizes[run, file.component] = sizes.get((run, file.component), 0) + 1
    return sizes


def _rank_event(item: RankRecord, run_id: str, world_size: int) -> RecordedEvent:
    attempt = item.attempt
    event = item.to_event(run_id, world_size, attempt or 0)
    return RecordedEvent(event, item.path, item.line, attempt is not None)


def read_verl_jsonl(path: Path, run_id: str) -> Iterator[Recorded]:
    """Read verl's file-backend JSON Lines as rank 0 of stage ``trainer``, world size 1.

    The number values of ``data`` are the metrics (other values are left out); other
    top-level keys than ``step`` and ``data`` are ignored.
    """
    for item in read_json_lines(path):
        if isinstance(item, MalformedLine):
            yield item
            continue
        number, fields = item
        step, data = fields.get("step"), fields.get("data")
        if not _is_int(step) or step < 0 or not isinstance(data, dict):
            reason = 'expected {"step": <int >= 0>, "data": {...}}'
            yield MalformedLine(path, number, reason, _shown(fields))
            continue
        record = RankRecord(
            path=path,
            line=number,
            component=VERL_STAGE,
            rank=0,
            stage=VERL_STAGE,
            step=step,
            metrics=number_fields(data),
            timestamp_ns=None,
            fields=fields,
        )
        yield RecordedEvent(record.to_event(run_id, world_size=1), path, number, False)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


_MISSING: Final = object()
_BOUNDARY_STAGE: Final = "trainer"  # the stage EventLogger gives run_start and run_end
_KIND_CHECKS: Final[Mapping[str, tuple[Callable[[object], bool], str]]] = {
    "int": (_is_int, "an int"),
    "str": (lambda value: isinstance(value, str), "a string"),
    "map": (lambda value: isinstance(value, dict), "an object"),
}


def _get(fields: Mapping[str, Any], name: str, kind: str, default: object = _MISSING) -> Any:
    """``fields[name]`` checked to be of ``kind``; ``default`` when absent or null."""
    value = fields.get(name)
    if value is None:
        if default is _MISSING:
            raise ValueError(f"missing field {name!r}")
        return default
    valid, expected = _KIND_CHECKS[kind]
    if not valid(value):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


def _event_from_fields(
    fields: Mapping[str, Any], path: Path, number: int
) -> tuple[TrainerEvent, bool]:
    """The TrainerEvent of one rlpulse JSON line, and whether it had an attempt."""
    kind = _get(fields, "kind", "str", "metrics")
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {sorted(_KINDS)}, got {kind!r}")
    boundary = kind in _BOUNDARY_KINDS  # run_start/run_end: no stage, rank, world size needed
    raw_metrics: dict[str, Any] = _get(fields, "metrics", "map", {})
    metrics = number_fields(raw_metrics)
    if len(metrics) != len(raw_metrics):
        bad = {k: v for k, v in raw_metrics.items() if k not in metrics}
        raise ValueError(f"metrics must be numbers, got {bad!r}")
    tags: dict[str, Any] = _get(fields, "tags", "map", {})
    if not all(isinstance(value, str) for value in tags.values()):
        raise ValueError(f"tags must map to strings, got {tags!r}")
    attempt = _get(fields, "attempt", "int", None)
    event: TrainerEvent = {
        "kind": kind,
        "run_id": _get(fields, "run_id", "str"),
        "attempt": 0 if attempt is None else attempt,
        "step": _get(fields, "step", "int"),
        "stage": _get(fields, "stage", "str", _BOUNDARY_STAGE if boundary else _MISSING),
        "rank": _get(fields, "rank", "int", 0 if boundary else _MISSING),
        "world_size": _get(fields, "world_size", "int", 1 if boundary else _MISSING),
        "metrics": metrics,
        "level": _get(fields, "level", "str", None),
        "message": _get(fields, "message", "str", None),
        "tags": dict(tags),
        "timestamp_ns": _get(fields, "timestamp_ns", "int", 0),
        "hostname": _get(fields, "hostname", "str", ""),
        "pid": _get(fields, "pid", "int", 0),
        "producer_id": _get(fields, "producer_id", "str", str(path)),
        "seq": _get(fields, "seq", "int", number),
        "policy_version": _get(fields, "policy_version", "int", None),
        "trace_id": _get(fields, "trace_id", "str", None),
    }
    return event, attempt is not None


def infer_attempts(items: Iterable[Recorded]) -> Iterator[Recorded]:
    """Give every event without an attempt one (docs/design.md, "Attempts"); others pass as is.

    Per (run, stage, rank): a step at or below the last one seen starts that rank's next
    attempt. A (run, stage, rank) seen for the first time joins the run's highest attempt
    so far (0 for a new run), so a stage that starts after a resume is not taken for the
    first attempt. ``run_start``/``run_end`` join the run's highest attempt so far. Events
    with an attempt keep it and count as seen.
    """
    last: dict[tuple[str, str, int], tuple[int, int]] = {}  # -> (attempt, last step)
    highest: dict[str, int] = {}
    for item in items:
        if isinstance(item, MalformedLine):
            yield item
            continue
        event = item.event
        run = event["run_id"]
        if event["kind"] in _BOUNDARY_KINDS:
            yield item if item.attempt_given else item.with_attempt(highest.get(run, 0))
            continue
        key, step = (run, event["stage"], event["rank"]), event["step"]
        if item.attempt_given:
            attempt = event["attempt"]
        else:
            seen = last.get(key)
            if seen is None:
                attempt = highest.get(run, 0)
            else:
                attempt = seen[0] + 1 if step <= seen[1] else seen[0]
        last[key] = (attempt, step)
        highest[run] = max(highest.get(run, 0), attempt)
        yield item if item.attempt_given else item.with_attempt(attempt)


def read_acks(path: Path) -> dict[str, CommandAck]:
    """The CommandAcks of a JSON Lines file, by command id (the first of each).

    For :func:`run_backtest`'s ``acks``. Raises ``ValueError`` naming ``file:line`` for a line
    that is not one.
    """
    found: dict[str, CommandAck] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            ack: CommandAck = {
                "command_id": str(record["command_id"]),
                "run_id": str(record["run_id"]),
                "attempt": int(record["attempt"]),
                "status": record["status"],
                "applied_at_step": record.get("applied_at_step"),
                "detail": dict(record.get("detail") or {}),
                "acked_ns": int(record.get("acked_ns") or 0),
            }
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: not a CommandAck: {exc}") from None
        if ack["status"] not in get_args(AckStatus):
            raise ValueError(
                f"{path}:{number}: status {ack['status']!r} is not one of "
                f"{', '.join(get_args(AckStatus))}"
            )
        found.setdefault(ack["command_id"], ack)
    return found


# -- backtest --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rejection:
    """An event the joiner refused (``invalid: ...`` or ``too_late: ...``), and its line."""

    path: Path
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass
class BacktestResult:
    """Everything a backtest produced, in the order it happened."""

    commands: list[ControlCommand] = field(default_factory=list)
    verdicts: list[ActionVerdict] = field(default_factory=list)
    malformed: list[MalformedLine] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    rule_errors: list[str] = field(default_factory=list)  # "summary id: error"
    runs: list[str] = field(default_factory=list)  # in the order of their first event
    events: int = 0  # events handed to the joiner
    duplicates: int = 0  # events dropped as duplicates (producer_id, seq)
    summaries: int = 0  # step summaries released (revisions included)

    def take(self, output: StepOutput) -> None:
        """Record what the pipeline released for one event, tick or ack."""
        for item in output.released:
            self.summaries += 1
            self.commands += item.commands
            if item.error is not None:
                self.rule_errors.append(f"{item.summary['summary_id']}: {item.error}")
        self.commands += output.silences
        self.verdicts += output.verdicts


def assumed_ack(command: ControlCommand) -> CommandAck:
    """The ack a backtest assumes for a command without one: applied at the next step.

    The step after the one it was issued for, as a trainer that polls once a step applies it.
    """
    return {
        "command_id": command["command_id"],
        "run_id": command["run_id"],
        "attempt": command["attempt"],
        "status": "applied",
        "applied_at_step": command["step"] + 1,
        "detail": {"assumed": "by the backtest"},
        "acked_ns": command["issued_ns"],
    }


def run_backtest(
    ruleset: RuleSet,
    items: Iterable[Recorded],
    settings: JoinerSettings | None = None,
    acks: Mapping[str, CommandAck] | None = None,
    until_ns: int | None = None,
) -> BacktestResult:
    """Play recorded events through a fresh step pipeline; see the module docstring.

    ``until_ns``: the recording's end, where silence rules stop watching (None: its last
    event).

    Events without an attempt get one inferred first (:func:`infer_attempts`). Each command
    is acknowledged as soon as it is issued, with its ack in ``acks`` (by command id; a
    command without one is not acknowledged), or, without ``acks``, as :func:`assumed_ack`
    says. A verdict does not depend on when its ack arrives (:mod:`rlpulse.rules.verdicts`),
    so the backtest decides as the worker did.
    """
    joiner_settings = settings if settings is not None else JoinerSettings()
    result = BacktestResult()
    engine = RuleEngine(ruleset)
    pipeline = StepPipeline(PipelineTables(), lambda: engine, joiner_settings)
    runs: dict[str, None] = {}
    now_ns = 0
    for item in infer_attempts(items):
        if isinstance(item, MalformedLine):
            result.malformed.append(item)
            continue
        event = item.event
        result.events += 1
        runs.setdefault(event["run_id"])
        timestamp = event.get("timestamp_ns")
        now_ns = max(now_ns, timestamp) if _is_int(timestamp) else now_ns
        _silences_until(pipeline, result, acks, now_ns)
        result.take(pipeline.expire(now_ns))
        output = pipeline.add(event, now_ns)
        if output.rejected is not None:
            result.rejected.append(Rejection(item.path, item.line, output.rejected))
        result.duplicates += output.duplicate
        result.take(output)
        _acknowledge(pipeline, result, output, acks, now_ns)
    _silences_until(pipeline, result, acks, max(now_ns, until_ns or 0))
    quiet_s = max(joiner_settings.grace_s, joiner_settings.revision_linger_s)
    end_ns = now_ns + round(quiet_s * _SECOND_NS)  # every open group and pending revision is due
    output = pipeline.expire(end_ns, run_keys=())  # silences only up to the recording's end
    result.take(output)
    _acknowledge(pipeline, result, output, acks, end_ns)
    result.runs = list(runs)
    return result


def _silences_until(
    pipeline: StepPipeline,
    result: BacktestResult,
    acks: Mapping[str, CommandAck] | None,
    now_ns: int,
) -> None:
    """Fire each silence rule at the moment it became due, up to ``now_ns``.

    The worker fires at its first tick after that moment: within one tick of the backtest.
    """
    while (due := pipeline.silence_due_ns()) is not None and due <= now_ns:
        output = pipeline.expire(due)
        result.take(output)
        _acknowledge(pipeline, result, output, acks, due)
        if not output.silences:  # not one fired at its due time: nothing more will
            break


def _acknowledge(
    pipeline: StepPipeline,
    result: BacktestResult,
    output: StepOutput,
    acks: Mapping[str, CommandAck] | None,
    now_ns: int,
) -> None:
    """Hand the pipeline the ack of each command ``output`` issued (see :func:`run_backtest`)."""
    for command in output.commands:
        if command["dry_run"]:
            continue
        ack = assumed_ack(command) if acks is None else acks.get(command["command_id"])
        if ack is not None:
            result.take(pipeline.acknowledge(ack, now_ns))


def _shown(fields: Mapping[str, Any]) -> str:
    return json.dumps(fields, separators=(",", ":"))[:_SHOWN_CHARS]
