"""The worker's write-behind table views and their ordered flush (a real faust Table, no broker).

A faust Table over the memory store needs no broker until the app starts; what leaves the
view goes to an :class:`Outbox`-shaped recorder, so the test sees exactly which changelog
records a batch sends, in which order, and when each stage waits for the one before.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import faust
import pytest
from faust.serializers import codecs

from rlpulse.streams.worker.state_codec import CODEC_NAME, register_state_codec
from rlpulse.streams.worker.write_behind import SourcePartition, WriteBehind, flush_in_order


class RecordingOutbox:
    """Records each send; every send's delivery completes only when the test says so."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, int | None]] = []
        self.deliveries: list[asyncio.Future[Any]] = []

    async def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[Any]:
        self.sent.append((topic, key, value, partition))
        delivery: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.deliveries.append(delivery)
        return delivery

    def deliver_all(self) -> None:
        for delivery in self.deliveries:
            if not delivery.done():
                delivery.set_result(None)


def table(app: faust.App, name: str) -> Any:
    created: Any = app.Table(name, partitions=3)
    created.key_serializer = created.value_serializer = register_state_codec()
    return created


@pytest.fixture
def app() -> faust.App:
    return faust.App(
        "unit-write-behind", broker="kafka://127.0.0.1:1", store="memory://", autodiscover=False
    )


def decoded(value: bytes | None) -> Any:
    return None if value is None else json.loads(value)


def test_each_changed_key_goes_to_its_changelog_once_with_its_latest_value(
    app: faust.App,
) -> None:
    outbox = RecordingOutbox()
    source = SourcePartition()
    view = WriteBehind(table(app, "groups"), outbox, source)  # type: ignore[arg-type]
    source.number = 2
    view["a"] = {"n": 1}
    view["a"] = {"n": 2}
    view["b"] = {"n": 1}
    del view["b"]
    source.number = 0  # the next message's partition: its own keys
    view["c"] = {"n": 1}
    assert (view["a"], view.get("b"), "c" in view, len(view)) == ({"n": 2}, None, True, 2)
    assert view.dirty

    async def flush() -> None:
        await view.flush()

    asyncio.run(flush())
    sent = {(key, partition): decoded(value) for _topic, key, value, partition in outbox.sent}
    assert {topic for topic, *_ in outbox.sent} == {"unit-write-behind-groups-changelog"}
    assert sent == {
        (codecs.dumps(CODEC_NAME, "a"), 2): {"n": 2},
        (codecs.dumps(CODEC_NAME, "b"), 2): None,  # deleted: a tombstone, at its partition
        (codecs.dumps(CODEC_NAME, "c"), 0): {"n": 1},
    }
    assert not view.dirty
    outbox.sent.clear()
    asyncio.run(flush())
    assert outbox.sent == []  # nothing changed since


def test_flush_in_order_waits_for_each_stage_before_sending_the_next(app: faust.App) -> None:
    outbox = RecordingOutbox()
    source = SourcePartition()
    first = WriteBehind(table(app, "rule-state"), outbox, source)  # type: ignore[arg-type]
    second = WriteBehind(table(app, "joiner-groups"), outbox, source)  # type: ignore[arg-type]
    last = WriteBehind(table(app, "joiner-stages"), outbox, source)  # type: ignore[arg-type]
    for view in (first, second, last):
        view["k"] = {"v": 1}

    async def settle() -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    async def scenario() -> list[list[str]]:
        flushing = asyncio.ensure_future(flush_in_order([first], [second], [last]))
        seen = []
        for _ in range(2):
            await settle()
            seen.append([topic for topic, *_ in outbox.sent])
            outbox.deliver_all()  # the broker confirms what was sent so far
        await flushing  # returns once the last stage is sent, without waiting for it
        seen.append([topic for topic, *_ in outbox.sent])
        return seen

    snapshots = asyncio.run(scenario())
    names = [
        "unit-write-behind-rule-state-changelog",
        "unit-write-behind-joiner-groups-changelog",
        "unit-write-behind-joiner-stages-changelog",
    ]
    assert snapshots == [names[:1], names[:2], names]  # each stage waits for the one before
    # the last stage is only sent: faust flushes the producer before it commits
    assert not outbox.deliveries[-1].done()


def test_state_codec_keeps_nan_and_infinities() -> None:
    register_state_codec()
    register_state_codec()  # idempotent
    window = {"values": [1.5, math.nan, math.inf, -math.inf], "n": 3}
    data = codecs.dumps(CODEC_NAME, window)
    assert data == b'{"values":[1.5,NaN,Infinity,-Infinity],"n":3}'  # compact, stdlib JSON
    back = codecs.loads(CODEC_NAME, data)
    assert back["values"][0] == 1.5 and math.isnan(back["values"][1])
    assert back["values"][2:] == [math.inf, -math.inf] and back["n"] == 3
