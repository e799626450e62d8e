"""The worker's faust consumer: faust's aiokafka consumer, with three of its choices changed.

faust-streaming 0.15.3 (the version this is written against; the benchmark is its check):

- **Fetch wait.** faust asks the broker to hold a fetch that finds nothing new for a fixed
  1,500 ms, and aiokafka keeps one fetch in flight per broker. A fetch that asks only for
  partitions with nothing new (the ticks topic, while the events' records are still being
  handed over) then holds the next fetch of the events for up to that long.
  :class:`SteadyConsumer` passes ``worker.fetch_max_wait_s`` (50 ms) instead.
- **Stall checks on changelogs.** faust checks every assigned partition for a stream that
  stopped; a table's changelog is assigned but read by no stream, so a healthy idle worker
  would log an ERROR block per changelog partition every few seconds. Changelogs get only the
  fetch checks.
- **Switching partitions off on a busy buffer** (``worker.pause_on_busy_buffer``). faust
  takes a partition out of its fetch set once the agent's buffer of its topic is 80 % full
  and puts it back at 40 %; with every partition switched off, the fetch loop sleeps a fixed
  second. With the setting off, a full buffer still blocks the fetcher by itself
  (``Conductor.on_message`` awaits the put) until the agent has taken one.

Its transport changes one more: **topic creation past a dead broker**. faust declares each
of its topics at start-up (a restarted worker too, although they exist) by asking the first
broker of its cached metadata for the controller, and ends the worker when that broker does
not answer (``NodeNotReadyError``: a restart right after a broker died, within that broker's
session timeout). :class:`SteadyTransport` asks the known brokers in turn (aiokafka's
``fetch_all_metadata``) and retries a creation that met an unreachable broker, on fresh
metadata, for up to :data:`CREATE_TOPIC_RETRY_S`.

It also answers one question faust does not: how many members the consumer group has
(:meth:`SteadyConsumer.group_members`, one DescribeGroups request on the consumer's own
connection), for the line a worker prints after each rebalance
(:mod:`rlpulse.streams.worker.held_partitions`).

Everything else — offsets, commits, acks, rebalances — is faust's own.
:func:`use_faust_consumer` installs it on an app before its consumer is created.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import faust
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    NodeNotReadyError,
    RequestTimedOutError,
)
from aiokafka.protocol.admin import DescribeGroupsRequest
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP

__all__ = ["CREATE_TOPIC_RETRY_S", "SteadyConsumer", "SteadyTransport", "use_faust_consumer"]

log = logging.getLogger(__name__)

CREATE_TOPIC_RETRY_S: Final = 60.0
"""How long a topic's declaration is retried while brokers do not answer (a fail-over: 9 s)."""
_UNREACHABLE = (NodeNotReadyError, KafkaConnectionError, RequestTimedOutError, asyncio.TimeoutError)


