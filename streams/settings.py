"""Settings of one rlpulse worker."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from rlpulse.producers.config import bootstrap_from_env
from rlpulse.schemas.topics import DEFAULT_PREFIX, Topics
from rlpulse.streams.joiner import JoinerConfig


class WorkerSettings(BaseModel):
    """What a worker connects to, how it joins and judges steps, and what input it refuses."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = Field(default_factory=bootstrap_from_env)
    topic_prefix: str = DEFAULT_PREFIX
    app_id: str | None = Field(
        default=None, description="Consumer group and table namespace; <prefix>-worker if unset."
    )
    partitions: int = Field(default=6, ge=1, description="Partitions of the run-keyed topics.")
    grace_s: float = Field(default=30.0, gt=0, description="Wall-clock wait for missing ranks.")
    late_window_s: float = Field(
        default=600.0, ge=0, description="How long closed steps accept revisions."
    )
    tick_interval_s: float = Field(default=1.0, gt=0, description="How often the grace timer runs.")
    caught_up_lag: int = Field(
        default=500,
        ge=0,
        description="Unread events of a partition above which its grace timer waits.",
    )
    stall_ticks: int = Field(
        default=3,
        ge=1,
        description="Ticks without delivery on a partition with unread events before re-seeking.",
    )
    batch_max: int = Field(default=2000, ge=1, description="Most messages an agent takes at once.")
    batch_linger_s: float = Field(
        default=0.01, ge=0, description="How long an agent lets an empty buffer fill up."
    )
    straggler_window: int = Field(
        default=10, ge=1, description="Complete steps of a stage that straggler tracking looks at."
    )
    straggler_min: int = Field(
        default=5, ge=1, description="Times a rank must be last in that window to be a straggler."
    )
    max_event_bytes: int = Field(
        default=256 * 1024, ge=64, description="Larger event messages go to the DLQ undecoded."
    )
    max_world_size: int = Field(default=65_536, ge=1, description="Largest world_size accepted.")
    max_metrics: int = Field(default=1_024, ge=1, description="Most metrics in one event.")
    max_tags: int = Field(default=64, ge=1, description="Most tags in one event.")
    max_name_chars: int = Field(
        default=256, ge=1, description="Longest run id, stage, producer id, metric name or tag."
    )
    max_reason_bytes: int = Field(
        default=1024, ge=16, description="DLQ reason headers are cut to this length."
    )
    metrics_port: int | None = Field(default=None, description="Serve Prometheus /metrics here.")
    web_port: int = Field(default=0, description="faust's web server port; 0 disables it.")
    data_dir: str | None = Field(default=None, description="faust's data directory.")

    @property
    def topics(self) -> Topics:
        """The topic names for this prefix."""
        return Topics(self.topic_prefix)

    @property
    def group_id(self) -> str:
        """The Kafka consumer group (and faust app id) of the workers of this deployment."""
        return self.app_id or f"{self.topic_prefix}-worker"

    def joiner_config(self) -> JoinerConfig:
        """The step joiner's part of these settings."""
        return JoinerConfig(
            grace_s=self.grace_s,
            late_window_s=self.late_window_s,
            straggler_window=self.straggler_window,
            straggler_min=self.straggler_min,
            max_world_size=self.max_world_size,
            max_metrics=self.max_metrics,
            max_tags=self.max_tags,
            max_name_chars=self.max_name_chars,
        )
