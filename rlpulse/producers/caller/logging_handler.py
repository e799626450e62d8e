"""A ``logging.Handler`` that publishes log records: dicts as metrics, text as LogRecords.

Many trainers log structured records, one dict per stage and step::

    log = logging.getLogger("trainer")
    log.addHandler(EventHandler(link))              # link: a RunLink or an EventLogger
    log.info({"step": 120, "stage": "rollout", "reward_mean": 2.4, "kl": 0.18})

A dict message becomes a ``metrics`` event: ``step`` and ``stage`` (default: the
handler's ``stage``) say where it belongs, numbers become metrics (nested dicts are
flattened with ``/``: ``{"actor": {"loss": 1}}`` is ``actor/loss``), ``world_size``
overrides the logger's, and any other field (strings, lists, ...) is kept as JSON in
the event's ``message``. Any other message becomes a
:class:`~rlpulse.schemas.records.LogRecord` on ``<prefix>.logs`` (never read by the
worker): level, logger name, the message, the formatted traceback of ``exc_info``, the
trace id (``extra={"trace_id": ...}``, else the current trace context of
:mod:`rlpulse.producers.caller.trace`), the step (``extra={"step": ...}``, else the last step
logged), the stage (``extra={"stage": ...}``) and every other ``extra`` field as text.
Records of rlpulse's own loggers are ignored, so the handler can sit on the root logger
without feeding on itself; they reach stderr through the ``rlpulse`` logger's own handler
(:mod:`rlpulse.diagnostics`), however the program's handlers are set up.

The sink is anything with ``log_event(EventFields)`` and ``log_line(LogFields)``
(:class:`EventSink`; :class:`RunLink` and :class:`EventLogger` have both): the handler hands
each record over as one typed value (:mod:`rlpulse.producers.encoding.fields`).

Settings (``logging.*`` of the sink's settings) apply to text records only, never to
dict (metrics) records: ``level`` is the lowest level published, ``sampling`` below 1
samples DEBUG and INFO with a :class:`~rlpulse.producers.caller.sampling.SamplingFilter`, and
``enabled: false`` drops them all.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from rlpulse.diagnostics import install as install_diagnostics
from rlpulse.producers.caller.sampling import RATE_ATTR, SAMPLED_OUT_ATTR, SamplingFilter
from rlpulse.producers.caller.trace import current_trace_id
from rlpulse.producers.encoding.fields import EventFields, LogFields
from rlpulse.schemas.validation import metric_number
from rlpulse.settings import Settings

_OWN_LOGGERS = "rlpulse"
_OWN_LENGTH = len(_OWN_LOGGERS)
_PLAIN_RECORD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    "step",
    "stage",
    "trace_id",
    RATE_ATTR,
    SAMPLED_OUT_ATTR,
}
_PLAIN_SIZE = len(logging.LogRecord("", 0, "", 0, "", None, None).__dict__)


class EventSink(Protocol):
    """What the handler publishes through: :class:`RunLink` and :class:`EventLogger` are ones."""

    def log_event(self, event: EventFields) -> None:
        """Publish one event."""

    def log_line(self, line: LogFields) -> None:
        """Publish one text log record."""


class EventHandler(logging.Handler):
    """Publishes each record through ``sink``: dicts as metrics events, text as LogRecords.

    ``level`` is the handler's own level (for every record); the ``logging.*`` settings of
    the sink (see the module docs) apply to text records on top of it.
    """

    def __init__(
        self, sink: EventSink, *, stage: str = "trainer", level: int | str = logging.NOTSET
    ) -> None:
        super().__init__(level)
        install_diagnostics()  # the root logger's only handler ignores rlpulse's own records
        self.sink = sink
        self.stage = stage
        chosen = getattr(sink, "settings", None)
        logging_settings = (chosen if isinstance(chosen, Settings) else Settings()).logging
        self.enabled = logging_settings.enabled
        """Whether text records are published (the ``logging.enabled`` setting)."""
        self.text_level: int = logging.getLevelName(logging_settings.level)
        """The lowest level of text records published (the ``logging.level`` setting)."""
        self.sampler = (
            SamplingFilter(logging_settings.sampling) if logging_settings.sampling < 1 else None
        )
        """The sampling of DEBUG and INFO text records (``logging.sampling`` < 1), or None."""
        self.last_step: int | None = None
        """The step of the last dict record; text records without a step get it."""
        self._busy = threading.local()

    def createLock(self) -> None:  # noqa: N802 -- logging.Handler's name
        """No handler lock: the sink is thread-safe (its own lock orders records by seq)."""
        self.lock = None

    def emit(self, record: logging.LogRecord) -> None:
        """Publish ``record``; trouble goes to ``handleError``, never to the caller."""
        name = record.name
        if name.startswith(_OWN_LOGGERS) and (name == _OWN_LOGGERS or name[_OWN_LENGTH] == "."):
            return
        busy = self._busy
        if getattr(busy, "active", False):
            return
        busy.active = True
        try:
            message = record.msg
            if type(message) is not str and isinstance(message, Mapping) and not record.args:
                self._emit_fields(record, message)
            else:
                self._emit_text(record)
        except Exception:
            self.handleError(record)
        finally:
            busy.active = False

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
        event = EventFields(
            "metrics",
            self.last_step or 0,
            stage if isinstance(stage, str) and stage else self.stage,
            world_size if isinstance(world_size, int) and world_size > 0 else None,
            metrics,
            record.levelname,
            json.dumps(others, default=str) if others else None,
        )
        self.sink.log_event(event)

    def _emit_text(self, record: logging.LogRecord) -> None:
        if not self.enabled or record.levelno < self.text_level:
            return
        if self.sampler is not None and not self.sampler.filter(record):
            return
        extras = record.__dict__
        if len(extras) <= _PLAIN_SIZE and not (
            record.exc_info or record.exc_text or record.stack_info
        ):  # no extra attributes (no step, stage, trace id, fields, sampling marks), no traceback
            line = LogFields(
                self.last_step, self.stage, record.levelname, record.levelno, record.name,
                record.getMessage(), None, current_trace_id(),
            )  # fmt: skip
            self.sink.log_line(line)
            return
        step = extras.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            step = self.last_step
        stage = extras.get("stage")
        trace_id = extras.get("trace_id")
        if not isinstance(trace_id, str) or not trace_id:
            trace_id = current_trace_id()
        exception = None
        if record.exc_info:
            exception = record.exc_text or self._formatter().formatException(record.exc_info)
        elif record.exc_text:
            exception = record.exc_text
        if record.stack_info:
            exception = f"{exception}\n{record.stack_info}" if exception else record.stack_info
        fields = None
        if len(extras) > _PLAIN_SIZE:
            fields = {k: str(v) for k, v in extras.items() if k not in _PLAIN_RECORD}
        line = LogFields(
            step,
            stage if isinstance(stage, str) and stage else self.stage,
            record.levelname,
            record.levelno,
            record.name,
            record.getMessage(),
            exception,
            trace_id,
            fields,
            extras.get(RATE_ATTR, 1.0),
            extras.get(SAMPLED_OUT_ATTR),
        )
        self.sink.log_line(line)

    def _formatter(self) -> logging.Formatter:
        return self.formatter or _PLAIN_FORMATTER


_PLAIN_FORMATTER = logging.Formatter()


def _split(
    fields: Mapping[Any, Any], prefix: str, metrics: dict[str, float], others: dict[str, Any]
) -> None:
    """Sort ``fields`` into numeric metrics and other values; nested mappings get ``a/b`` keys."""
    for key, value in fields.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            _split(value, f"{name}/", metrics, others)
            continue
        number = metric_number(value)
        if number is None:
            others[name] = value
        else:
            metrics[name] = number
