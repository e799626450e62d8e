"""Sampling of chatty log records: keep a share of DEBUG and INFO, every WARNING and above.

``logger.addFilter(SamplingFilter(rate=0.1))`` keeps about 10% of the DEBUG and INFO
records of ``logger``. A record with a trace id (``extra={"trace_id": ...}`` or the current
trace context, :mod:`rlpulse.producers.caller.trace`) is kept when a hash of its trace id falls
below ``rate``, so every record of a trace, on every rank and host, is kept or dropped
together; a record without one is kept at random. What the filter drops is counted per
level, and every record it lets through carries the counts so far (``sampled_out``) and
the rate it was kept at (``sample_rate``); :class:`~rlpulse.producers.EventHandler`
publishes both, so the totals can be estimated from what arrived.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
from collections.abc import Mapping

from rlpulse.producers.caller.trace import current_trace_id

__all__ = ["RATE_ATTR", "SAMPLED_OUT_ATTR", "SamplingFilter", "keeps_trace"]

RATE_ATTR = "rlpulse_sample_rate"
"""Record attribute: the share of such records kept by the sampling filters it passed."""
SAMPLED_OUT_ATTR = "rlpulse_sampled_out"
"""Record attribute: records dropped so far by the filter it passed, per level name."""
_SCALE = 1 << 64


def keeps_trace(trace_id: str, rate: float) -> bool:
    """Whether sampling at ``rate`` keeps the records of ``trace_id``; the same on every host.

    The first 8 bytes of a BLAKE2b hash of the id, as a fraction of 2**64, against ``rate``:
    a trace kept at some rate is kept at every higher rate.
    """
    digest = hashlib.blake2b(trace_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < rate * _SCALE


class SamplingFilter(logging.Filter):
    """A ``logging.Filter`` that keeps a share ``rate`` of DEBUG and INFO records.

    WARNING and above always pass, and so do structured records (a dict message, which
    :class:`~rlpulse.producers.EventHandler` publishes as metrics). See the module docstring
    for traces and counting.
    ``seed`` fixes the random choices of records without a trace id (for tests).
    """

    def __init__(self, rate: float, *, name: str = "", seed: int | None = None) -> None:
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1:
            raise ValueError(f"rate must be a number in (0, 1], got {rate!r}")
        super().__init__(name)
        self.rate = float(rate)
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._dropped: dict[str, int] = {}
        self._snapshot: dict[str, int] = {}

    @property
    def dropped(self) -> dict[str, int]:
        """Records dropped so far, per level name."""
        with self._lock:
            return dict(self._dropped)

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` is kept; a kept record is marked with the rate and the counts."""
        if not super().filter(record):
            return True  # not this filter's logger: not its business
        if isinstance(record.msg, Mapping) and not record.args:
            return True
        if record.levelno >= logging.WARNING:
            self._mark(record, 1.0)
            return True
        trace_id = getattr(record, "trace_id", None)
        if not isinstance(trace_id, str) or not trace_id:
            trace_id = current_trace_id()
        if trace_id is not None:
            kept = keeps_trace(trace_id, self.rate)
        else:
            with self._lock:
                kept = self._random.random() < self.rate
        if kept:
            self._mark(record, self.rate)
            return True
        with self._lock:
            self._dropped[record.levelname] = self._dropped.get(record.levelname, 0) + 1
            self._snapshot = {}
        return False

    def _mark(self, record: logging.LogRecord, rate: float) -> None:
        before = getattr(record, RATE_ATTR, 1.0)
        setattr(record, RATE_ATTR, min(before, rate) if rate < 1.0 else before)
        with self._lock:
            if self._dropped and not self._snapshot:
                self._snapshot = dict(self._dropped)
            counts = self._snapshot
        if counts:
            setattr(record, SAMPLED_OUT_ATTR, counts)
