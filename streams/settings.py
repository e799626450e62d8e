"""Settings of one rlpulse worker."""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

from rlpulse.schemas.topics import DEFAULT_PREFIX, Topics


def _default_bootstrap() -> str:
    return os.environ.get("RLPULSE_BOOTSTRAP", "127.0.0.1:9092")


class WorkerSettings(BaseModel):
    """What a worker connects to and how it joins and judges steps."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = Field(default_factory=_default_bootstrap)
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
    recent_commands: int = Field(
        default=8, ge=0, description="Commands per run re-sent after a takeover."
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
