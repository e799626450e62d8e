"""Trace context: one id that ties together the log records of every rank of one operation.

A launcher makes an id and exports it, and every rank and child process inherits it::

    export RLPULSE_TRACE_CONTEXT=$(rlpulse trace new)
    torchrun --nproc-per-node 8 train.py

In code, :func:`trace` sets the id for what runs inside it (a contextvar, so threads and
asyncio tasks started inside see it too), and ``extra={"trace_id": ...}`` sets it for one
record. :func:`current_trace_id` is what the logging handler and the sampling filter use:
the innermost :func:`trace`, else ``$RLPULSE_TRACE_CONTEXT``. The variable holds a bare
id or a W3C ``traceparent`` (``00-<trace id>-<span id>-<flags>``), whose trace id is taken.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import re
import uuid
from collections.abc import Iterator

__all__ = ["TRACE_ENV", "current_trace_id", "new_trace_id", "parse_trace_context", "trace"]

TRACE_ENV = "RLPULSE_TRACE_CONTEXT"
"""The environment variable a launcher sets for every rank and child process."""

_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-(?P<trace>[0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
_MAX_CHARS = 128
_current: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "rlpulse_trace_id", default=None
)


def new_trace_id() -> str:
    """A fresh random trace id: 32 lowercase hex digits (the W3C trace-id format)."""
    return uuid.uuid4().hex


def parse_trace_context(text: str) -> str | None:
    """The trace id in ``text`` (a bare id or a ``traceparent``); None when blank.

    Raises ``ValueError`` for text that cannot be an id (whitespace inside, or longer
    than 128 characters).
    """
    value = text.strip()
    if not value:
        return None
    found = _TRACEPARENT.match(value.lower())
    if found is not None:
        return found["trace"]
    if len(value) > _MAX_CHARS or any(char.isspace() for char in value):
        raise ValueError(
            f"{value[:40]!r} is not a trace id: use `rlpulse trace new`, any id of up to "
            f"{_MAX_CHARS} characters without spaces, or a W3C traceparent"
        )
    return value


def current_trace_id() -> str | None:
    """The trace id in force: the innermost :func:`trace`, else ``$RLPULSE_TRACE_CONTEXT``.

    The variable is read once per process (it is what the process was started with; in code,
    use :func:`trace`). A malformed one counts as unset (:func:`parse_trace_context` says why).
    """
    chosen = _current.get()
    if chosen is not None:
        return chosen
    return _from_environment()


@functools.cache
def _from_environment() -> str | None:
    try:
        return parse_trace_context(os.environ.get(TRACE_ENV, ""))
    except ValueError:
        return None


@contextlib.contextmanager
def trace(trace_id: str | None = None, *, export: bool = False) -> Iterator[str]:
    """Make ``trace_id`` (default: a new one) the current trace id inside the block.

    With ``export``, ``$RLPULSE_TRACE_CONTEXT`` is set too for the duration, so that child
    processes started inside inherit it (this process keeps using the contextvar). Yields
    the id.
    """
    chosen = new_trace_id() if trace_id is None else parse_trace_context(trace_id)
    if chosen is None:
        raise ValueError("trace id must not be blank")
    token = _current.set(chosen)
    before = os.environ.get(TRACE_ENV)
    if export:
        os.environ[TRACE_ENV] = chosen
    try:
        yield chosen
    finally:
        _current.reset(token)
        if export:
            if before is None:
                os.environ.pop(TRACE_ENV, None)
            else:
                os.environ[TRACE_ENV] = before
