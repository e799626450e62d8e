"""Every setting of rlpulse, each declared once, in one tree.

:class:`Settings` is the root; each component reads its own part of it (``producer``,
``worker``, ``limits``, ...) and the connection settings every Kafka client shares
(``bootstrap``, ``prefix``, ``librdkafka``). A value comes from the first of these that has
it:

1. what the caller passes (command-line flags, or keyword arguments in code),
2. the environment: ``RLPULSE_<FIELD>`` for top-level fields (``RLPULSE_BOOTSTRAP``),
   ``RLPULSE_<SECTION>__<FIELD>`` below them (``RLPULSE_WORKER__GRACE_S=10``),
3. the YAML config file named by ``--config`` or ``RLPULSE_CONFIG``,
4. the defaults written here.

:func:`load_settings` builds the tree from all four and raises :class:`SettingsError` (one
line per problem, naming where the bad value came from); :func:`explain` says, for every
field, which source its value came from (``rlpulse config show``). This module imports
only pydantic, so the trainer side, the worker and the command line all read it cheaply.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from rlpulse.exceptions import SettingsError

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_BOOTSTRAP",
    "DEFAULT_PREFIX",
    "ENV_PREFIX",
    "MAVEN_CENTRAL",
    "OUTSIDE_ENV",
    "AgentSettings",
    "ArchiveSettings",
    "BrokerSettings",
    "CommandLimits",
    "EventLimits",
    "ExporterSettings",
    "IndexSettings",
    "JarSettings",
    "JoinerSettings",
    "LoggingSettings",
    "ProducerSettings",
    "SamplesSettings",
    "SearchSettings",
    "SecuritySettings",
    "Settings",
    "UiSettings",
    "WorkerSettings",
    "environment_names",
    "explain",
    "load_settings",
]

ENV_PREFIX = "RLPULSE_"
MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2"
CONFIG_ENV = "RLPULSE_CONFIG"
OUTSIDE_ENV = frozenset(
    {
        CONFIG_ENV,
        "RLPULSE_TRACE_CONTEXT",  # rlpulse.producers.caller.trace
        "RLPULSE_LOG_DIR",  # compose/fluent-bit/fluent-bit.conf
        "RLPULSE_FUZZ_SEED",  # tests/integration/test_dead_letters.py
    }
)
"""``RLPULSE_*`` variables read outside the settings tree; every other one must name a setting."""
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_PREFIX = "rlpulse"
MIB = 1 << 20
_TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")

Compression = Literal["lz4", "zstd", "snappy", "gzip", "none"]
ClientValue = str | int | float | bool
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
_LEVEL_ALIASES = {"WARN": "WARNING", "FATAL": "CRITICAL"}
_DURATION = re.compile(r"^\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[smhdw]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: object) -> object:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"45s"``, ``"2w"`` or a number of seconds -> seconds."""
    if isinstance(value, str):
        found = _DURATION.match(value.lower())
        if found is None:
            raise ValueError(
                f"{value!r} is not a duration: a number with s, m, h, d or w (7d, 12h, 90s)"
            )
        return float(found["number"]) * _UNIT_SECONDS[found["unit"]]
    return value


def _normal_level(value: object) -> object:
    if isinstance(value, str):
        upper = value.strip().upper()
        return _LEVEL_ALIASES.get(upper, upper)
    return value


Seconds = Annotated[float, BeforeValidator(parse_duration)]
"""A duration in seconds, also written ``7d``, ``12h``, ``30m``, ``45s`` or ``2w``."""
Level = Annotated[LogLevel, BeforeValidator(_normal_level)]
"""A logging level name, any case; ``WARN`` means ``WARNING`` and ``FATAL`` ``CRITICAL``."""
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"]
SECRET_MASK = "********"
MIN_SIGNING_KEY_BYTES = 32
_SENSITIVE_CLIENT_KEY = re.compile(r"password|secret", re.IGNORECASE)


class _Section(BaseModel):
    """A part of the settings tree: frozen, and unknown keys are errors (typos show)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class EventLimits(_Section):
    """How large one TrainerEvent may be.

    The trainer refuses larger events at ``log()`` and the worker dead-letters them, with the
    same reasons (:mod:`rlpulse.schemas.validation`): each would make every summary of its
    run huge.
    """

    max_world_size: int = Field(default=65_536, ge=1, description="Largest world_size accepted.")
    max_metrics: int = Field(default=1_024, ge=1, description="Most metrics in one event.")
    max_tags: int = Field(default=64, ge=1, description="Most tags in one event.")
    max_name_chars: int = Field(
        default=256, ge=1, description="Longest run id, stage, producer id, metric name or tag."
    )
    max_event_bytes: int = Field(
        default=256 * 1024, ge=64, description="Largest encoded event, in bytes."
    )


class ProducerSettings(_Section):
    """The trainer side: its write-ahead log, the host agent's producers, the control client."""

    linger_ms: int = Field(default=5, ge=0, description="librdkafka's batching delay.")
    batch_linger_ms: int = Field(
        default=250,
        ge=1,
        description=(
            "How long the host's agent gathers a log's records into one batch (events go at "
            "once, with the records gathered so far)."
        ),
    )
    compression: Compression = Field(default="lz4", description="Compression of event batches.")
    control_lookback_s: float = Field(
        default=3600, gt=0, description="How far back the control client reads at start."
    )
    scale_max_age_steps: int | None = Field(
        default=10,
        ge=0,
        description=(
            "A rule's scale_rollout_batch polled this many steps after the step it was issued "
            "for is acked rejected (expired), not applied; unset: never. Stops never expire."
        ),
    )
    delivery_timeout_s: float = Field(
        default=60,
        gt=0,
        description=(
            "How long a record may wait for the broker before its delivery counts as failed "
            "(it is sent again from the write-ahead log when the broker answers)."
        ),
    )
    close_timeout_s: float = Field(
        default=10,
        ge=0,
        description="How long close() waits for delivery; the rest stays in the write-ahead log.",
    )
    spool_dir: Path | None = Field(
        default=None,
        description=(
            "Root of the write-ahead logs (per run, host and producer); unset: <home>/spool, "
            "or /var/tmp/rlpulse-<user>/spool when <home> is on a shared filesystem."
        ),
    )
    hostname: str | None = Field(
        default=None,
        description="The host name events and log records carry; unset: the machine's.",
    )
    spool_file_bytes: int = Field(
        default=8 * MIB,
        ge=4096,
        description="Size of a write-ahead log segment (reserved on disk when it is made).",
    )
    spool_max_bytes: int = Field(
        default=1024 * MIB,
        ge=4096,
        description=(
            "Disk one producer's write-ahead log may use; records that would pass it while "
            "Kafka takes nothing are dropped (the newest; counted, warned once)."
        ),
    )
    strict: bool = Field(
        default=False,
        description=(
            "log() raises for a value of the wrong type or range (InvalidFieldError, "
            "InvalidValueError) instead of counting it in EventLogger.refused and warning."
        ),
    )
    system_metrics_interval_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Every this many seconds each RunLink logs its process's CPU seconds, RSS and (with "
            "pynvml) GPU use as stage 'system'; unset: off."
        ),
    )


