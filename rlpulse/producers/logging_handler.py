"""A ``logging.Handler`` that publishes log records as TrainerEvents.

Many trainers log structured records, one dict per stage and step::

    log = logging.getLogger("trainer")
    log.addHandler(EventHandler(link))              # link: a RunLink or an EventLogger
    log.info({"step": 120, "stage": "rollout", "reward_mean": 2.4, "kl": 0.18})

A dict message becomes a ``metrics`` event: ``step`` and ``stage`` (default: the
handler's ``stage``) say where it belongs, numbers become metrics (nested dicts are
flattened with ``/``: ``{"actor": {"loss": 1}}`` is ``actor/loss``), ``world_size``
overrides the logger's, and any other field (strings, lists, ...) is kept as JSON in
the event's ``message``. Any other message becomes a ``log`` event with the record's
level and formatted text, at the step given by ``extra={"step": ...}`` or else the
last step the handler saw. Records of rlpulse's own loggers are ignored, so the
handler can sit on the root logger without feeding on itself.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from rlpulse.schemas.records import EventKind

_OWN_LOGGERS = "rlpulse"
_NOT_NUMBERS = (str, bytes, bytearray)


class EventSink(Protocol):
    """What the handler publishes through: :class:`RunLink` and :class:`EventLogger` are ones."""

    def log(
        self,
        metrics: Mapping[str, float],
        step: int,
        stage: str = ...,
        *,
        kind: EventKind = ...,
        level: str | None = ...,
        message: str | None = ...,
        world_size: int | None = ...,
    ) -> None:
        """Publish one event."""


class EventHandler(logging.Handler):
    """Publishes each record as a TrainerEvent through ``sink`` (see the module docs)."""

    def __init__(self, sink: EventSink, *, stage: str = "trainer", level: int = logging.NOTSET):
        super().__init__(level)
        self.sink = sink
        self.stage = stage
        self.last_step = 0
        """The step of the last dict record; ``log`` events without a step get it."""
        self._busy = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        """Publish ``record``; trouble goes to ``handleError``, never to the caller."""
        if record.name == _OWN_LOGGERS or record.name.startswith(_OWN_LOGGERS + "."):
            return
        if getattr(self._busy, "active", False):
            return
        self._busy.active = True
        try:
            if isinstance(record.msg, Mapping) and not record.args:
                self._emit_fields(record, record.msg)
            else:
                self._emit_text(record)
        except Exception:
            self.handleError(record)
        finally:
            self._busy.active = False

    def _emit_fields(self, record: logging.LogRecord, fields: Mapping[Any, Any]) -> None:
        step = fields.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            self.last_step = step
        stage = fields.get("stage")
        world_size = fields.get("world_size")
        metrics: dict[str, float] = {}
        others: dict[str, Any] = {}
        _split(fields, "", metrics, others)
        for key in ("step", "stage", "world_size"):
            metrics.pop(key, None)
            others.pop(key, None)
        self.sink.log(
            metrics,
            self.last_step,
            stage if isinstance(stage, str) and stage else self.stage,
            level=record.levelname,
            message=json.dumps(others, default=str) if others else None,
            world_size=world_size if isinstance(world_size, int) and world_size > 0 else None,
        )

    def _emit_text(self, record: logging.LogRecord) -> None:
        step = getattr(record, "step", None)
        stage = getattr(record, "stage", None)
        self.sink.log(
            {},
            step if isinstance(step, int) and not isinstance(step, bool) else self.last_step,
            stage if isinstance(stage, str) and stage else self.stage,
            kind="log",
            level=record.levelname,
            message=self.format(record),
        )


def _split(
    fields: Mapping[Any, Any], prefix: str, metrics: dict[str, float], others: dict[str, Any]
) -> None:
    """Sort ``fields`` into numeric metrics and other values; nested mappings get ``a/b`` keys."""
    for key, value in fields.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            _split(value, f"{name}/", metrics, others)
            continue
        number = _as_number(value)
        if number is None:
            others[name] = value
        else:
            metrics[name] = number


def _as_number(value: object) -> float | None:
    """``float(value)`` for numbers (numpy scalars and one-element tensors too), else None."""
    if value is None or isinstance(value, _NOT_NUMBERS):
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):
        return None
