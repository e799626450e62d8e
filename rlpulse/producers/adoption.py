"""Adopting dead producers' write-ahead logs: find them, claim them, send them, delete them.

One routine for both senders of what a dead process left: a new logger of the same run on the
same host (:mod:`rlpulse.producers.sender`, from its start) and ``rlpulse replay``
(:mod:`rlpulse.producers.replay`). :func:`claim_dead_logs` finds the logs in one directory
whose writer is gone (its ``flock`` went with it) and takes their claims; a
:class:`DeadLogs` sends them with their producers' own ids (each
:class:`~rlpulse.producers.shipper.LogShipper` reads back what already arrived) and deletes
each one delivered whole. Two live processes that look at once cannot both claim a log: the
claim is an exclusive ``flock``.

What looking costs: a listing of the run's directory of this host and, per log in it that
this process does not write, one read of its ``meta.json`` and one lock attempt. A host holds
the logs of its own ranks only (a few to a hundred), never the fleet's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, Producer

from rlpulse.producers.shipper import LogShipper, ShipperCounts
from rlpulse.producers.wal import LogMeta, WalClaim, logs_in, unsent_frames

__all__ = ["DeadLog", "DeadLogs", "claim_dead_logs", "written_on"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeadLog:
    """A dead producer's log this process claimed: it is this process's to send now."""

    meta: LogMeta
    claim: WalClaim


def written_on(meta: LogMeta, host: str) -> bool:
    """Whether ``host`` wrote the log (or, for a log of an earlier release, none is recorded).

    Only such logs are claimed on ``host``: another host's writer may be alive there, where a
    lock on a filesystem the hosts share may not reach.
    """
    return meta.host is None or meta.host == host


def claim_dead_logs(directory: Path, host: str, skip: Collection[Path] = ()) -> Iterator[DeadLog]:
    """Claim the logs in ``directory`` (a run's logs of ``host``) whose processes are gone.

    ``skip``: logs not to look at (this process's own, those it sends already). A log whose
    ``meta.json`` names another host is left alone: its writer may be alive there.
    """
    for path in logs_in(directory):
        if path in skip:
            continue
        meta = LogMeta.read(path)
        if meta is None or not written_on(meta, host):
            continue
        claim = WalClaim.take(path)
        if claim is not None:
            yield DeadLog(meta, claim)


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
