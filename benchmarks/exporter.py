"""Exporter benchmark: ingest rate against a bare decoding consumer, and scrape cost at scale.

Prints one JSON object per line, all measured in the same run on the same broker:

- ``bare_consumer_throughput``: a backlog of TrainerEvents (runs x ranks x steps, ``--metrics``
  metrics each, produced with the trainers' producer settings) read by a confluent-kafka
  consumer that only decodes them, batch by batch (the ceiling: Kafka fetch plus Avro decode);
  events/s is the backlog over the time from its first ``consume`` call to its last decode;
- ``exporter_throughput``: the same backlog read by the exporter's own reader and state
  (:class:`~rlpulse.streams.exporter.server.Exporter`'s loop, as the process runs it), from
  the start of its loop until it has applied every event;
- ``exporter_vs_bare``: the ratio of the two rates (target: >= 0.7); both are the median of
  ``--rounds`` alternating runs over the same backlog;
- ``scrape``: ``rlpulse exporter`` as a process holding ``--scrape-ranks`` ranks x
  ``--scrape-metrics`` metrics (20,000 series by default); ``--scrapes`` GETs of /metrics as
  plain text and as Prometheus asks for it (OpenMetrics, gzip): milliseconds p50/p90/max and
  bytes, and the exporter's resident memory before and after the series arrived
  (target: a scrape under 250 ms);
- ``targets``: each target of issue 11 and whether this run met it.

``--profile`` runs only the exporter ingest, under cProfile, and prints its 30 most expensive
functions. Uses ``RLPULSE_BOOTSTRAP`` if set, otherwise starts (and stops) a local broker.
"""

from __future__ import annotations

import argparse
import cProfile
import gzip
import io
import pstats
import shutil
import statistics
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from figures import encoded_events, printer, produce_all

from rlpulse.local.broker import bootstrap_or_local_broker
from rlpulse.local.child_process import free_port
from rlpulse.local.exporter_process import ExporterProcess
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.streams.exporter.server import Exporter
from rlpulse.transport.clients import trainer_producer
from rlpulse.transport.readiness import Deadline
from rlpulse.transport.topics import delete_topics, ensure_topics

PARTITIONS = 6
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


emit = printer("exporter")


def fresh_topics(bootstrap: str, label: str) -> tuple[Settings, Topics]:
    topics = Topics(prefix=f"bench-exp-{label}-{uuid.uuid4().hex[:6]}")
    settings = Settings(bootstrap=bootstrap, prefix=topics.prefix)
    ensure_topics(settings, topics, partitions=PARTITIONS)
    return settings, topics


def bare_consumer(settings: Settings, topic: str, expect: int) -> float:
    """Seconds a consumer that only decodes takes to read ``expect`` events."""
    codec = default_codec()
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    decoded = 0
    started = time.perf_counter()
    while decoded < expect:
        for message in consumer.consume(1000, 0.2):
            if message.error() is None:
                codec.decode_event(message.value() or b"")
                decoded += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


class Applied(threading.Event):
    """A stop "event" that is set once the exporter has applied ``expect`` events."""

    def __init__(self, exporter: Exporter, expect: int) -> None:
        super().__init__()
        self.messages = exporter.state.messages  # read by the loop's own thread
        self.expect = expect

    def is_set(self) -> bool:
        return self.messages["events"] >= self.expect


def exporter_ingest(settings: Settings, expect: int, profile: cProfile.Profile | None) -> float:
    """Seconds the exporter's loop takes to apply ``expect`` events of its lookback."""
    settings = settings.updated({"exporter.lookback_s": 3600, "exporter.port": 0})
    exporter = Exporter(settings)
    exporter.reader.assign(Deadline(60))
    if profile is not None:
        profile.enable()
    started = time.perf_counter()
    exporter.run(Applied(exporter, expect))
    elapsed = time.perf_counter() - started
    if profile is not None:
        profile.disable()
    exporter.reader.close()
    return elapsed


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def timed_get(url: str, headers: dict[str, str]) -> tuple[float, int]:
    request = urllib.request.Request(url, headers=headers)
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
    elapsed = (time.perf_counter() - started) * 1000
    if response.headers.get("Content-Encoding") == "gzip":
        assert gzip.GzipFile(fileobj=io.BytesIO(body)).read()
    return elapsed, len(body)


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered), 1),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 1),
        "max_ms": round(ordered[-1], 1),
    }


