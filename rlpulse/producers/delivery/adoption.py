"""Adopting dead producers' write-ahead logs: find them, claim them, send them, delete them.

One routine for both senders of what a dead process left: a new logger of the same run on the
same host (:mod:`rlpulse.producers.delivery.sender`, from its start) and ``rlpulse replay``
(:mod:`rlpulse.producers.delivery.replay`). :func:`look_for_dead_logs` goes through logs,
claims those whose writer is gone (its ``flock`` went with it) and says why it passed the
others; :func:`claim_dead_logs` is that look over one run's directory of a host; a
:class:`DeadLogs` sends them with their producers' own ids (each
:class:`~rlpulse.producers.delivery.shipper.LogShipper` reads back what already arrived) and deletes
each one delivered whole. Two live processes that look at once cannot both claim a log: the
claim is an exclusive ``flock``.

What looking costs: a listing of the run's directory of this host and, per log in it that
this process does not write, one read of its ``meta.json`` and one lock attempt. A host holds
the logs of its own ranks only (a few to a hundred), never the fleet's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from confluent_kafka import Consumer, Producer

from rlpulse.producers.delivery.shipper import LogShipper, ShipperCounts
from rlpulse.producers.delivery.wal import LogMeta, WalClaim, logs_in, unsent_frames

__all__ = [
    "DeadLog",
    "DeadLogs",
    "PassedLog",
    "claim_dead_logs",
    "look_for_dead_logs",
    "written_on",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeadLog:
    """A dead producer's log this process claimed: it is this process's to send now."""

    meta: LogMeta
    claim: WalClaim


@dataclass(frozen=True)
class PassedLog:
    """A log a look did not claim, and why."""

    path: Path
    reason: Literal["no meta", "other host", "held"]
    """``no meta``: no readable ``meta.json``; ``other host``: another host wrote it (its
    writer may be alive there); ``held``: a live process holds its claim."""


def written_on(meta: LogMeta, host: str) -> bool:
    """Whether ``host`` wrote the log (or, for a log of an earlier release, none is recorded).

    Only such logs are claimed on ``host``: another host's writer may be alive there, where a
    lock on a filesystem the hosts share may not reach.
    """
    return meta.host is None or meta.host == host


def look_for_dead_logs(
    logs: Iterable[Path], host: str | None, skip: Collection[Path] = ()
) -> Iterator[DeadLog | PassedLog]:
    """Each of ``logs`` not in ``skip``: claimed (its process is gone) or passed, and why.

    The one look of both senders of what a dead process left. With ``host``, a log whose
    ``meta.json`` names another host is passed: its writer may be alive there (None: every
    host's, for a replay of logs copied off their hosts).
    """
    for path in logs:
        if path in skip:
            continue
        meta = LogMeta.read(path)
        if meta is None:
            yield PassedLog(path, "no meta")
        elif host is not None and not written_on(meta, host):
            yield PassedLog(path, "other host")
        else:
            claim = WalClaim.take(path)
            yield PassedLog(path, "held") if claim is None else DeadLog(meta, claim)


def claim_dead_logs(directory: Path, host: str, skip: Collection[Path] = ()) -> Iterator[DeadLog]:
    """Claim the logs in ``directory`` (a run's logs of ``host``) whose processes are gone.

    ``skip``: logs not to look at (this process's own, those it sends already).
    """
    for found in look_for_dead_logs(logs_in(directory), host, skip):
        if isinstance(found, DeadLog):
            yield found


class DeadLogs:
    """Sends the dead producers' logs handed to it, from its driver's thread.

    The driver (the logger's sender thread, or ``rlpulse replay``) calls :meth:`step` with
    its producer and serves the producer's delivery reports; a log delivered whole is deleted
    as soon as it is, and :meth:`close` keeps what was not (its claim released, for the next
    process or replay). Not thread-safe: hand logs over to the driver's thread.
    """

    def __init__(
        self, new_consumer: Callable[[], Consumer], batch_max_bytes: int, label: str
    ) -> None:
        self._new_consumer = new_consumer
        self._batch_max_bytes = batch_max_bytes
        self._label = label
        self._sending: dict[Path, LogShipper] = {}
        self.sent_logs = 0
        """Logs delivered whole and deleted."""
        self.counts = ShipperCounts()
        """What happened to the records of the logs it is done with (delivered or kept)."""

    def add(self, dead: DeadLog) -> None:
        """Send ``dead`` from now on."""
        log.info("%s: sending what dead producer %s left", self._label, dead.meta.producer_id)
        self._sending[dead.meta.directory] = LogShipper(
            dead.meta, self._new_consumer, batch_max_bytes=self._batch_max_bytes, claim=dead.claim
        )

    @property
    def directories(self) -> set[Path]:
        """The logs being sent."""
        return set(self._sending)

    @property
    def idle(self) -> bool:
        """Whether no log is being sent."""
        return not self._sending

    def step(self, producer: Producer) -> int:
        """Let every log send what it can; delete the ones delivered whole. Records done now."""
        done = 0
        for directory, shipper in list(self._sending.items()):
            before = shipper.acked_frames
            shipper.step(producer)
            done += shipper.acked_frames - before
            if shipper.delivered_all:
                self._finish(directory, shipper)
        return done

    def close(self) -> list[tuple[Path, int, str | None]]:
        """Stop sending: keep each log not delivered whole; (log, records left, why) of each."""
        kept = []
        for directory, shipper in list(self._sending.items()):
            shipper.settle()
            if shipper.delivered_all:
                self._finish(directory, shipper)
                continue
            kept.append((directory, unsent_frames(directory), shipper.last_error))
            self._count(shipper.counts)
            shipper.close(delete=False)
        self._sending.clear()
        return kept

    def _count(self, counts: ShipperCounts) -> None:
        for name in ("delivered", "resent", "found", "dropped"):
            setattr(self.counts, name, getattr(self.counts, name) + getattr(counts, name))

    def _finish(self, directory: Path, shipper: LogShipper) -> None:
        shipper.close(delete=True)
        del self._sending[directory]
        self.sent_logs += 1
        counts = shipper.counts
        self._count(counts)
        log.info(
            "%s: sent what dead producer %s left (%d record(s); %d were there already)",
            self._label,
            shipper.meta.producer_id,
            counts.resent + counts.delivered,
            counts.found,
        )
