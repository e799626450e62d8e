"""Typed views of the wire records.

Decoded records are plain dicts (what fastavro reads and writes, and the cheapest
shape to move through the pipeline); these ``TypedDict``s give them names and
field types for the type checker. The ``.avsc`` files under ``schemas/avro`` stay
the source of truth.
"""

from __future__ import annotations

from typing import Final, Literal, NotRequired, TypedDict

EventKind = Literal["metrics", "log", "run_start", "run_end"]
ClosedBy = Literal["complete", "grace", "run_end"]

SYSTEM_STAGE: Final = "system"
"""The stage of the system sampler's events (:mod:`rlpulse.producers.caller.system`)."""
READING_STAGES: Final = frozenset({SYSTEM_STAGE})
"""Stages whose ``step`` numbers readings (the system sampler's), not training steps: a hung
run still sends them, and their ranks take them at their own pace."""
CommandOrigin = Literal["rule", "operator"]
AckStatus = Literal["applied", "noop", "rejected", "failed"]
VerdictKind = Literal["effective", "ineffective", "unknown"]
ParamValue = bool | int | float | str | None
SampleSplit = Literal["train", "validation"]
"""Whether rollout samples were generated for training or for validation."""


class TrainerEvent(TypedDict):
    """One rank's report for one training step and stage."""

    kind: EventKind
    run_id: str
    attempt: int
    step: int
    stage: str
    rank: int
    world_size: int
    metrics: dict[str, float]
    level: str | None
    message: str | None
    tags: dict[str, str]
    timestamp_ns: int
    hostname: str
    pid: int
    producer_id: str
    seq: int
    policy_version: int | None
    trace_id: str | None


class MetricStats(TypedDict):
    """One metric reduced across the ranks that reported it."""

    count: int
    sum: float
    mean: float
    std: float
    min: float
    max: float
    min_rank: int
    max_rank: int
    non_finite: int


class StepSummary(TypedDict):
    """All ranks of one (run, attempt, stage, step), joined."""

    summary_id: str
    run_id: str
    attempt: int
    stage: str
    step: int
    revision: int
    world_size: int
    ranks_reported: list[int]
    missing_ranks: list[int]
    metrics: dict[str, MetricStats]
    tags: dict[str, str]
    last_rank: int | None
    last_rank_lag_ns: int
    stragglers: NotRequired[list[int]]  # v2; the codec fills it in when reading v1 data
    closed_by: ClosedBy
    first_event_ns: int
    last_event_ns: int
    emitted_ns: int


class Action(TypedDict):
    """One step of a command: ``stop``, ``checkpoint``, ``scale_rollout_batch``, ..."""

    type: str
    params: dict[str, ParamValue]


class ControlCommand(TypedDict):
    """An instruction to one run attempt, from a rule or an operator."""

    command_id: str
    run_id: str
    attempt: int
    stage: str
    step: int
    origin: CommandOrigin
    rule_id: str | None
    rule_version: str | None
    dry_run: bool
    actions: list[Action]
    reason: str
    evidence: dict[str, float]
    issued_ns: int
    signature: NotRequired[bytes | None]  # v2; None when unsigned (rlpulse.schemas.signing)


class CommandAck(TypedDict):
    """The trainer's answer to a command."""

    command_id: str
    run_id: str
    attempt: int
    status: AckStatus
    applied_at_step: int | None
    detail: dict[str, str]
    acked_ns: int


class ActionVerdict(TypedDict):
    """Whether a rule's applied command achieved what the rule expected (``expect``)."""

    verdict_id: str
    command_id: str
    run_id: str
    attempt: int
    stage: str
    rule_id: str
    rule_version: str
    verdict: VerdictKind
    expectation: str
    issued_step: int
    applied_at_step: int | None
    decided_at_step: int | None
    value: float | None
    evidence: dict[str, float]
    reason: str
    emitted_ns: int


class _LogSource(TypedDict):
    """The fields the log records of one trainer process share (once in a :class:`LogBatch`)."""

    run_id: str
    attempt: int
    rank: int
    tags: dict[str, str]
    hostname: str
    host_ip: str
    pid: int
    producer_id: str