class _FetchWaitThread(faust_aiokafka.AIOKafkaConsumerThread):
    """faust's consumer thread, with the broker's fetch wait of the consumer's setting."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        created = super()._create_worker_consumer(transport)
        # faust passes a fixed 1,500 ms; aiokafka keeps it until start() builds its Fetcher.
        if not hasattr(created, "_fetch_max_wait_ms"):
            raise RuntimeError(
                "this aiokafka keeps its fetch wait elsewhere: streams/faust_consumer.py "
                "is written against faust-streaming 0.15.3 and aiokafka 0.14.0"
            )
        consumer: Any = self.consumer
        created._fetch_max_wait_ms = consumer.fetch_max_wait_ms
        return created

    def verify_event_path(self, now: float, tp: TP) -> None:
        """Run faust's stall checks, without the stream checks on a table's changelog.

        No stream reads a changelog: the worker writes it, and its partitions stay assigned
        after recovery while their end moves on, so faust would log "Stream has not started
        processing" for each of them every few seconds from ``stream_processing_timeout`` on.
        The fetch checks still run for them.
        """
        app: Any = self.consumer.app
        if tp.topic in app.tables.changelog_topics:
            self._verify_aiokafka_event_path(now, tp)
            return
        super().verify_event_path(now, tp)

    async def group_members(self) -> int | None:
        """The members of the consumer's group, from its coordinator (run in this thread).

        None while the coordinator is unknown, or when it answers with an error.
        """
        consumer: Any = self._ensure_consumer()
        coordinator_id = getattr(consumer._coordinator, "coordinator_id", None)
        if coordinator_id is None:
            return None
        group: str = self.consumer.app.conf.id
        response: Any = await consumer._client.send(
            coordinator_id, DescribeGroupsRequest(groups=[group])
        )
        for error_code, name, _state, _protocol_type, _protocol, members, *_ in response.groups:
            if name == group:
                return None if error_code else len(members)
        return None


class SteadyConsumer(faust_aiokafka.Consumer):
    """faust's aiokafka consumer with a short fetch wait, and optionally no switch-off."""

    fetch_max_wait_ms = 1500
    """How long the broker may hold a fetch that found no data (faust's fixed value)."""
    pause_on_busy_buffer = True
    """faust's flow control: stop fetching a partition whose buffer is 80 % full."""
    before_wait_empty: Callable[[], Awaitable[None]] | None = None
    """Awaited before faust waits for every delivered event to be acked (rebalance, stop)."""

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return _FetchWaitThread(self, loop=self.loop, beacon=self.beacon)

    async def wait_empty(self) -> None:
        """Let the agent finish what it holds (``before_wait_empty``), then faust's wait."""
        if self.before_wait_empty is not None:
            await self.before_wait_empty()
        await super().wait_empty()

    async def group_members(self) -> int | None:
        """How many members the worker's consumer group has now (None: unknown).

        One DescribeGroups request to the group's coordinator, asked by the consumer's thread
        on its own connection: no client of its own.
        """
        thread: Any = self._thread
        members: int | None = await thread.call_thread(thread.group_members)
        return members

    def on_buffer_full(self, tp: TP) -> None:
        """Switch ``tp`` off (faust), or keep fetching it: a full buffer blocks the fetcher."""
        if self.pause_on_busy_buffer:
            super().on_buffer_full(tp)

    def on_buffer_drop(self, tp: TP) -> None:
        """Switch ``tp`` back on, if it was switched off."""
        if self.pause_on_busy_buffer:
            super().on_buffer_drop(tp)


class SteadyTransport(faust_aiokafka.Transport):
    """faust's aiokafka transport, whose topic creation outlasts a dead broker."""

    async def _get_controller_node(
        self, owner: Any, client: Any, timeout: int = 30000
    ) -> int | None:
        """The controller's id, from the first known broker that answers (faust: the first)."""
        try:
            metadata = await client.fetch_all_metadata()  # tries each known broker
        except KafkaError as exc:
            raise NodeNotReadyError(f"no broker answered for the controller: {exc}") from exc
        controller = metadata.controller
        return None if controller is None else int(controller.nodeId)

    async def _really_create_topic(
        self,
        owner: Any,
        client: Any,
        topic: str,
        partitions: int,
        replication: int,
        **kwargs: Any,
    ) -> None:
        deadline = time.monotonic() + CREATE_TOPIC_RETRY_S
        while True:
            try:
                await super()._really_create_topic(
                    owner, client, topic, partitions, replication, **kwargs
                )
                return
            except _UNREACHABLE as exc:
                if time.monotonic() >= deadline:
                    raise
                log.warning("creating topic %s: %r; retrying on fresh metadata", topic, exc)
            await asyncio.sleep(1.0)
            await client.force_metadata_update()


def use_faust_consumer(
    app: faust.App,
    *,
    fetch_max_wait_s: float,
    pause_on_busy_buffer: bool,
    before_wait_empty: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Make ``app`` consume with a :class:`SteadyConsumer` (call before the app starts).

    ``before_wait_empty`` is awaited each time faust is about to wait until every event it
    delivered is acked (at a rebalance and at stop).
    """
    consumer = type(
        "WorkerConsumer",
        (SteadyConsumer,),
        {
            "fetch_max_wait_ms": max(1, round(fetch_max_wait_s * 1000)),
            "pause_on_busy_buffer": pause_on_busy_buffer,
            "before_wait_empty": staticmethod(before_wait_empty) if before_wait_empty else None,
        },
    )
    transport = type("WorkerTransport", (SteadyTransport,), {"Consumer": consumer})
    conf: Any = app.conf
    app.transport = transport(conf.broker_consumer, app)
