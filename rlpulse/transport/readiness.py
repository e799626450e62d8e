"""Waiting out a broker that is starting, or still electing leaders for new topics.

A long-running command (worker, exporter, archiver) started right after ``rlpulse broker
up``, or while a cluster restarts, must neither crash nor hang without a word: it says once
what it waits for, retries with a growing pause, and gives up at a deadline with one
sentence (:class:`~rlpulse.transport.exceptions.BrokerUnavailableError`). Refused
credentials or a TLS handshake that fails are not waited out: they end the wait at once,
as one sentence saying what to check
(:class:`~rlpulse.transport.exceptions.SecurityFailureError`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import KafkaException

from rlpulse.settings import Settings
from rlpulse.transport.backoff import Backoff
from rlpulse.transport.bootstrap import bootstrap_servers
from rlpulse.transport.clients import ClientDiagnostics, new_admin
from rlpulse.transport.exceptions import (
    BrokerUnavailableError,
    SecurityFailureError,
    TransportError,
)

__all__ = ["Deadline", "retry_until", "wait_for_kafka"]

T = TypeVar("T")
Say = Callable[[str], None]
FIRST_PAUSE_S = 0.25
MAX_PAUSE_S = 5.0


class Deadline:
    """A point in monotonic time, and how much of the wait is left."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        """Seconds until the deadline, never negative."""
        return max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        """Whether the deadline is behind us."""
        return time.monotonic() >= self.at


def retry_until(
    deadline: Deadline,
    attempt: Callable[[], T],
    what: str,
    say: Say | None = None,
    retry_on: tuple[type[BaseException], ...] = (TransportError, KafkaException),
) -> T:
    """Call ``attempt`` until it returns; on ``retry_on`` errors wait (growing pause) and retry.

    ``what`` completes "waiting for ...". The first failure is announced through ``say``;
    past the deadline the last error is raised as :class:`BrokerUnavailableError`. A
    :class:`SecurityFailureError` is never retried.
    """
    pauses = Backoff(FIRST_PAUSE_S, MAX_PAUSE_S)
    announced = False
    while True:
        try:
            return attempt()
        except SecurityFailureError:
            raise
        except retry_on as exc:
            if deadline.passed():
                raise BrokerUnavailableError(
                    f"gave up after {deadline.seconds:.0f} s waiting for {what}: {_first_line(exc)}"
                ) from None
            if not announced and say is not None:
                say(
                    f"waiting for {what} ({_first_line(exc)}); retrying for up to "
                    f"{deadline.seconds:.0f} s"
                )
                announced = True
        time.sleep(min(pauses.next(), deadline.left()))


def wait_for_kafka(settings: Settings, deadline: Deadline, say: Say | None = None) -> str:
    """Block until the cluster of ``settings`` answers a metadata request with its brokers.

    Returns the bootstrap address. Raises :class:`BrokerUnavailableError` at the deadline,
    with a hint at ``rlpulse broker up`` when nothing listens there, and
    :class:`SecurityFailureError` as soon as Kafka refuses the credentials or TLS fails.
    """
    bootstrap = bootstrap_servers(settings)
    diagnostics = ClientDiagnostics("start-up check", settings, logs_failure=False)
    admin = new_admin(settings, "start-up check", diagnostics)

    def refused() -> None:
        admin.poll(0)  # an admin client hands its errors to error_cb only here
        if diagnostics.failure is not None:
            raise SecurityFailureError(diagnostics.failure)

    def answered() -> None:
        try:
            metadata = admin.list_topics(timeout=max(0.5, min(1.0, deadline.left())))
        except KafkaException as exc:
            refused()
            raise TransportError(f"no answer from {bootstrap}") from exc
        if not metadata.brokers:
            raise TransportError(f"{bootstrap} answered without any broker")

    try:
        retry_until(deadline, answered, f"Kafka at {bootstrap}", say)
    except BrokerUnavailableError:
        raise BrokerUnavailableError(
            f"Kafka at {bootstrap} did not answer within {deadline.seconds:.0f} s; start it "
            "(`rlpulse broker up` runs a local one) or point RLPULSE_BOOTSTRAP at your cluster"
        ) from None
    return bootstrap


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]
