"""Commands for every rank: rank 0 polls, a broadcast hands the same list to all ranks.

In an SPMD job every rank runs the same loop, and a command must act on all of them at
the same step (a stop on one rank only would hang the others in their next
collective). So only rank 0 reads the control topic, and once per step every rank
calls :meth:`CommandBus.commands`, a collective built on a pluggable broadcast
function: rank 0's list of commands comes back on every rank.

A broadcast function takes rank 0's value on rank 0 (what other ranks pass is
ignored) and returns that value on every rank, and every rank must call it at the
same point — e.g. over ``torch.distributed``::

    def torch_broadcast(value):
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

A single process (or a single-controller framework whose driver is rank 0) needs
none: :func:`single_process_broadcast` is the default for rank 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from rlpulse.producers.exceptions import InvalidValueError
from rlpulse.schemas.records import ControlCommand

T = TypeVar("T")


class Broadcast(Protocol):
    """``broadcast(value) -> rank 0's value``, on every rank; a collective call."""

    def __call__(self, value: T, /) -> T:
        """Return rank 0's ``value`` (every rank calls it, at the same point)."""


def single_process_broadcast(value: T, /) -> T:
    """The broadcast of a job with one rank: the value itself."""
    return value


class CommandBus:
    """Hands the commands rank 0 polled to every rank, in one collective call per step."""

    def __init__(self, rank: int, broadcast: Broadcast | None = None) -> None:
        self.rank = rank
        self._broadcast = broadcast

    def share(self, value: T) -> T:
        """Rank 0's ``value``, on every rank (a collective when a broadcast was given)."""
        if self._broadcast is not None:
            return self._broadcast(value)
        if self.rank == 0:
            return single_process_broadcast(value)
        raise InvalidValueError(
            "broadcast",
            None,
            f"a broadcast function: rank {self.rank} can only get what rank 0 polled "
            "through one (see rlpulse.producers.control.bus)",
        )

    def commands(self, poll: Callable[[], list[ControlCommand]] | None) -> list[ControlCommand]:
        """Rank 0 calls ``poll``; every rank gets its result. Call it on all ranks, each step."""
        polled = poll() if self.rank == 0 and poll is not None else []
        return self.share(polled)