class LogEntry(TypedDict):
    """The fields of one log record that a :class:`LogBatch` does not share."""

    seq: int
    timestamp_ns: int
    step: int
    stage: str
    level: str
    levelno: int
    logger: str
    message: str
    exception: str | None
    trace_id: str | None
    fields: dict[str, str]
    sample_rate: float
    sampled_out: dict[str, int]


class LogRecord(_LogSource, LogEntry):
    """One text log record of one trainer process (``<prefix>.logs``): its entry and source."""


class LogBatch(_LogSource):
    """Consecutive log records of one trainer process (``<prefix>.logs``), shared fields once."""

    entries: list[LogEntry]


class _SampleSource(TypedDict):
    """The fields the rollout samples of one trainer process share (once in a batch)."""

    run_id: str
    attempt: int
    rank: int
    tags: dict[str, str]
    hostname: str
    pid: int
    producer_id: str


class SampleChunk(TypedDict):
    """Consecutive samples of one step of one rank as columns (an entry of a SampleBatch)."""

    seq: int
    timestamp_ns: int
    step: int
    split: str
    first_index: int
    reward: list[float]
    prompt_length: list[int]
    response_length: list[int]
    truncated: list[bool]
    empty: list[bool]
    repetition: list[float]
    aborted: list[bool]
    num_turns: list[int]
    advantage: list[float]
    groups: list[str]
    group: list[int]
    data_sources: list[str]
    data_source: list[int]
    scores: dict[str, list[float]]
    dropped_scores: list[str]


class SampleBatch(_SampleSource):
    """Chunks of rollout samples of one trainer process (``<prefix>.samples``)."""

    entries: list[SampleChunk]


class RolloutSample(TypedDict):
    """One rollout sample's numbers, as readers see it (a row of the archive's ``samples``).

    Not a wire record of its own: :meth:`Codec.decode_samples
    <rlpulse.schemas.codec.Codec.decode_samples>` makes one per sample of a SampleBatch's chunks.
    """

    run_id: str
    attempt: int
    rank: int
    tags: dict[str, str]
    hostname: str
    pid: int
    producer_id: str
    seq: int
    timestamp_ns: int
    step: int
    split: str
    sample_index: int
    group: str | None
    data_source: str | None
    reward: float
    scores: dict[str, float]
    dropped_scores: list[str]
    advantage: float | None
    prompt_length: int
    response_length: int
    truncated: bool
    aborted: bool
    num_turns: int
    repetition: float
    empty: bool


class SampleTextEntry(TypedDict):
    """The texts of one chosen sample, without the fields a :class:`SampleTextBatch` shares."""

    seq: int
    timestamp_ns: int
    step: int
    split: str
    sample_index: int
    group: str | None
    data_source: str | None
    reward: float
    chosen: list[str]
    prompt: str | None
    prompt_chars: int
    response_head: str
    response_tail: str
    response_chars: int
    response_digest: str
    ground_truth: str | None


class SampleText(_SampleSource, SampleTextEntry):
    """The texts of one chosen rollout sample (``<prefix>.sample-texts``)."""


class SampleTextBatch(_SampleSource):
    """The texts of chosen samples of one trainer process (``<prefix>.sample-texts``)."""

    entries: list[SampleTextEntry]


READER_VIEWS: Final = frozenset({"RolloutSample", "SampleText"})
"""TypedDicts of what readers make of a batch's entries (one record a sample), not wire records:
:meth:`Codec.decode_samples <rlpulse.schemas.codec.Codec.decode_samples>` and
:meth:`~rlpulse.schemas.codec.Codec.decode_sample_texts` return them."""


class SequenceGap(TypedDict):
    """Sequence numbers of one producer that the archive does not hold."""

    producer_id: str
    hostname: str
    rank: int
    first_seq: int
    last_seq: int


class HostClock(TypedDict):
    """How far one host's clock seems to lag the broker's."""

    hostname: str
    offset_ms: float
    records: int


class AuditReport(TypedDict):
    """The integrity audit of one run, as found in the archive."""

    run_id: str
    audited_ns: int
    ok: bool
    producers: int
    received: int
    lost: int
    duplicates: int
    gaps: list[SequenceGap]
    steps_with_missing_ranks: int
    dead_letters: int
    clocks: list[HostClock]
    summary: str
