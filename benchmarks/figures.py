"""What the benchmarks share: a figure printed as one JSON line, percentiles, a backlog."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from confluent_kafka import Producer


def printer(bench: str) -> Callable[..., None]:
    """A function that prints ``{"bench": bench, "name": name, **fields}`` as one line."""

    def emit(name: str, **fields: Any) -> None:
        print(json.dumps({"bench": bench, "name": name, **fields}), flush=True)

    return emit


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0-100) of ``values``, which need not be sorted."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def produce_all(producer: Producer, topic: str, messages: Iterable[tuple[bytes, bytes]]) -> None:
    """Produce every ``(key, value)`` to ``topic``, waiting out a full queue; then flush."""
    for key, value in messages:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(120)
    if remaining:
        raise RuntimeError(f"{remaining} messages of the backlog were not delivered in 120 s")