class AgentSettings(_Section):
    """The host's agent: one process per host, user and cluster that sends every rank's log."""

    start: Literal["auto", "never"] = Field(
        default="auto",
        description=(
            "auto: a logger that finds no live agent for its host starts one, detached; "
            "never: the agent runs by hand, under systemd or as a DaemonSet."
        ),
    )
    idle_exit_s: Seconds = Field(
        default=600.0,
        ge=0,
        description=(
            "The agent exits after this long with no live writer and nothing unsent "
            "(it keeps trying while Kafka is out of reach); 0: never (systemd, a DaemonSet)."
        ),
    )
    stop_timeout_s: Seconds = Field(
        default=20.0,
        ge=0,
        description="On SIGTERM the agent sends for at most this long, then exits.",
    )
    check_interval_s: float = Field(
        default=2.0,
        gt=0,
        description=(
            "How often a rank checks that its agent is alive (and starts one), and the agent "
            "checks which writers are gone."
        ),
    )
    look_interval_s: float = Field(
        default=0.5,
        gt=0,
        description="A sleeping agent looks at every log this often (wakes make up the rest).",
    )
    rescan_s: float = Field(
        default=5.0,
        gt=0,
        description="How often the agent lists the spool for logs no writer told it of.",
    )
    start_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="How long a rank waits for an agent it started to say it runs.",
    )
    stacks_signal: str = Field(
        default="SIGRTMIN+3",
        description=(
            "The signal on which each rank process dumps its threads' stacks for the agent "
            "(capture_stacks) when its own thread cannot: SIGRTMIN+n, a name or a number; "
            "'off': no stacks from outside (ranks register nothing, agents read no control "
            "topic). A signal that already has a handler is left alone."
        ),
    )


class JoinerSettings(_Section):
    """How the step joiner closes steps and spots stragglers.

    A rank is a straggler of a step when it arrived last in at least ``straggler_min`` of
    the last ``straggler_window`` complete steps of that stage.
    """

    grace_s: float = Field(
        default=30.0, gt=0, description="Seconds a step waits for missing ranks (wall clock)."
    )
    late_window_s: float = Field(
        default=600.0, ge=0, description="How long closed steps take late ranks (revisions)."
    )
    revision_linger_s: float = Field(
        default=2.0,
        gt=0,
        description="Wait from a closed step's first late event to its revision (one for all).",
    )
    straggler_window: int = Field(
        default=10, ge=1, description="Complete steps of a stage that straggler tracking sees."
    )
    straggler_min: int = Field(
        default=5, ge=1, description="Times a rank must be last in that window to be a straggler."
    )

    @model_validator(mode="after")
    def _straggler_min_fits(self) -> JoinerSettings:
        if self.straggler_min > self.straggler_window:
            raise ValueError(
                f"straggler_min ({self.straggler_min}) must not exceed straggler_window "
                f"({self.straggler_window})"
            )
        return self


class WorkerSettings(JoinerSettings):
    """One stream worker: its joiner settings, its faust app and how it watches itself."""

    rules: str = Field(
        default="topic",
        description=(
            "'topic': the rules published with `rlpulse rules publish` (seed until then); a "
            "rules file (reloaded on change and SIGHUP); or a preset name."
        ),
    )
    partitions: int = Field(default=6, ge=1, description="Partitions of the run-keyed topics.")
    app_id: str | None = Field(
        default=None, description="Consumer group and table namespace; unset: <prefix>-worker."
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
    state_max_bytes: int = Field(
        default=16 * MIB,
        ge=MIB,
        description=(
            "Largest state record the worker writes (a stage's unreleased steps, every rank's "
            "metrics: ~36 bytes a rank and metric); its changelogs' max.message.bytes."
        ),
    )
    batch_max: int = Field(default=2000, ge=1, description="Most messages an agent takes at once.")
    buffer_max: int = Field(
        default=4096,
        ge=16,
        description="Messages faust buffers for the agent (stream_buffer_maxsize).",
    )
    commit_every: int = Field(
        default=10_000,
        ge=1,
        description="Also commit offsets after this many messages (besides the interval).",
    )
    commit_interval_s: float = Field(
        default=2.8, gt=0, description="How often offsets of processed messages are committed."
    )
    publish_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="A summary, command or state write not delivered this long ends the worker.",
    )
    stop_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A stop (SIGTERM, SIGINT) not finished this long ends the process at once.",
    )
    stall_after_s: float = Field(
        default=300.0,
        gt=0,
        description="An input partition with unprocessed events this long is logged as stalled.",
    )
    pause_on_busy_buffer: bool = Field(
        default=True,
        description="faust's own flow control: stop fetching a partition at 80 % of the buffer.",
    )
    fetch_max_wait_s: float = Field(
        default=0.05,
        gt=0,
        le=10,
        description="How long the broker may hold a fetch that found nothing new (faust: 1.5).",
    )
    batch_window_s: float = Field(
        default=0.2,
        gt=0,
        description="Longest an agent keeps a batch open while events keep coming.",
    )
    gc_threshold: int = Field(
        default=20_000,
        ge=1,
        description="Allocations between young garbage collections (Python's default: 700).",
    )
    batch_linger_s: float = Field(
        default=0.01, ge=0, description="How long an agent lets an empty buffer fill up."
    )
    max_reason_bytes: int = Field(
        default=1024, ge=16, description="Dead-letter reason headers are cut to this length."
    )
    rules_max_bytes: int = Field(
        default=256 * 1024, ge=1024, description="Largest rules text a worker accepts, in bytes."
    )
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="Serve Prometheus /metrics on this port."
    )
    metrics_host: str = Field(default="0.0.0.0", description="Address /metrics listens on.")
    web_port: int = Field(default=0, ge=0, description="faust's web server port; 0 disables it.")
    data_dir: Path | None = Field(
        default=None, description="faust's data directory; unset: <home>/worker-data/<app id>."
    )
    startup_timeout_s: float = Field(
        default=120.0, gt=0, description="How long start-up waits for the broker and its topics."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="warning",
        description="Log level of the worker and of faust: debug, info, warning or error.",
    )


_METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ExporterSettings(_Section):
    """The Prometheus exporter: what it serves, how much of it, and whom it tells.

    It reads ``<prefix>.events``, ``.steps``, ``.control``, ``.acks`` and ``.dlq`` from
    ``lookback_s`` before its start (no history replay) and keeps the latest value per series
    in memory.
    """

    port: int = Field(default=9091, ge=0, le=65535, description="Port of /metrics.")
    host: str = Field(default="0.0.0.0", description="Address /metrics listens on.")
    namespace: str = Field(
        default="rlpulse",
        description=(
            "Prefix of the per-rank gauges, named <namespace>_<metric>, labelled run, stage, rank."
        ),
    )
    group_id: str | None = Field(
        default=None, description="The exporter's consumer group; unset: <prefix>-exporter."
    )
    allow_metrics: list[str] = Field(
        default_factory=list,
        description="Metric names (globs) that get per-rank series; empty: every metric.",
    )
    max_series: int = Field(
        default=50_000, ge=1, description="Most series of runs held; new ones beyond are dropped."
    )
    lookback_s: float = Field(
        default=900.0, ge=0, description="How far back the exporter reads its topics at start."
    )
    expire_ended_s: float = Field(
        default=600.0, ge=0, description="A run's series go this long after its run_end."
    )
    expire_silent_s: float = Field(
        default=3600.0, gt=0, description="A run's series go this long after its last record."
    )
    zscore_window: int = Field(
        default=20, ge=3, description="Steps in the window of rlpulse_step_zscore."
    )
    lag_interval_s: float = Field(
        default=5.0, gt=0, description="How often consumer lag is measured."
    )
    alertmanager_url: str | None = Field(
        default=None, description="Alertmanager to forward rule commands to; unset: off."
    )
    notify_actions: list[str] | None = Field(
        default=None,
        description="Commands with one of these actions go to Alertmanager; unset: those the "
        "action contract notifies by default (stop, checkpoint, alert). The exporter refuses "
        "a name that is no action.",
    )
    alert_ttl_s: float = Field(
        default=3600.0, gt=0, description="A forwarded command's alert resolves after this long."
    )
    startup_timeout_s: float = Field(
        default=120.0, gt=0, description="How long start-up waits for the broker and its topics."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="warning", description="Log level of the exporter: debug, info, warning or error."
    )

    @field_validator("namespace")
    @classmethod
    def _valid_namespace(cls, value: str) -> str:
        if not _METRIC_NAME.match(value):
            raise ValueError(
                f"namespace {value!r} must be a Prometheus metric name prefix: a letter or '_', "
                "then letters, digits or '_'"
            )
        return value

    @field_validator("alertmanager_url", mode="before")
    @classmethod
    def _blank_url_is_unset(cls, value: object) -> object:
        if isinstance(value, str):
            return value.strip().rstrip("/") or None
        return value


class BrokerSettings(_Section):
    """The local Kafka broker that ``rlpulse broker up`` runs (on 127.0.0.1 unless ``host``).

    A broker other nodes reach (a login node, a Slurm job) listens on ``host`` and tells
    clients ``advertised_host``; beyond loopback it must run with ``--secure``.
    """

    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        description=(
            "Address the client listener binds (0.0.0.0: every interface); beyond loopback "
            "`broker up` needs --secure."
        ),
    )
    advertised_host: str | None = Field(
        default=None,
        description=(
            "Address clients are told to connect to; unset: host, or this machine's name "
            "when host is 0.0.0.0."
        ),
    )
    data_dir: Path | None = Field(
        default=None,
        description=(
            "The broker's log segments; unset: <state dir>/data, or a directory under "
            "/var/tmp/rlpulse-<user> when the state dir is on a shared filesystem."
        ),
    )

    port: int = Field(
        default=9092,
        ge=0,
        le=65534,
        description="Client port; 0 picks a free one (the controller's always is).",
    )
    heap: str = Field(default="1g", pattern=r"^\d+[kmg]$", description="The JVM's -Xmx.")
    jvm_options: list[str] = Field(
        default_factory=list,
        description="More options for the broker's JVM (the test suite: -XX:TieredStopAtLevel=1).",
    )


class JarSettings(_Section):
    """Where the local broker's pinned jars come from (``rlpulse broker fetch``).

    Each jar is checked against the SHA-256 pinned in the package, whatever its source.
    Downloads honour ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` and ``SSL_CERT_FILE``.
    """

    mirror: str = Field(
        default=MAVEN_CENTRAL,
        pattern=r"^(https?|file)://",
        description=(
            "The Maven repository the jars are fetched from (https://, http:// or file://): "
            "Maven Central, or an Artifactory/Nexus mirror of it."
        ),
    )
    offline_dir: Path | None = Field(
        default=None,
        description=(
            "A directory holding the jars (`rlpulse broker fetch --to DIR`, flat or in "
            "Maven's layout); set, nothing is downloaded."
        ),
    )
    ca_file: Path | None = Field(
        default=None,
        description="CA certificates (PEM) that verify the mirror; unset: the system's.",
    )
    timeout_s: Seconds = Field(
        default=60.0, gt=0, description="A connection or read that stalls this long fails."
    )


class LoggingSettings(_Section):
    """Text log records on the trainer side, and its local per-rank files.

    Records at ``level`` and above go to ``<prefix>.logs``; DEBUG and INFO records are
    sampled at ``sampling`` (see :class:`~rlpulse.producers.caller.sampling.SamplingFilter`). With
    ``log_dir`` set, every rank also writes its events and records to
    ``<log_dir>/<component>_rank<N>.jsonl``, rotated at ``rotation`` bytes, rotated files
    deleted ``retention`` after they were rotated.
    """

    enabled: bool = Field(default=True, description="Publish log records at all.")
    level: Level = Field(default="INFO", description="Lowest level published (WARN = WARNING).")
    format: Literal["json"] = Field(default="json", description="Format of the local files.")
    log_dir: Path | None = Field(default=None, description="Directory of the per-rank files.")
    component: str = Field(
        default="trainer",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="First part of the per-rank file names: <component>_rank<N>.jsonl.",
    )
    rotation: ByteSize = Field(
        default=ByteSize(10**9), ge=1024, description="A local file is rotated at this size."
    )
    retention: Seconds = Field(
        default=7 * 86400.0, gt=0, description="Rotated local files are deleted after this."
    )
    sampling: float = Field(
        default=1.0, gt=0, le=1, description="Share of DEBUG and INFO records kept."
    )
    queue_max: int = Field(
        default=100_000,
        ge=1,
        description="Lines waiting for the local file writer; beyond it lines are dropped.",
    )
    batch_max_bytes: ByteSize = Field(
        default=ByteSize(512 * 1024),
        ge=1024,
        le=ByteSize(900 * 1024),
        description="Largest LogBatch message (encoded records; below Kafka's 1 MB message cap).",
    )


