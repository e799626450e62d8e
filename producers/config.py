"""Settings of the trainer-side Kafka clients, and the librdkafka dicts built from them."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlpulse.producers.exceptions import InvalidFieldError, InvalidValueError, ProducerConfigError
from rlpulse.schemas.topics import DEFAULT_PREFIX, Topics

BOOTSTRAP_ENV = "RLPULSE_BOOTSTRAP"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
HOME_ENV = "RLPULSE_HOME"
QUEUE_MAX_MESSAGES = 1_000_000
MIB = 1 << 20
_TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")
_NOT_PATH_CHARS = re.compile(r"[^A-Za-z0-9._-]")

Compression = Literal["lz4", "zstd", "snappy", "gzip", "none"]
ExtraValue = str | int | float | bool


def bootstrap_from_env() -> str:
    """``$RLPULSE_BOOTSTRAP`` if set and not blank, else the default bootstrap address."""
    return os.environ.get(BOOTSTRAP_ENV, "").strip() or DEFAULT_BOOTSTRAP


def rlpulse_home() -> Path:
    """Where rlpulse keeps local files: ``$RLPULSE_HOME``, else ``~/.cache/rlpulse``."""
    home = os.environ.get(HOME_ENV, "").strip()
    return Path(home) if home else Path.home() / ".cache" / "rlpulse"


def default_spool_root() -> Path:
    """``$RLPULSE_HOME/spool``, else ``~/.cache/rlpulse/spool``."""
    return rlpulse_home() / "spool"


class ProducerConfig(BaseModel):
    """Where and how the trainer side talks to Kafka.

    ``extra`` is the one escape hatch: any librdkafka property, merged last into
    both the producer and the consumer dicts, so it overrides the settings above.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap_servers: str = Field(
        default_factory=bootstrap_from_env,
        description=f"host:port list; default ${BOOTSTRAP_ENV}, else {DEFAULT_BOOTSTRAP}",
    )
    topic_prefix: str = DEFAULT_PREFIX
    linger_ms: int = Field(default=5, ge=0)
    compression: Compression = "lz4"
    control_lookback_s: float = Field(
        default=3600,
        gt=0,
        description="how far back the ControlClient reads commands and acks when it starts",
    )
    delivery_timeout_s: float = Field(
        default=60,
        gt=0,
        description=(
            "librdkafka's message.timeout.ms: how long an event may wait in memory for the "
            "broker before it counts as undeliverable and goes to the spool"
        ),
    )
    close_timeout_s: float = Field(
        default=10,
        ge=0,
        description="how long close() at interpreter exit waits for delivery before spooling",
    )
    spool_dir: Path | None = Field(
        default=None,
        description=(
            f"root of the spool; default ${HOME_ENV}/spool, else ~/.cache/rlpulse/spool; "
            "a run spools into <root>/<run_id>"
        ),
    )
    spool_file_bytes: int = Field(
        default=8 * MIB, ge=4096, description="a spool file is rotated at this size"
    )
    spool_max_bytes: int = Field(
        default=1024 * MIB,
        ge=4096,
        description="spool space one producer may use; events beyond it are dropped and counted",
    )
    extra: dict[str, ExtraValue] = Field(default_factory=dict)

    @field_validator("bootstrap_servers")
    @classmethod
    def _non_empty_bootstrap(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("bootstrap_servers is empty; expected host:port[,host:port...]")
        return value

    @field_validator("topic_prefix")
    @classmethod
    def _valid_prefix(cls, value: str) -> str:
        if not _TOPIC_CHARS.match(value):
            raise ValueError(
                f"topic_prefix {value!r} must be non-empty and use only letters, digits, '.', "
                "'_' and '-' (Kafka topic characters)"
            )
        return value

    @property
    def topics(self) -> Topics:
        """The topic names under ``topic_prefix``."""
        return Topics(prefix=self.topic_prefix)

    def run_spool_dir(self, run_id: str) -> Path:
        """The directory where ``run_id``'s undeliverable events are spooled.

        Characters other than letters, digits, ``.``, ``_`` and ``-`` in the run id
        become ``_``, so any run id is one safe directory name.
        """
        root = self.spool_dir if self.spool_dir is not None else default_spool_root()
        name = _NOT_PATH_CHARS.sub("_", run_id).lstrip(".") or "_"
        return root / name

    def producer_settings(self) -> dict[str, Any]:
        """Build the librdkafka properties of an idempotent producer, ``extra`` merged last.

        ``murmur2_random`` is the Java client's partitioner (and faust's), so a run id
        lands on the same partition whichever client wrote it.
        """
        settings: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": self.linger_ms,
            "compression.type": self.compression,
            "partitioner": "murmur2_random",
            "queue.buffering.max.messages": QUEUE_MAX_MESSAGES,
            "message.timeout.ms": max(1, round(self.delivery_timeout_s * 1000)),
        }
        settings.update(self.extra)
        return settings

    def consumer_settings(self, group_id: str) -> dict[str, Any]:
        """Build the librdkafka properties of a never-committing consumer, ``extra`` merged last."""
        settings: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
        }
        settings.update(self.extra)
        return settings


