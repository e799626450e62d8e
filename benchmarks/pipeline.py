"""Pipeline benchmark: events/s through one worker, and command latency end to end.

Prints one JSON object per line:

- ``kafka_roundtrip``: produce -> consume latency of bare Kafka on the same broker
  (the floor under any pipeline latency), measured in this run as the baseline;
- ``worker_throughput``: a backlog of events (runs x ranks x steps, ``--metrics``
  metrics each) is produced first, then one worker is started; events/s is the backlog
  divided by the time from the worker joining its group to the last StepSummary;
- ``command_latency``: with the worker running, runs whose KL passes 0.3 for three
  steps are played one after another; latency is from the moment the last rank's
  event of the firing step was produced to the moment the kl-guard command is read
  from the control topic;
- ``latency_vs_kafka``: the ratio of the two latency medians.

Uses ``RLPULSE_BOOTSTRAP`` if set, otherwise starts (and stops) a local broker.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

from rlpulse.broker import bootstrap_or_local_broker
from rlpulse.kafka_admin import ensure_topics
from rlpulse.producers import EventLogger, ProducerConfig
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.worker_process import WorkerProcess


def emit(name: str, **fields: Any) -> None:
    print(json.dumps({"bench": "pipeline", "name": name, **fields}), flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def broker() -> AbstractContextManager[str]:
    return bootstrap_or_local_broker(Path(tempfile.mkdtemp(prefix="rlpulse-bench-")))


def consumer(bootstrap: str, topic: str) -> Consumer:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
    )
    c.subscribe([topic])
    return c


def kafka_roundtrip(bootstrap: str, samples: int) -> list[float]:
    topics = Topics(prefix=f"bench-rt-{uuid.uuid4().hex[:8]}")
    ensure_topics(bootstrap, topics, partitions=1)
    producer = Producer(ProducerConfig(bootstrap_servers=bootstrap).producer_settings())
    reader = consumer(bootstrap, topics.events)
    while not reader.assignment():
        reader.poll(0.1)
    latencies = []
    for i in range(samples):
        sent = time.perf_counter()
        producer.produce(topics.events, key=b"k", value=str(i).encode())
        producer.poll(0)
        while True:
            message = reader.poll(1.0)
            if message is not None and message.error() is None:
                latencies.append((time.perf_counter() - sent) * 1000)
                break
        time.sleep(0.01)
    producer.flush(10)
    reader.close()
    return latencies


def throughput(
    bootstrap: str, runs: int, ranks: int, steps: int, metrics: int, workdir: Path
) -> None:
    topics = Topics(prefix=f"bench-tp-{uuid.uuid4().hex[:8]}")
    ensure_topics(bootstrap, topics, partitions=6)
    config = ProducerConfig(bootstrap_servers=bootstrap, topic_prefix=topics.prefix)
    names = [f"metric_{i}" for i in range(metrics)]
    loggers = [
        EventLogger(f"run-{r}", rank=rank, world_size=ranks, config=config)
        for r in range(runs)
        for rank in range(ranks)
    ]
    for step in range(steps):
        for logger in loggers:
            logger.log({name: 0.1 * step for name in names}, step=step, stage="rollout")
    for logger in loggers:
        logger.close(timeout_s=60)
    events = runs * ranks * steps
    want = runs * steps
    reader = consumer(bootstrap, topics.steps)
    worker = WorkerProcess(bootstrap, topics.prefix, workdir / "tp-worker.log", partitions=6)
    worker.start()
    try:
        worker.wait_consuming(timeout_s=120)
        started = time.perf_counter()
        seen: set[str] = set()
        deadline = time.monotonic() + 600
        codec = default_codec()
        while len(seen) < want and time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is not None and message.error() is None:
                seen.add(codec.decode_summary(message.value() or b"")["summary_id"])
        elapsed = time.perf_counter() - started
    finally:
        worker.stop()
        reader.close()
    emit(
        "worker_throughput",
        events=events,
        summaries=len(seen),
        seconds=round(elapsed, 3),
        events_per_s=round(events / elapsed, 1),
        load={"runs": runs, "ranks": ranks, "steps": steps, "metrics_per_event": metrics},
        complete=len(seen) == want,
    )


def command_latency(bootstrap: str, samples: int, ranks: int, workdir: Path) -> list[float]:
    topics = Topics(prefix=f"bench-lat-{uuid.uuid4().hex[:8]}")
    ensure_topics(bootstrap, topics, partitions=6)
    config = ProducerConfig(bootstrap_servers=bootstrap, topic_prefix=topics.prefix)
    codec = default_codec()
    reader = consumer(bootstrap, topics.control)
    worker = WorkerProcess(bootstrap, topics.prefix, workdir / "lat-worker.log", partitions=6)
    worker.start()
    latencies: list[float] = []
    try:
        worker.wait_consuming(timeout_s=120)
        while not reader.assignment():
            reader.poll(0.1)
        for sample in range(samples):
            run_id = f"lat-{sample}"
            loggers = [
                EventLogger(run_id, rank=r, world_size=ranks, config=config) for r in range(ranks)
            ]
            for step in (1, 2, 3):
                for logger in loggers:
                    logger.log({"kl_divergence": 0.5}, step=step, stage="actor")
                if step < 3:
                    for logger in loggers:
                        logger.flush(10)
            produced = time.perf_counter()
            for logger in loggers:
                logger.flush(10)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                message = reader.poll(0.05)
                if message is None or message.error() is not None:
                    continue
                if codec.decode_command(message.value() or b"")["run_id"] == run_id:
                    latencies.append((time.perf_counter() - produced) * 1000)
                    break
            for logger in loggers:
                logger.close(10)
    finally:
        worker.stop()
        reader.close()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--metrics", type=int, default=8)
    parser.add_argument("--latency-samples", type=int, default=40)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rlpulse-bench-"))
    with broker() as bootstrap:
        baseline = kafka_roundtrip(bootstrap, samples=200)
        emit(
            "kafka_roundtrip",
            samples=len(baseline),
            p50_ms=round(statistics.median(baseline), 2),
            p99_ms=round(percentile(baseline, 99), 2),
        )
        throughput(bootstrap, args.runs, args.ranks, args.steps, args.metrics, workdir)
        latencies = command_latency(bootstrap, args.latency_samples, args.ranks, workdir)
        emit(
            "command_latency",
            samples=len(latencies),
            p50_ms=round(statistics.median(latencies), 2),
            p99_ms=round(percentile(latencies, 99), 2),
            load={"ranks": args.ranks, "runs": args.latency_samples, "note": "one run at a time"},
        )
        emit(
            "latency_vs_kafka",
            p50_ratio=round(statistics.median(latencies) / statistics.median(baseline), 1),
        )


if __name__ == "__main__":
    main()