class SamplesSettings(_Section):
    """Rollout samples on the trainer side: every sample's numbers, a few chosen texts.

    Each step's samples (``RunLink.log_samples``, verl's and TRL's integrations) go to
    ``<prefix>.samples`` as numbers (reward, scores, lengths, truncated, repetition; no
    text), and the texts of ``texts`` chosen samples to ``<prefix>.sample-texts`` every
    ``texts_every_steps`` steps: the best, the worst, the truncated or longest, the repetitive
    or random, one per data source and one whole group. A response is sent as its head and
    tail within ``max_text_chars``, with its full length and a digest.
    """

    enabled: bool = Field(default=True, description="Capture rollout samples at all.")
    texts: bool = Field(
        default=True,
        description="Send the chosen samples' texts (off: numbers only; no text leaves the node).",
    )
    text_count: int = Field(
        default=16,
        ge=0,
        le=1024,
        description=(
            "Texts chosen a step: a quarter each best, worst, truncated or longest, repetitive "
            "or random; one per data source and one whole group come on top."
        ),
    )
    group_texts: int = Field(
        default=8, ge=0, le=1024, description="At most this many samples of the whole group."
    )
    texts_every_steps: int = Field(
        default=1, ge=1, description="Texts are sent for every n-th step (numbers every step)."
    )
    max_text_chars: int = Field(
        default=4000,
        ge=64,
        le=65_536,
        description="A response is sent as its head and tail, this many characters in all.",
    )
    max_prompt_chars: int = Field(
        default=4000,
        ge=64,
        le=65_536,
        description="A prompt (and a ground truth) is cut to its head and tail, this many in all.",
    )
    redact: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description=(
            "module:function applied to every text before it leaves the process "
            "(str -> str); RunLink(redact=...) takes a callable."
        ),
    )
    repetition_threshold: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="A sample is repetitive when its tail's repetition score is at least this.",
    )


