"""The line a worker says after each rebalance about the events partitions it holds."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from faust.types import TP

from rlpulse.streams.worker.held_partitions import HeldPartitionsLine, held_line


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Let the loop's other tasks run until ``condition()``; fail naming ``what`` after
    ``timeout_s`` (the line's tasks run on this loop: nothing here waits on the clock)."""

    async def polled() -> None:
        while not condition():
            await asyncio.sleep(0)

    try:
        await asyncio.wait_for(polled(), timeout_s)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def test_the_line_names_the_partitions_held_and_the_group() -> None:
    assert held_line([4, 0, 2], 6, "rlpulse-worker", 2) == (
        "holding events partitions 0, 2, 4 of 6 (group rlpulse-worker, 2 members)"
    )
    assert held_line([0], 1, "g", 1) == "holding events partition 0 of 1 (group g, 1 member)"
    assert held_line([1, 2], 3, "g", None) == "holding events partitions 1, 2 of 3 (group g)"


def test_a_worker_with_nothing_says_why_when_the_group_outnumbers_the_partitions() -> None:
    assert held_line([], 6, "rlpulse-worker", 7) == (
        "holding no events partition: the group rlpulse-worker has 7 members for 6 partitions; "
        "more workers than `worker.partitions` stay idle"
    )
    assert held_line([], 1, "g", 2).startswith(
        "holding no events partition: the group g has 2 members for 1 partition;"
    )
    # Not outnumbered (or the count unknown): no cause is claimed.
    assert held_line([], 6, "g", 3) == "holding no events partition of 6 (group g, 3 members)"
    assert held_line([], 6, "g", None) == "holding no events partition of 6 (group g)"


def test_one_line_per_rebalance_and_only_the_latest_of_two_quick_ones() -> None:
    said: list[str] = []
    answers: list[asyncio.Future[int | None]] = []

    async def members() -> int | None:
        answers.append(asyncio.get_running_loop().create_future())
        return await answers[-1]

    held = HeldPartitionsLine("p.events", 3, "p-worker", said.append, members)
    ticks, events = TP("p.ticks", 0), TP("p.events", 0)

    async def scenario() -> None:
        await held.on_assigned(None, {events, ticks, TP("p.events", 2)}, signal=None)
        await until(lambda: len(answers) == 1, "the first rebalance to ask for the member count")
        answers[0].set_result(1)
        await until(lambda: not held._pending, "the first rebalance's line")
        assert said == ["holding events partitions 0, 2 of 3 (group p-worker, 1 member)"]
        # Two rebalances before the count of the first came: the first is not said.
        await held.on_assigned(None, {events}, signal=None)
        await held.on_assigned(None, {ticks}, signal=None)
        await until(lambda: len(answers) == 3, "both rebalances to ask for the member count")
        answers[1].set_result(2)
        answers[2].set_result(4)
        await until(lambda: not held._pending, "both rebalances' lines (or their silence)")

    asyncio.run(scenario())
    assert said[1:] == [
        "holding no events partition: the group p-worker has 4 members for 3 partitions; "
        "more workers than `worker.partitions` stay idle"
    ]


def test_the_line_is_said_without_the_count_when_it_does_not_come() -> None:
    said: list[str] = []

    async def members() -> int | None:
        raise ConnectionError("coordinator gone")

    held = HeldPartitionsLine("p.events", 3, "p-worker", said.append, members)

    async def scenario() -> None:
        await held.on_assigned(None, {TP("p.events", 1)}, signal=None)
        await until(lambda: not held._pending, "the line without the count")

    asyncio.run(scenario())
    assert said == ["holding events partition 1 of 3 (group p-worker)"]
