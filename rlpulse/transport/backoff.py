"""The pauses of a retry loop: a first one, growing by a factor up to a cap.

Every loop that retries something out of reach (Kafka, the host's agent, the search engine,
Alertmanager) takes its pauses from a :class:`Backoff` and keeps its own way to wait: a
stop event, a condition, a time before which it does not try again. Standard library only:
the trainer's side imports it.
"""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    """The pause before each next try: ``first_s``, then ``factor`` times the last, up to ``max_s``.

    It only counts; it never waits. A loop calls :meth:`next` after each failed try for the
    pause to wait then, and :meth:`reset` when a try succeeds, so that the next trouble starts
    again from ``first_s``. Not thread-safe: each loop holds its own.
    """

    __slots__ = ("_pause_s", "factor", "first_s", "max_s")

    def __init__(self, first_s: float, max_s: float, factor: float = 2.0) -> None:
        if not first_s > 0:
            raise ValueError(f"the first pause must be positive, not {first_s!r}")
        if not max_s > 0:
            raise ValueError(f"the longest pause must be positive, not {max_s!r}")
        if not factor >= 1:
            raise ValueError(f"the factor must be at least 1, not {factor!r}")
        self.first_s = first_s
        self.max_s = max_s
        self.factor = factor
        self._pause_s = min(first_s, max_s)

    def next(self) -> float:
        """The pause to wait now, in seconds; the one after it is ``factor`` times longer."""
        pause_s = self._pause_s
        self._pause_s = min(pause_s * self.factor, self.max_s)
        return pause_s

    def reset(self) -> None:
        """A try succeeded: the next pause is the first one again."""
        self._pause_s = min(self.first_s, self.max_s)

    def __repr__(self) -> str:
        return (
            f"Backoff(first_s={self.first_s!r}, max_s={self.max_s!r}, factor={self.factor!r}, "
            f"next pause {self._pause_s!r} s)"
        )