class ArchiveSettings(_Section):
    """The archiver: every topic to Parquet, rolled, retained, audited.

    An ``s3://bucket/prefix`` root is read and written with pyarrow's S3 client: AWS S3 by
    default, or any S3-compatible server at ``s3_endpoint`` (MinIO, S3Proxy, GCS's XML API).
    Credentials are ``s3_access_key_id`` with its secret from
    ``RLPULSE_ARCHIVE__S3_SECRET_ACCESS_KEY`` or ``s3_secret_access_key_file``; unset, the AWS
    default chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``~/.aws``, an instance
    role) as for any AWS client.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    root: str | None = Field(
        default=None,
        description="A directory or a pyarrow filesystem URI (s3://...); unset: <home>/archive.",
    )
    s3_endpoint: str | None = Field(
        default=None,
        description="The S3-compatible server of s3:// roots, as a URL (http://127.0.0.1:9000, "
        "https://storage.googleapis.com); unset: AWS S3.",
    )
    s3_region: str | None = Field(
        default=None,
        description="The bucket's region; unset: asked of AWS (no s3_endpoint), else us-east-1.",
    )
    s3_access_key_id: str | None = Field(
        default=None,
        description="Access key id for s3:// roots; unset: the AWS default credential chain.",
    )
    s3_secret_access_key: SecretStr | None = Field(
        default=None,
        description="Its secret: only from RLPULSE_ARCHIVE__S3_SECRET_ACCESS_KEY.",
    )
    s3_secret_access_key_file: Path | None = Field(
        default=None, description="A file holding the secret access key (one line)."
    )
    group_id: str | None = Field(
        default=None, description="The archivers' consumer group; unset: <prefix>-archive."
    )
    instance_id: str | None = Field(
        default=None,
        description="Static group membership: a restarted archiver with the same id gets its "
        "partitions back at once, without waiting out the session timeout.",
    )
    session_timeout_s: Seconds = Field(
        default=45.0, ge=6, description="How long the group waits for a silent archiver."
    )
    roll_bytes: ByteSize = Field(
        default=ByteSize(64 * 10**6),
        ge=1,
        description="A partition's buffer is written out when its records reach this size.",
    )
    roll_s: Seconds = Field(
        default=300.0, gt=0, description="... or when its oldest record waited this long."
    )
    retention_days: float = Field(
        default=30.0, gt=0, description="Archived records older than this are deleted."
    )
    prune_interval_s: Seconds = Field(
        default=3600.0, gt=0, description="How often the archiver enforces the retention."
    )
    compression: Compression = Field(default="zstd", description="Parquet compression.")
    batch_max: int = Field(
        default=1000,
        ge=1,
        description=(
            "Most messages taken per poll (buffers are rolled between polls; a LogBatch "
            "message holds up to logging.batch_max_bytes of records)."
        ),
    )
    gc_threshold: int = Field(
        default=20_000,
        ge=1,
        description="Allocations between young garbage collections (Python's default: 700).",
    )
    audit: bool = Field(default=True, description="Audit each run that ended; publish it.")
    audit_delay_s: Seconds = Field(
        default=10.0, ge=0, description="Wait after a run_end before auditing the run."
    )
    audit_wait_s: Seconds = Field(
        default=600.0,
        ge=0,
        description="How long an audit waits for other archivers to write the run's records.",
    )
    audit_silent_after_s: Seconds = Field(
        default=600.0,
        gt=0,
        description="A run with no run_end whose trainers sent nothing for this long (they "
        "died) is audited then; again when it resumes and ends.",
    )
    startup_timeout_s: Seconds = Field(
        default=120.0, gt=0, description="How long start-up waits for Kafka."
    )

    @field_validator("s3_endpoint", mode="before")
    @classmethod
    def _endpoint_url(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        value = value.strip().rstrip("/")
        if not value:
            return None
        scheme, _, rest = value.partition("://")
        if scheme not in ("http", "https") or not rest or "/" in rest:
            raise ValueError(
                f"s3_endpoint {value!r} must be a URL with a scheme and no path: "
                "http://host:port or https://host"
            )
        return value

    @field_validator("s3_region", "s3_access_key_id", mode="before")
    @classmethod
    def _blank_text_is_unset(cls, value: object) -> object:
        if isinstance(value, str):
            return value.strip() or None
        return value

    @field_validator("s3_secret_access_key_file", mode="before")
    @classmethod
    def _expand_path(cls, value: object) -> object:
        if isinstance(value, str):
            return Path(value).expanduser() if value.strip() else None
        return value

    @model_validator(mode="after")
    def _s3_credentials_whole(self) -> ArchiveSettings:
        has_secret = (
            self.s3_secret_access_key is not None or self.s3_secret_access_key_file is not None
        )
        if self.s3_secret_access_key is not None and self.s3_secret_access_key_file is not None:
            raise ValueError("set s3_secret_access_key or s3_secret_access_key_file, not both")
        if self.s3_access_key_id and not has_secret:
            raise ValueError(
                "s3_access_key_id needs its secret: set RLPULSE_ARCHIVE__S3_SECRET_ACCESS_KEY "
                "or archive.s3_secret_access_key_file"
            )
        if has_secret and not self.s3_access_key_id:
            raise ValueError("an S3 secret access key is set without s3_access_key_id")
        return self

    def s3_secret(self) -> str | None:
        """The S3 secret access key (from the environment or its file); None when unset.

        Raises :class:`SettingsError` naming the file (never its content) if it is unreadable
        or empty.
        """
        if self.s3_secret_access_key is not None:
            return self.s3_secret_access_key.get_secret_value()
        if self.s3_secret_access_key_file is None:
            return None
        return _read_secret(self.s3_secret_access_key_file, "archive.s3_secret_access_key_file")


class SearchSettings(_Section):
    """The local OpenSearch node that ``rlpulse search up`` runs on 127.0.0.1.

    Clients find OpenSearch at the top-level ``opensearch_url``; unset, at this node.
    """

    port: int = Field(
        default=9200, ge=0, le=65535, description="Port of the REST API (HTTP); 0 picks a free one."
    )
    transport_port: int = Field(
        default=9300,
        ge=0,
        le=65535,
        description="Port of the node's transport (node to node); 0 picks a free one.",
    )
    heap: str = Field(
        default="512m", pattern=r"^\d+[kmg]$", description="The JVM's heap (-Xms and -Xmx)."
    )
    startup_timeout_s: Seconds = Field(
        default=180.0, gt=0, description="How long `rlpulse search up` waits for the REST API."
    )


class IndexSettings(_Section):
    """``rlpulse index``: log records and step summaries into OpenSearch or Elasticsearch.

    Documents go to daily indices named by the record's own UTC date,
    ``<index_prefix>-logs-YYYY.MM.DD`` and ``<index_prefix>-steps-YYYY.MM.DD``.
    """

    group_id: str | None = Field(
        default=None, description="The indexers' consumer group; unset: <prefix>-index."
    )
    instance_id: str | None = Field(
        default=None,
        description="Static group membership: a restarted indexer with the same id gets its "
        "partitions back at once, without waiting out the session timeout.",
    )
    index_prefix: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9._-]*$",
        description="Indices are named <index_prefix>-logs-<date>; unset: the topic prefix.",
    )
    bulk_max_docs: int = Field(
        default=5000, ge=1, description="Most documents in one _bulk request."
    )
    bulk_max_bytes: ByteSize = Field(
        default=ByteSize(5 * 10**6), ge=1024, description="Largest _bulk request body."
    )
    bulk_max_wait_s: Seconds = Field(
        default=1.0,
        gt=0,
        description="A _bulk request is sent when its oldest document waited this long.",
    )
    retry_max_s: Seconds = Field(
        default=30.0,
        gt=0,
        description="Longest pause between tries while the search engine refuses or is away.",
    )
    request_timeout_s: Seconds = Field(
        default=60.0, gt=0, description="How long one _bulk request may take."
    )
    session_timeout_s: Seconds = Field(
        default=45.0, ge=6, description="How long the group waits for a silent indexer."
    )
    startup_timeout_s: Seconds = Field(
        default=120.0, gt=0, description="How long start-up waits for Kafka and the search engine."
    )
    sample_texts: bool = Field(
        default=True,
        description=(
            "Index the chosen rollout samples' texts too (<index_prefix>-sample-texts-<date>); "
            "off: they stay in Kafka and the archive only."
        ),
    )
    shards: int = Field(default=1, ge=1, description="Primary shards of each daily index.")
    replicas: int | None = Field(
        default=None, ge=0, description="Replicas of each daily index; unset: the cluster's."
    )


class UiSettings(_Section):
    """``rlpulse ui``: the run page's server, and how much of the live topics it keeps.

    History comes from the archive (``archive.root``); the last ``lookback_s`` seconds of the
    live topics are kept in memory too, since the archive writes in rolls (``archive.roll_s``).
    """

    host: str = Field(default="127.0.0.1", description="Address the run page listens on.")
    port: int = Field(default=8765, ge=0, le=65535, description="Port of the run page.")
    lookback_s: float = Field(
        default=900.0,
        ge=0,
        description="Seconds of the live topics kept in memory (more than archive.roll_s).",
    )
    live_max_rows: int = Field(
        default=2_000_000, ge=1000, description="Most live rows kept per table (oldest go first)."
    )
    refresh_s: float = Field(
        default=10.0, gt=0, description="How often the archive's file list is read again."
    )


class CommandLimits(_Section):
    """What a trainer accepts in a ControlCommand; a command beyond these is acked ``rejected``.

    Checked before a command reaches the training loop (:mod:`rlpulse.producers.control.screening`),
    whoever wrote it: a rule's command and an operator's alike.
    """

    scale_factor_min: float = Field(
        default=1 / 16, gt=0, description="Smallest scale_rollout_batch factor accepted."
    )
    scale_factor_max: float = Field(
        default=16.0, gt=0, description="Largest scale_rollout_batch factor accepted."
    )
    max_batch_size: int = Field(
        default=1 << 20, ge=1, description="Largest batch size a command may ask for (min, max)."
    )
    max_actions: int = Field(default=16, ge=1, description="Most actions in one command.")
    max_text_chars: int = Field(
        default=1024, ge=16, description="Longest text parameter (tag, key, message, value)."
    )

    @model_validator(mode="after")
    def _factor_range(self) -> CommandLimits:
        if self.scale_factor_min > self.scale_factor_max:
            raise ValueError(
                f"scale_factor_min ({self.scale_factor_min}) must not exceed scale_factor_max "
                f"({self.scale_factor_max})"
            )
        return self


class OperatorSettings(_Section):
    """What operator commands (``rlpulse control``, ``rlpulse rules publish``) wait for."""

    kafka_timeout_s: float = Field(
        default=15.0,
        gt=0,
        description="How long an operator command waits for Kafka to answer or to confirm a write.",
    )


class SecuritySettings(_Section):
    """How every Kafka client authenticates and encrypts, and the key that signs commands.

    ``protocol`` is Kafka's ``security.protocol``; the SASL ones need ``username`` and a
    password, the SSL ones check the brokers' certificates against ``ca_file`` (unset: the
    system's CAs, or the CA of the local broker when ``bootstrap`` is unset) and may present
    a client certificate (``cert_file`` + ``key_file``, mutual TLS). Secrets are never
    written in a config file or given as a flag: the password comes from
    ``RLPULSE_SECURITY__PASSWORD`` or ``password_file``, the signing key from
    ``RLPULSE_SECURITY__CONTROL_SIGNING_KEY`` or ``control_signing_key_file``. With a signing
    key, workers and operators sign the commands they write and trainers refuse the ones
    that are not signed with it (:mod:`rlpulse.schemas.signing`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    protocol: SecurityProtocol = Field(
        default="PLAINTEXT", description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL."
    )
    sasl_mechanism: SaslMechanism = Field(
        default="SCRAM-SHA-512", description="SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN."
    )
    username: str | None = Field(default=None, description="The SASL user name.")
    password: SecretStr | None = Field(
        default=None, description="The SASL password: only from RLPULSE_SECURITY__PASSWORD."
    )
    password_file: Path | None = Field(
        default=None, description="A file holding the SASL password (one line)."
    )
    ca_file: Path | None = Field(
        default=None, description="PEM CA certificates that sign the brokers' certificates."
    )
    cert_file: Path | None = Field(
        default=None, description="PEM client certificate (chain) for mutual TLS."
    )
    key_file: Path | None = Field(
        default=None, description="PEM private key of cert_file (unencrypted; keep it 0600)."
    )
    verify_hostname: bool = Field(
        default=True, description="Check that a broker's certificate names the host dialled."
    )
    control_signing_key: SecretStr | None = Field(
        default=None,
        description="HMAC key of ControlCommands: only from RLPULSE_SECURITY__CONTROL_SIGNING_KEY.",
    )
    control_signing_key_file: Path | None = Field(
        default=None, description="A file holding the command signing key (one line)."
    )

    @field_validator("protocol", "sasl_mechanism", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator(
        "password_file", "ca_file", "cert_file", "key_file", "control_signing_key_file",
        mode="before",
    )  # fmt: skip
    @classmethod
    def _expand_path(cls, value: object) -> object:
        if isinstance(value, str):
            return Path(value).expanduser() if value.strip() else None
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SecuritySettings:
        problems = []
        if self.password is not None and self.password_file is not None:
            problems.append("set the password or password_file, not both")
        if self.control_signing_key is not None and self.control_signing_key_file is not None:
            problems.append("set control_signing_key or control_signing_key_file, not both")
        if (self.cert_file is None) != (self.key_file is None):
            problems.append("mutual TLS needs both cert_file and key_file")
        if self.uses_sasl:
            if not self.username:
                problems.append(f"protocol {self.protocol} needs a username")
            if self.password is None and self.password_file is None:
                problems.append(
                    f"protocol {self.protocol} needs a password: set RLPULSE_SECURITY__PASSWORD "
                    "or security.password_file"
                )
        elif self.username or self.password is not None or self.password_file is not None:
            problems.append(
                f"a username or password is set but protocol {self.protocol} sends none; "
                "use SASL_SSL (or SASL_PLAINTEXT)"
            )
        if not self.uses_tls and (self.ca_file or self.cert_file):
            problems.append(
                f"ca_file or cert_file is set but protocol {self.protocol} does not use TLS; "
                "use SSL or SASL_SSL"
            )
        key = self.control_signing_key
        if key is not None and len(key.get_secret_value().encode()) < MIN_SIGNING_KEY_BYTES:
            problems.append(_SHORT_KEY)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def uses_sasl(self) -> bool:
        """Whether clients authenticate with SASL (a user name and password)."""
        return self.protocol.startswith("SASL_")

    @property
    def uses_tls(self) -> bool:
        """Whether connections are encrypted with TLS."""
        return self.protocol in ("SSL", "SASL_SSL")

    def sasl_password(self) -> str | None:
        """The SASL password (from the environment or ``password_file``); None without SASL.

        Raises :class:`SettingsError` naming the file (never its content) if it is unreadable
        or empty.
        """
        if not self.uses_sasl:
            return None
        if self.password is not None:
            return self.password.get_secret_value()
        assert self.password_file is not None  # the validator saw to it
        return _read_secret(self.password_file, "security.password_file")

    def signing_key(self) -> bytes | None:
        """The command signing key, or None when commands are not signed.

        Raises :class:`SettingsError` for an unreadable, empty or too short key file.
        """
        if self.control_signing_key is not None:
            return self.control_signing_key.get_secret_value().encode()
        if self.control_signing_key_file is None:
            return None
        key = _read_secret(self.control_signing_key_file, "security.control_signing_key_file")
        if len(key.encode()) < MIN_SIGNING_KEY_BYTES:
            raise SettingsError(f"security.control_signing_key_file {_SHORT_KEY}")
        return key.encode()


_SHORT_KEY = (
    f"a command signing key needs at least {MIN_SIGNING_KEY_BYTES} bytes; make one with "
    "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
)


def _read_secret(path: Path, setting: str) -> str:
    """The first line of a secret file, without its line end."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{setting}: cannot read {path}: {exc.__class__.__name__}") from None
    secret = text.splitlines()[0].strip() if text.strip() else ""
    if not secret:
        raise SettingsError(f"{setting}: {path} is empty")
    return secret


class Settings(BaseSettings):
    """The root of the settings tree; see the module docstring for where values come from."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        hide_input_in_errors=True,  # the security section holds secrets
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        nested_model_default_partial_update=True,
    )

    bootstrap: str | None = Field(
        default=None,
        description=(
            "Kafka bootstrap servers (host:port,...); unset: the broker `rlpulse broker up` "
            "started, else port broker.port on 127.0.0.1."
        ),
    )
    prefix: str = Field(default=DEFAULT_PREFIX, description="Topics are named <prefix>.<role>.")
    opensearch_url: str | None = Field(
        default=None,
        description=(
            "OpenSearch's REST API (http://host:port); unset: the node `rlpulse search up` "
            "started, else http://127.0.0.1:<search.port>."
        ),
    )
    replication_factor: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Replicas of every topic rlpulse and the worker create; unset: min(3, brokers)."
        ),
    )
    home: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "rlpulse",
        description="Where rlpulse keeps local files: jars, broker state, write-ahead logs.",
    )
    librdkafka: dict[str, ClientValue] = Field(
        default_factory=dict,
        description="Extra librdkafka properties for every confluent-kafka client (merged last).",
    )
    broker: BrokerSettings = BrokerSettings()
    jars: JarSettings = JarSettings()
    limits: EventLimits = EventLimits()
    producer: ProducerSettings = ProducerSettings()
    agent: AgentSettings = AgentSettings()
    worker: WorkerSettings = WorkerSettings()
    exporter: ExporterSettings = ExporterSettings()
    logging: LoggingSettings = LoggingSettings()
    samples: SamplesSettings = SamplesSettings()
    archive: ArchiveSettings = ArchiveSettings()
    ui: UiSettings = UiSettings()
    search: SearchSettings = SearchSettings()
    index: IndexSettings = IndexSettings()
    commands: CommandLimits = CommandLimits()
    operator: OperatorSettings = OperatorSettings()
    security: SecuritySettings = SecuritySettings()

    secret_fields: ClassVar[frozenset[str]] = frozenset(
        {"security.password", "security.control_signing_key", "archive.s3_secret_access_key"}
    )
    """Dotted names whose values ``rlpulse config show`` masks, and that only the environment
    may set (never a flag or the config file)."""

    @field_validator("bootstrap", mode="before")
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        if isinstance(value, str):
            return value.strip() or None
        return value

    @field_validator("opensearch_url", mode="before")
    @classmethod
    def _url_blank_is_unset(cls, value: object) -> object:
        if isinstance(value, str):
            return value.strip().rstrip("/") or None
        return value

    @field_validator("prefix")
    @classmethod
    def _valid_prefix(cls, value: str) -> str:
        if not _TOPIC_CHARS.match(value):
            raise ValueError(
                f"prefix {value!r} must be non-empty and use only letters, digits, '.', '_' "
                "and '-' (Kafka topic characters)"
            )
        return value

    @field_validator("home", mode="before")
    @classmethod
    def _expand_home(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.strip() or str(Path.home() / ".cache" / "rlpulse")
        return Path(value).expanduser() if isinstance(value, str | Path) else value

    def updated(self, changes: Mapping[str, Any]) -> Settings:
        """A copy with ``changes`` (dotted names: ``{"producer.spool_dir": path}``), validated."""
        tree = self.model_dump()
        for name, value in nest(changes).items():
            if isinstance(value, dict) and isinstance(tree.get(name), dict):
                tree[name] = {**tree[name], **value}
            else:
                tree[name] = value
        try:
            return Settings(**tree)
        except ValidationError as exc:
            raise SettingsError(_problems(exc, {})) from None

    @property
    def worker_group(self) -> str:
        """The worker's Kafka consumer group and faust app id."""
        return self.worker.app_id or f"{self.prefix}-worker"

    @property
    def exporter_group(self) -> str:
        """The exporter's Kafka consumer group."""
        return self.exporter.group_id or f"{self.prefix}-exporter"

    @property
    def archive_root(self) -> str:
        """Where the archive lives: a directory or a pyarrow filesystem URI."""
        return self.archive.root or str(self.home / "archive")

    @property
    def archive_group(self) -> str:
        """The archivers' Kafka consumer group."""
        return self.archive.group_id or f"{self.prefix}-archive"

    @property
    def index_group(self) -> str:
        """The indexers' Kafka consumer group."""
        return self.index.group_id or f"{self.prefix}-index"

    @property
    def index_prefix(self) -> str:
        """The start of every index name ``rlpulse index`` writes (lower case, as indices are)."""
        return self.index.index_prefix or self.prefix.lower()

    @property
    def spool_root(self) -> Path:
        """Where trainers keep their write-ahead logs, as configured.

        This is before the shared-filesystem check of
        :func:`rlpulse.producers.delivery.spool_root.resolve_spool_root`.
        """
        return self.producer.spool_dir or self.home / "spool"

    @property
    def worker_data_dir(self) -> Path:
        """Faust's data directory for this worker."""
        return self.worker.data_dir or self.home / "worker-data" / self.worker_group

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments, then the environment, then ``$RLPULSE_CONFIG``'s file."""
        _refuse_unknown_environment(os.environ)
        config_file = config_file_path()
        if config_file is None:
            return (init_settings, env_settings)
        return (init_settings, env_settings, _config_file_source(settings_cls, config_file))


class _Layered(Settings):
    """Settings from the layers :func:`load_settings` merged: no source of its own."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Only the keyword arguments: the merged layers."""
        return (init_settings,)


def config_file_path() -> Path | None:
    """The config file ``$RLPULSE_CONFIG`` names, if any."""
    from_env = os.environ.get(CONFIG_ENV, "").strip()
    return Path(from_env).expanduser() if from_env else None


def _config_file_source(settings_cls: type[BaseSettings], path: Path) -> YamlConfigSettingsSource:
    if not path.is_file():
        raise SettingsError(f"config file {path} does not exist")
    try:
        source = YamlConfigSettingsSource(settings_cls, yaml_file=path)
    except Exception as exc:  # yaml's errors carry the line and column
        raise SettingsError(f"config file {path} is not valid YAML: {exc}") from None
    _refuse_secrets(source(), f"config file {path}")
    return source


def environment_names() -> frozenset[str]:
    """Every ``RLPULSE_*`` name that means something.

    :data:`OUTSIDE_ENV`, and one per setting and per section, read from the tree.
    """
    names = set(OUTSIDE_ENV)
    for path in _field_paths(Settings):
        parts = path.split(".")
        names.update(_env_name(".".join(parts[:end])) for end in range(1, len(parts) + 1))
    return frozenset(names)


def _env_name(dotted: str) -> str:
    return ENV_PREFIX + dotted.replace(".", "__").upper()


def _refuse_unknown_environment(environ: Mapping[str, str]) -> None:
    """Raise :class:`SettingsError` for each ``RLPULSE_*`` variable that names no setting.

    A dict setting (``librdkafka``) takes any ``__KEY`` below its name.
    """
    known = environment_names()
    open_ended = tuple(_env_name(path) + "__" for path in _dict_paths(Settings))
    unknown = sorted(
        name
        for name in environ
        if name.upper().startswith(ENV_PREFIX)
        and name.upper() not in known
        and not name.upper().startswith(open_ended)
    )
    if not unknown:
        return
    lines = []
    for name in unknown:
        close = difflib.get_close_matches(name.upper(), sorted(known), n=1, cutoff=0.8)
        hint = f"; did you mean {close[0]}?" if close else "; `rlpulse config show` lists them"
        lines.append(f"environment variable {name} names no setting{hint}")
    raise SettingsError("\n".join(lines))


def _dict_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted names of the settings that hold a mapping of free keys."""
    paths: list[str] = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths += _dict_paths(annotation, f"{prefix}{name}.")
        elif getattr(annotation, "__origin__", None) is dict:
            paths.append(f"{prefix}{name}")
    return paths


def _refuse_secrets(tree: Mapping[str, Any], where: str) -> None:
    """Secrets come from the environment or a file of their own, never ``where``."""
    for name in sorted(Settings.secret_fields & set(_flatten(tree))):
        env = ENV_PREFIX + name.replace(".", "__").upper()
        raise SettingsError(
            f"{where} sets {name}; a secret is never written there (it would be shown, logged "
            f"or committed): set {env}, or {name}_file to a file that holds it"
        )


def load_settings(
    overrides: Mapping[str, Any] | None = None,
    config_file: Path | None = None,
    *,
    without: frozenset[str] = frozenset(),
) -> Settings:
    """The settings tree: ``overrides`` (dotted or nested keys) over env over file over defaults.

    ``overrides`` holds what flags set; ``None`` values mean "not given" and are dropped.
    ``config_file`` replaces ``$RLPULSE_CONFIG``. ``without`` names top-level settings
    (``{"security"}``) that no source sets: they keep their defaults, for a caller that does
    not use them. Raises :class:`SettingsError`.
    """
    given = {k: v for k, v in nest(overrides or {}).items() if k not in without}
    _refuse_secrets(given, "a flag")
    _refuse_unknown_environment(os.environ)
    path = config_file if config_file is not None else config_file_path()
    merged: dict[str, Any] = {}
    layers = (
        _config_file_source(Settings, path)() if path is not None else {},
        EnvSettingsSource(Settings)(),
        given,
    )
    for layer in layers:
        _merge(merged, {k: v for k, v in layer.items() if k not in without})
    try:
        layered = _Layered(**merged)
    except ValidationError as exc:
        origins = explain(overrides, config_file, validate=False)
        raise SettingsError(_problems(exc, origins)) from None
    values = {name: getattr(layered, name) for name in Settings.model_fields}
    return Settings.model_construct(layered.model_fields_set, **values)


def _merge(into: dict[str, Any], layer: Mapping[str, Any]) -> None:
    """Put ``layer`` over ``into``, section by section (a mapping merges, a value replaces)."""
    for key, value in layer.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"worker.grace_s": 5}`` -> ``{"worker": {"grace_s": 5}}``; ``None`` values dropped."""
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        if value is None:
            continue
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        if isinstance(value, Mapping) and isinstance(node.get(leaf), dict):
            node[leaf].update(value)
        else:
            node[leaf] = value
    return tree


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and key != "librdkafka":
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths: list[str] = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths += _field_paths(annotation, f"{prefix}{name}.")
        else:
            paths.append(f"{prefix}{name}")
    return paths


def explain(
    overrides: Mapping[str, Any] | None = None,
    config_file: Path | None = None,
    *,
    validate: bool = True,
) -> dict[str, str]:
    """Which source each setting's value comes from, keyed by dotted name in tree order.

    A source is ``flag``, ``env RLPULSE_...``, ``file <path>`` or ``default``. With
    ``validate``, the settings are loaded first (raising :class:`SettingsError`); without,
    names that are no setting (a misspelt key) are listed last, with where they came from.
    """
    if validate:
        load_settings(overrides, config_file)
    path = config_file if config_file is not None else config_file_path()
    given = _flatten(InitSettingsSource(Settings, init_kwargs=nest(overrides or {}))())
    from_env = _flatten(EnvSettingsSource(Settings)())
    from_file = _flatten(_config_file_source(Settings, path)()) if path is not None else {}
    origins: dict[str, str] = {}
    for name in _field_paths(Settings):
        if name in given:
            origins[name] = "flag"
        elif name in from_env:
            origins[name] = "env " + ENV_PREFIX + name.replace(".", "__").upper()
        elif name in from_file:
            origins[name] = f"file {path}"
        else:
            origins[name] = "default"
    for name in given.keys() - origins.keys():
        origins[name] = "flag"
    for name in from_env.keys() - origins.keys():
        origins[name] = "env " + ENV_PREFIX + name.replace(".", "__").upper()
    for name in from_file.keys() - origins.keys():
        origins[name] = f"file {path}"
    return origins


def _problems(exc: ValidationError, origins: Mapping[str, str]) -> str:
    lines = []
    for error in exc.errors(include_url=False):
        name = ".".join(str(part) for part in error["loc"])
        origin = origins.get(name)
        where = f" (from {origin})" if origin and origin != "default" else ""
        got = _redacted(name, error.get("input"))
        lines.append(f"setting {name}{where}: {error['msg']}, got {got!r}")
    return "invalid settings:\n  " + "\n  ".join(lines)


def _is_secret(name: str) -> bool:
    """Whether the setting (or librdkafka property) ``name`` holds a secret."""
    if name.startswith("librdkafka."):
        return bool(_SENSITIVE_CLIENT_KEY.search(name))
    return name in Settings.secret_fields


def _redacted(name: str, value: Any) -> Any:
    """``value`` of setting ``name`` (a subtree, or a leaf) with its secrets masked."""
    if isinstance(value, Mapping):
        prefix = f"{name}." if name else ""
        return {key: _redacted(f"{prefix}{key}", item) for key, item in value.items()}
    return SECRET_MASK if value and _is_secret(name) else value


def masked(settings: Settings) -> dict[str, Any]:
    """The settings as a flat dict of dotted names, secrets replaced by ``********``.

    Secrets are the :attr:`Settings.secret_fields` and the librdkafka properties whose names
    say password or secret (``sasl.password``, ``ssl.key.password``).
    """
    flat = _flatten(settings.model_dump(mode="json"))
    return {
        name: _redacted("librdkafka", value) if name == "librdkafka" else _redacted(name, value)
        for name, value in flat.items()
    }
