"""Write-behind access to a faust Table: changes go to the changelog once per batch, not per write.

faust sends one changelog message (JSON encoding + a produce) on every ``table[key] = value``.
The joiner rewrites the same few records many times per batch of events (a step's group
once per rank), so the agents use a :class:`WriteBehind` view instead: reads and writes hit
the table's local store at once, and :meth:`WriteBehind.flush` sends the latest value of each
changed key once, serialized as faust would (the table's own key and value serializers), through
an :class:`~rlpulse.streams.worker.outbox.Outbox`. Nothing changes for recovery: the changelog holds
the same final values.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, MutableMapping, Sequence
from typing import Any

from faust.serializers import codecs

from rlpulse.streams.worker.outbox import Outbox

__all__ = ["SourcePartition", "WriteBehind", "flush_in_order"]


class SourcePartition:
    """The source partition of the message being processed, shared by every table's view.

    A table's changelog partition is its source partition (faust recovers partition ``p`` of
    the changelog for whoever owns partition ``p``): the worker sets :attr:`number` once per
    message, before changing anything, and each view's changes go there.
    """

    __slots__ = ("number",)

    def __init__(self) -> None:
        self.number = 0


class WriteBehind(MutableMapping[str, Any]):
    """A dict view of one faust Table whose changelog writes wait for :meth:`flush`.

    A change goes to the changelog partition ``source`` holds when it is made.
    """

    def __init__(self, table: Any, outbox: Outbox, source: SourcePartition) -> None:
        self.table = table
        self.outbox = outbox
        self.source = source
        self._dirty: dict[str, int] = {}

    def __getitem__(self, key: str) -> Any:
        return self.table.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default``."""
        return self.table.data.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.table.data

    def __setitem__(self, key: str, value: Any) -> None:
        self.table.data[key] = value
        self._dirty[key] = self.source.number

    def __delitem__(self, key: str) -> None:
        del self.table.data[key]
        self._dirty[key] = self.source.number

    def __iter__(self) -> Iterator[str]:
        return iter(self.table.data)

    def __len__(self) -> int:
        return len(self.table.data)

    @property
    def dirty(self) -> bool:
        """Whether some change waits for :meth:`flush`."""
        return bool(self._dirty)

    async def flush(self) -> list[asyncio.Future[Any]]:
        """Send the current value (or a tombstone) of every changed key; return the deliveries."""
        table, data = self.table, self.table.data
        topic = table.changelog_topic.get_topic_name()
        deliveries: list[asyncio.Future[Any]] = []
        for key, partition in self._dirty.items():
            value = data.get(key)
            deliveries.append(
                await self.outbox.send(
                    topic,
                    codecs.dumps(table.key_serializer, key),
                    None if value is None else codecs.dumps(table.value_serializer, value),
                    partition,
                )
            )
        self._dirty.clear()
        return deliveries


async def flush_in_order(*stages: Sequence[WriteBehind]) -> None:
    """Flush the views stage by stage; each stage is delivered before the next one is sent.

    The last stage is only sent: faust flushes its producer before it commits the offsets
    of the messages whose processing produced these writes.
    """
    for index, views in enumerate(stages):
        deliveries = [d for view in views if view.dirty for d in await view.flush()]
        if deliveries and index < len(stages) - 1:
            await asyncio.gather(*deliveries)
