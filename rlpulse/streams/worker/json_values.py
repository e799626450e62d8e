"""Table values kept as JSON bytes: the worker's compact form for what it keeps long.

A released step stays in the worker for the late window (10 minutes by default) in case a
late rank arrives; at a few thousand events/s that is hundreds of thousands of steps. As
dicts of lists they take kilobytes each and are all tracked by Python's garbage collector,
whose full collections then pause the event loop for seconds. :class:`JsonValues` keeps
each value as the JSON bytes the changelog holds anyway — a few hundred bytes, untracked by
the collector — and decodes it only when a late event or the pruning reads it.

The JSON is the standard library's, which keeps NaN and infinities (metric values hold
them on purpose); :func:`dumps` and :func:`loads` are also what the state tables' faust
codec uses, so every table's changelog holds the same encoding.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, MutableMapping
from typing import Any

__all__ = ["JsonValues", "dumps", "loads"]


def dumps(value: Any) -> bytes:
    """Compact JSON bytes of a state document (NaN and infinities kept)."""
    return json.dumps(value, separators=(",", ":")).encode()


def loads(data: bytes) -> Any:
    """The state document of :func:`dumps` bytes."""
    return json.loads(data)


class JsonValues(MutableMapping[str, Any]):
    """A mapping of documents stored as :func:`dumps` bytes in ``store``.

    Reading gives a fresh document each time: change it and assign it back, as with any
    table (the joiner does).
    """

    def __init__(self, store: MutableMapping[str, bytes]) -> None:
        self.store = store

    def __getitem__(self, key: str) -> Any:
        return loads(self.store[key])

    def get(self, key: str, default: Any = None) -> Any:
        """The document of ``key``, or ``default``."""
        data = self.store.get(key)
        return default if data is None else loads(data)

    def __setitem__(self, key: str, value: Any) -> None:
        self.store[key] = dumps(value)

    def __delitem__(self, key: str) -> None:
        del self.store[key]

    def __contains__(self, key: object) -> bool:
        return key in self.store

    def __iter__(self) -> Iterator[str]:
        return iter(self.store)

    def __len__(self) -> int:
        return len(self.store)
