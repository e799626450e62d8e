"""A faust consumer that keeps fetching while the agent's buffer is busy.

faust (faust-streaming 0.15.3) takes a partition out of its fetch set once the agent's
buffer of that partition's topic is 80 % full, and puts it back only when the buffer drains
to 40 %. A fetched chunk of events (tens of thousands under load) fills the buffer past 80 %
on every partition in turn, so the next fetch finds no partition to fetch from and the
fetch loop sleeps a fixed second (``Consumer._wait_next_records``) while the agent has long
emptied its buffer: a stall every few seconds, the cycle measured in issue 15.

:class:`SteadyConsumer` does not switch partitions off on a full buffer. Backpressure stays
where faust also has it: a message for a buffer that is completely full makes the fetcher
wait (``Conductor.on_message`` awaits the put) until the agent has taken one. Everything
else — offsets, commits, acks, rebalances — is faust's own. :func:`use_steady_consumer`
installs it on an app before its consumer is created.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

__all__ = ["SteadyConsumer", "SteadyTransport", "use_steady_consumer"]


class SteadyConsumer(faust_aiokafka.Consumer):
    """faust's aiokafka consumer, minus the partition switch-off on a busy buffer."""

    def on_buffer_full(self, tp: TP) -> None:
        """Keep fetching ``tp``: a full buffer blocks the fetcher by itself."""

    def on_buffer_drop(self, tp: TP) -> None:
        """Nothing was switched off, so nothing to switch back on."""


class SteadyTransport(faust_aiokafka.Transport):
    """faust's aiokafka transport with :class:`SteadyConsumer`."""

    Consumer = SteadyConsumer


def use_steady_consumer(app: faust.App) -> None:
    """Make ``app`` consume with :class:`SteadyConsumer` (call before the app starts)."""
    conf: Any = app.conf
    app.transport = SteadyTransport(conf.broker_consumer, app)
