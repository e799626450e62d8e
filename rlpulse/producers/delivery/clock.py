"""The host's clock against the brokers': measured by the agent from its own deliveries.

The events and logs topics stamp each record with the broker's clock (``LogAppendTime``). A
message produced at this host's time ``t0`` whose delivery report arrived at ``t1`` was
appended at broker time ``b``, somewhere between the two, so the host's clock is behind the
broker's by ``b - (t0 + t1) / 2``, give or take half the round trip. :class:`ClockOffset`
keeps, of the samples of the last :data:`WINDOW_S`, the one with the shortest round trip.

The agent sends the estimate with every message it sends, in the
:data:`~rlpulse.schemas.clock.CLOCK_HEADER` header (``<offset ns>/<error ns>``): readers
order one step's records from several hosts by ``timestamp_ns + offset``
(:func:`~rlpulse.schemas.clock.corrected_ns`), which is the broker's clock for all of them.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Final

from rlpulse.schemas.clock import CLOCK_HEADER

__all__ = ["CLOCK_HEADER", "WINDOW_S", "ClockOffset"]

WINDOW_S: Final = 300.0
"""How far back the samples reach: a clock that drifts is followed within this time."""
_MAX_SAMPLES: Final = 256


class ClockOffset:
    """The host's clock offset against the brokers', from delivery round trips."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self._window_ns = int(window_s * 1e9)
        self._samples: deque[tuple[int, int, int]] = deque(maxlen=_MAX_SAMPLES)
        self._lock = threading.Lock()  # the reports of both producers come on two threads
        self.offset_ns: int | None = None
        """Add this to the host's time to get the brokers' (None: no sample yet)."""
        self.error_ns: int | None = None
        """Half the round trip of the sample the offset comes from: the offset's bound."""
        self.header: bytes | None = None
        """The value of :data:`CLOCK_HEADER` (None: no estimate yet)."""

    def sample(self, sent_ns: int, reported_ns: int, broker_ms: int) -> None:
        """Take one delivery's round trip into the estimate.

        Produced at ``sent_ns``, reported at ``reported_ns`` (the host's clock), appended at
        ``broker_ms`` (the broker's clock, milliseconds).
        """
        if broker_ms <= 0 or reported_ns < sent_ns:
            return
        round_trip = reported_ns - sent_ns
        offset = broker_ms * 1_000_000 + 500_000 - (sent_ns + reported_ns) // 2
        with self._lock:
            samples = self._samples
            samples.append((reported_ns, round_trip, offset))
            while samples and samples[0][0] < reported_ns - self._window_ns:
                samples.popleft()
            _at, best_trip, best_offset = min(samples, key=lambda found: found[1])
        error = best_trip // 2 + 500_000  # the broker's millisecond adds half of one
        if best_offset != self.offset_ns or error != self.error_ns:
            self.offset_ns, self.error_ns = best_offset, error
            self.header = f"{best_offset}/{error}".encode()