def scrape_at_scale(bootstrap: str, ranks: int, metrics: int, scrapes: int) -> dict[str, Any]:
    """Scrape cost and memory of an exporter process holding ranks x metrics series."""
    settings, topics = fresh_topics(bootstrap, "scrape")
    workdir = Path(tempfile.mkdtemp(prefix="rlpulse-bench-exporter-"))
    exporter = ExporterProcess(
        bootstrap,
        topics.prefix,
        workdir / "exporter.log",
        free_port(),
        namespace="verl",
        extra_args=("--max-series", str(2 * ranks * metrics)),
    )
    try:
        exporter.start().wait_ready()
        assert exporter.process is not None
        rss_empty = rss_mib(exporter.process.pid)
        produce_all(
            trainer_producer(settings, "benchmark load"),
            topics.events,
            encoded_events("scrape", 1, ranks, metrics, range(2)),
        )
        want = ranks * metrics
        deadline = time.monotonic() + 120
        while exporter.value("rlpulse_exporter_series") != want:
            assert time.monotonic() < deadline, "the exporter never held every series"
            time.sleep(0.5)
        time.sleep(1.0)  # the last step's values are in
        plain, prometheus = [], []
        for _ in range(scrapes):  # alternating, so that other load hits both alike
            plain.append(timed_get(exporter.url, {}))
            asked = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
            prometheus.append(timed_get(exporter.url, asked))
        return {
            "series": want,
            "ranks": ranks,
            "metrics_per_rank": metrics,
            "scrapes": scrapes,
            "text": {**summary([t for t, _ in plain]), "bytes": plain[-1][1]},
            "openmetrics_gzip": {**summary([t for t, _ in prometheus]), "bytes": prometheus[-1][1]},
            "exporter_rss_mib_empty": rss_empty,
            "exporter_rss_mib": rss_mib(exporter.process.pid),
        }
    finally:
        exporter.stop()
        shutil.rmtree(workdir, ignore_errors=True)
        delete_topics(settings, list(topics.all()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--metrics", type=int, default=8)
    parser.add_argument("--scrape-ranks", type=int, default=1000)
    parser.add_argument("--scrape-metrics", type=int, default=20)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="bare/exporter rounds (median)")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    settings = Settings()
    with bootstrap_or_local_broker(settings, settings.home / "bench-broker") as bootstrap:
        settings, topics = fresh_topics(bootstrap, "ingest")
        backlog = encoded_events("ingest", args.runs, args.ranks, args.metrics, range(args.steps))
        produce_all(trainer_producer(settings, "benchmark load"), topics.events, backlog)
        load = {
            "events": len(backlog),
            "runs": args.runs,
            "ranks": args.ranks,
            "metrics_per_event": args.metrics,
        }
        if args.profile:
            profile = cProfile.Profile()
            elapsed = exporter_ingest(settings, len(backlog), profile)
            emit("exporter_throughput", events_per_s=round(len(backlog) / elapsed), **load)
            pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
            delete_topics(settings, list(topics.all()))
            return
        # Alternating rounds, medians: the machine's other load moves both alike.
        rounds = [
            (
                bare_consumer(settings, topics.events, len(backlog)),
                exporter_ingest(settings, len(backlog), None),
            )
            for _ in range(args.rounds)
        ]
        bare_s = statistics.median(b for b, _ in rounds)
        exporter_s = statistics.median(e for _, e in rounds)
        bare, ingest = len(backlog) / bare_s, len(backlog) / exporter_s
        emit("bare_consumer_throughput", events_per_s=round(bare), seconds=round(bare_s, 2), **load)
        seconds = round(exporter_s, 2)
        emit("exporter_throughput", events_per_s=round(ingest), seconds=seconds, **load)
        ratio = round(ingest / bare, 2)
        round_ratios = [round(b / e, 2) for b, e in rounds]
        emit("exporter_vs_bare", ratio=ratio, rounds=args.rounds, round_ratios=round_ratios)
        delete_topics(settings, list(topics.all()))
        scrape = scrape_at_scale(bootstrap, args.scrape_ranks, args.scrape_metrics, args.scrapes)
        emit("scrape", **scrape)
        slowest = max(scrape["text"]["p50_ms"], scrape["openmetrics_gzip"]["p50_ms"])
        emit(
            "targets",
            ingest_vs_bare={"target": 0.7, "measured": ratio, "met": ratio >= 0.7},
            scrape_ms={"target": 250, "measured_p50": slowest, "met": slowest < 250},
        )


if __name__ == "__main__":
    main()
