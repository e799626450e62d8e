"""Names of the rlpulse topics: part of the contract between trainers and workers."""

from __future__ import annotations

from dataclasses import dataclass

from rlpulse.settings import DEFAULT_PREFIX

__all__ = ["DEFAULT_PREFIX", "REASON_HEADER", "RULES_KEY", "SOURCE_HEADER", "Topics"]


@dataclass(frozen=True)
class Topics:
    """The topics of one rlpulse deployment, all named ``<prefix>.<role>``."""

    prefix: str = DEFAULT_PREFIX

    @property
    def events(self) -> str:
        """TrainerEvent, keyed by run id."""
        return f"{self.prefix}.events"

    @property
    def steps(self) -> str:
        """StepSummary, keyed by run id (the metric topic)."""
        return f"{self.prefix}.steps"

    @property
    def control(self) -> str:
        """ControlCommand, keyed by run id."""
        return f"{self.prefix}.control"

    @property
    def acks(self) -> str:
        """CommandAck, keyed by run id."""
        return f"{self.prefix}.acks"

    @property
    def verdicts(self) -> str:
        """ActionVerdict, keyed by run id: whether a rule's applied command did what it expected."""
        return f"{self.prefix}.verdicts"

    @property
    def logs(self) -> str:
        """LogRecord (the trainers' text log records), keyed by run id; never read by the worker."""
        return f"{self.prefix}.logs"

    @property
    def samples(self) -> str:
        """SampleBatch (every rollout sample's numbers, no text), keyed by run id."""
        return f"{self.prefix}.samples"

    @property
    def sample_texts(self) -> str:
        """SampleTextBatch (the texts of a few chosen samples a step), keyed by run id.

        A topic of its own so that an access list can keep texts from a role that may read
        every number.
        """
        return f"{self.prefix}.sample-texts"

    @property
    def audits(self) -> str:
        """AuditReport, one per run the archiver audited, keyed by run id."""
        return f"{self.prefix}.audits"

    @property
    def rules(self) -> str:
        """Validated rule files (compacted), keyed by rule set name."""
        return f"{self.prefix}.rules"

    @property
    def dlq(self) -> str:
        """Input that could not be used: original bytes plus a reason header."""
        return f"{self.prefix}.dlq"

    @property
    def ticks(self) -> str:
        """Worker-internal clock ticks, one per partition, that drive the grace timer."""
        return f"{self.prefix}.ticks"

    def keyed_by_run(self) -> tuple[str, ...]:
        """The topics whose partitions must line up (same count, same key -> same partition)."""
        return (self.events, self.steps, self.control, self.acks, self.ticks, self.verdicts)

    def all(self) -> tuple[str, ...]:
        """Every topic, in creation order."""
        return (
            *self.keyed_by_run(), self.rules, self.dlq, self.logs, self.audits, self.samples,
            self.sample_texts,
        )  # fmt: skip

    def stamped_by_broker(self) -> tuple[str, ...]:
        """Topics whose record timestamps the broker sets (``LogAppendTime``).

        The trainers' events, log records and samples: the audit compares each host's clock
        with the broker's through them.
        """
        return (self.events, self.logs, self.samples, self.sample_texts)


RULES_KEY = b"rules"
"""Key of the one rule set of a deployment on its compacted rules topic."""

REASON_HEADER = "rlpulse-reason"
"""Header of a dead letter: why it was refused, starting with its kind (``invalid: ...``)."""

SOURCE_HEADER = "rlpulse-source"
"""Header of a dead letter (where it was read: ``topic/partition/offset``) and of a published
rules file (the path it was published from)."""
