"""Objects that a ``with`` block closes: :class:`ClosedByWith`."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["ClosedByWith"]


class ClosedByWith:
    """A base for objects used as ``with obj:``: the block gives ``obj`` and ends in ``close()``.

    A subclass defines ``close()`` (its parameters all with defaults); one whose end depends
    on how the block ended (an exception) overrides :meth:`close_after`.
    """

    def close(self) -> object:
        """Release what the object holds."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close_after(exc)

    def close_after(self, exc: BaseException | None) -> None:
        """Close at the end of a ``with`` block that ended with ``exc`` (None: normally)."""
        self.close()
