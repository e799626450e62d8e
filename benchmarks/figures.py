"""What the benchmarks share: a figure printed as one JSON line, percentiles, a backlog."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from confluent_kafka import Producer

from rlpulse.schemas import default_codec


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


def encoded_events(
    label: str,
    runs: int,
    ranks: int,
    metrics: int,
    steps: Iterable[int],
    start_ns: int | None = None,
    step_s: float = 0.0,
) -> list[tuple[bytes, bytes]]:
    """(key, value) of every event of ``steps``, in the order trainers would send them.

    Runs ``<label>-<i>``; step ``i`` of ``steps`` carries ``timestamp_ns = start_ns + i *
    step_s`` (default: now).
    """
    codec = default_codec()
    names = [f"metric_{i}" for i in range(metrics)]
    first = time.time_ns() if start_ns is None else start_ns
    out = []
    for index, step in enumerate(steps):
        now = first + round(index * step_s * 1e9)
        for run in range(runs):
            run_id = f"{label}-{run}"
            for rank in range(ranks):
                event = {
                    "kind": "metrics",
                    "run_id": run_id,
                    "attempt": 0,
                    "step": step,
                    "stage": "rollout",
                    "rank": rank,
                    "world_size": ranks,
                    "metrics": {name: 0.1 * step + rank for name in names},
                    "tags": {},
                    "timestamp_ns": now,
                    "hostname": "bench",
                    "pid": 0,
                    "producer_id": f"{run_id}/{rank}",
                    "seq": step,
                }
                out.append((run_id.encode(), codec.encode("TrainerEvent", event)))
    return out