class WarnOnce:
    """Logs each kind of trouble at WARNING the first time, at DEBUG afterwards."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[str] = set()

    def __call__(self, what: str, fmt: str, *args: object) -> None:
        """Log ``fmt % args``; ``what`` names the kind of trouble."""
        level = logging.DEBUG if what in self._seen else logging.WARNING
        self._seen.add(what)
        self._logger.log(level, fmt, *args)


class _ClientDiagnostics:
    """Routes one client's librdkafka logs and errors to ``logging`` without flooding it.

    librdkafka repeats a failed connection every few hundred milliseconds; each error
    code is logged once at WARNING (fatal ones at ERROR), repeats and log lines at DEBUG.
    """

    def __init__(self, client: str) -> None:
        self._client = client
        self._log = logging.getLogger("rlpulse.producers.librdkafka")
        self._warn = WarnOnce(self._log)

    def log(self, level: int, fmt: str, *args: object) -> None:
        """Receive a librdkafka log line (the ``logger`` property calls this)."""
        self._log.log(level if level >= logging.CRITICAL else logging.DEBUG, fmt, *args)

    def error_cb(self, error: KafkaError) -> None:
        """Receive a librdkafka client error (the ``error_cb`` property calls this)."""
        fmt = "%s: Kafka error %s: %s"
        if error.fatal():
            self._log.error(fmt, self._client, error.name(), error.str())
        else:
            self._warn(str(error.code()), fmt, self._client, error.name(), error.str())


def client_hooks(client: str) -> dict[str, Any]:
    """Return the ``logger`` and ``error_cb`` properties for one client named ``client``."""
    diagnostics = _ClientDiagnostics(client)
    return {"logger": diagnostics, "error_cb": diagnostics.error_cb}


def new_producer(config: ProducerConfig, client: str) -> Producer:
    """Create a confluent ``Producer``; it starts librdkafka's threads, so call it lazily."""
    try:
        return Producer({**config.producer_settings(), **client_hooks(client)})
    except KafkaException as exc:
        raise ProducerConfigError(
            f"{client}: librdkafka refused the producer settings: {exc}"
        ) from exc


def new_consumer(
    config: ProducerConfig, group_id: str, client: str, overrides: Mapping[str, Any] | None = None
) -> Consumer:
    """Create a confluent ``Consumer``; it starts librdkafka's threads, so call it lazily."""
    settings = {**config.consumer_settings(group_id), **(overrides or {}), **client_hooks(client)}
    try:
        return Consumer(settings)
    except (KafkaException, ValueError) as exc:
        raise ProducerConfigError(
            f"{client}: librdkafka refused the consumer settings: {exc}"
        ) from exc


def require_run_id(run_id: object) -> str:
    """Return ``run_id`` after checking it is a non-empty str (it becomes the message key)."""
    if not isinstance(run_id, str):
        raise InvalidFieldError("run_id", None, run_id, "a non-empty str")
    if not run_id:
        raise InvalidValueError("run_id", run_id, "a non-empty str")
    return run_id


LONG_MIN = -(2**63)
LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1


def require_int(field: str, value: object, minimum: int, maximum: int = INT_MAX) -> int:
    """Return ``value`` as an ``int`` (``__index__``, not bool) after checking the range.

    The default maximum is Avro's ``int``; pass :data:`LONG_MAX` for a ``long``.
    """
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidFieldError(field, None, value, "an int")
    number = int(value.__index__())
    if not minimum <= number <= maximum:
        raise InvalidValueError(field, number, f"an int in [{minimum}, {maximum}]")
    return number


def string_map(field: str, mapping: Mapping[str, str] | None) -> dict[str, str]:
    """Return a copy of ``mapping`` after checking that its keys and values are strings."""
    if mapping is None:
        return {}
    if not isinstance(mapping, Mapping):
        raise InvalidFieldError(field, None, mapping, "a mapping of str to str")
    out: dict[str, str] = {}
    for key, value in mapping.items():
        if not isinstance(key, str):
            raise InvalidFieldError(field, repr(key), key, "str keys")
        if not isinstance(value, str):
            raise InvalidFieldError(field, key, value, "a str value")
        out[key] = value
    return out
