"""What logs cost and how fast they are archived and indexed: issue 22's (a)-(e), issue 23's (f).

(a) ``logger.info("step %s loss %s", ...)`` through rlpulse's ``EventHandler`` (broker up)
    against the same call through a ``logging.FileHandler``, a ``QueueHandler`` feeding a
    ``FileHandler`` on a ``QueueListener`` thread, and OpenTelemetry's ``LoggingHandler``
    with a ``BatchLogRecordProcessor`` (in-memory exporter; left out without the SDK):
    p50/p99 per call, in µs, the best of interleaved rounds. Target: rlpulse p50 at most 1.0x
    the FileHandler's.
(b) A CPU training loop (a small torch MLP) with rlpulse against the same loop without it
    (the log calls go to a ``NullHandler``), at two loads: the seed-like one (20 metrics and
    100 records a step of ~0.1 s with one torch thread, ~60 ms with two) and a realistic one
    (a step of ~1 s, 20 metrics, 200 records), each with 1 and 2 torch threads: percent
    slower, median step time over interleaved rounds (which of the two loops goes first
    alternates), with each round's figure so that the noise shows; and the CPU time per step
    rlpulse costs in the training process (its process CPU less the bare loop's) and in the
    host's agent (the agent process's CPU over the rounds, per step), in ms. Targets: under
    3 % at the seed-like load, under 1 % at the realistic one.
(c) Draining a backlog of log records (in LogBatch messages, as trainers send them): one
    archiver process against a bare confluent-kafka consumer that only decodes the same
    batches (each its own process). Rates are records/s between 10 % and 90 % of the
    backlog (steady state, without start-up). Targets: one archiver >= 100,000 records/s
    and >= 0.7 of the bare consumer.
(d) End to end: two producer processes log at a fixed total rate for ``--seconds``, one
    archiver writes Parquet; per rate, the archive's lag (records logged by then, less
    records in Parquet files) early and late. Target: 150,000 records/s with the lag flat.
    ``--idle-partitions N``: then the same again once the broker holds N more partitions,
    never written (a shared cluster holds thousands).
(e) The write-ahead log's cost per call: ``WalWriter.append`` of a typical record's entry
    alone, and ``log_record()`` whole, p50/p99 in µs.
(f) Indexing a backlog of log records into OpenSearch: one ``rlpulse index`` process from
    Kafka, records/s between 10 % and 90 % of the backlog (counted by ``_count``), against
    OpenSearch's own ``_bulk`` API fed the same documents, already built, in requests of the
    same size by one bare client. Target: the indexer >= 0.7 of the bare client. Uses
    ``RLPULSE_OPENSEARCH_URL``, else starts a node.

Prints one JSON object per line (``"bench": "logs"``). Needs torch for (b). Starts its own
Kafka broker unless ``RLPULSE_BOOTSTRAP`` is set. ``--profile`` prints where one archiver
spends its time draining (cProfile, top functions) to stderr.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import logging.handlers
import os
import pstats
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from figures import percentile, printer
from opensearchpy import OpenSearch

from rlpulse.archive.store import ArchiveStore
from rlpulse.archive.tables import tables_of
from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.local.broker import bootstrap_or_local_broker
from rlpulse.local.opensearch import local_search_or_url, request_json
from rlpulse.producers import EventHandler, EventLogger, Settings
from rlpulse.producers.delivery.agent_place import read_json
from rlpulse.producers.delivery.wal import LOG, LogMeta, WalWriter
from rlpulse.producers.encoding.fields import LogFields, RecordSource
from rlpulse.producers.encoding.logs import LogEncoder
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.settings import load_settings
from rlpulse.streams.indexer.documents import IndexNames, log_batch_documents
from rlpulse.streams.indexer.template import templates
from rlpulse.transport.clients import new_consumer
from rlpulse.transport.topics import ensure_topics

PARTITIONS = 6


emit = printer("logs")
LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def quiet_logger(name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers.clear()
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


# -- (a) ----------------------------------------------------------------------------------


def per_call(logger: logging.Logger, calls: int) -> dict[str, float]:
    for step in range(1000):  # warm up (rlpulse starts its producer on the first record)
        logger.info("step %s loss %s", step, 0.5)
    samples = []
    clock = time.perf_counter_ns
    for step in range(calls):
        start = clock()
        logger.info("step %s loss %s", step, 0.5)
        samples.append(clock() - start)
    samples.sort()
    return {
        "calls": calls,
        "p50_us": percentile(samples, 50) / 1e3,
        "p99_us": percentile(samples, 99) / 1e3,
        "mean_us": statistics.fmean(samples) / 1e3,
    }


def queue_to_file(path: Path) -> tuple[logging.Handler, Callable[[], None]]:
    """A ``QueueHandler`` whose ``QueueListener`` thread writes to a ``FileHandler``."""
    target = logging.FileHandler(path)
    target.setFormatter(logging.Formatter(LINE_FORMAT))
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(records, target)
    listener.start()

    def stop() -> None:
        listener.stop()
        target.close()

    return logging.handlers.QueueHandler(records), stop


def opentelemetry_batch() -> tuple[logging.Handler, Callable[[], None]] | None:
    """OpenTelemetry's ``LoggingHandler`` with a ``BatchLogRecordProcessor`` (None: no SDK)."""
    try:
        from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
        from opentelemetry.sdk._logs.export import (
            BatchLogRecordProcessor,
            InMemoryLogRecordExporter,
        )
    except ImportError:
        return None
    provider = LoggerProvider()
    exporter = InMemoryLogRecordExporter()  # type: ignore[no-untyped-call]
    provider.add_log_record_processor(BatchLogRecordProcessor(exporter))
    return LoggingHandler(logger_provider=provider), provider.shutdown


def bench_call_cost(settings: Settings, work: Path, calls: int) -> None:
    """(a): one call's cost through each handler, interleaved rounds, the best round each."""
    results: dict[str, list[dict[str, float]]] = {}
    delivered = logged = 0
    for round_ in range(2):  # interleaved, twice: the machine is shared
        file_logger = quiet_logger("bench.file")
        handler = logging.FileHandler(work / f"plain-{round_}.log")
        handler.setFormatter(logging.Formatter(LINE_FORMAT))
        file_logger.addHandler(handler)
        results.setdefault("file", []).append(per_call(file_logger, calls))
        handler.close()
        others = [("queue_file", queue_to_file(work / f"queued-{round_}.log"))]
        otel = opentelemetry_batch()
        if otel is not None:
            others.append(("opentelemetry_batch", otel))
        for name, (other, stop) in others:
            other_logger = quiet_logger(f"bench.{name}")
            other_logger.addHandler(other)
            results.setdefault(name, []).append(per_call(other_logger, calls))
            stop()
        with EventLogger(f"bench-{uuid.uuid4().hex[:6]}", settings=settings) as events:
            rl_logger = quiet_logger("bench.rlpulse")
            rl_logger.addHandler(EventHandler(events))
            results.setdefault("rlpulse", []).append(per_call(rl_logger, calls))
            events.flush(60)
            delivered, logged = events.delivered, events.logged
    best = {name: min(runs, key=lambda r: r["p50_us"]) for name, runs in results.items()}
    emit("a_file_handler", **best["file"])
    emit("a_queue_handler_to_file", **best["queue_file"])
    if "opentelemetry_batch" in best:
        emit("a_opentelemetry_batch", **best["opentelemetry_batch"])
    emit("a_rlpulse_handler", **best["rlpulse"], delivered=delivered, logged=logged)
    ratio = best["rlpulse"]["p50_us"] / best["file"]["p50_us"]
    emit(
        "a_target",
        rlpulse_over_file_p50=round(ratio, 2),
        rlpulse_over_file_p99=round(best["rlpulse"]["p99_us"] / best["file"]["p99_us"], 2),
        target="rlpulse p50 <= 1.0 x FileHandler p50",
        met=ratio <= 1.0,
    )


# -- (b) ----------------------------------------------------------------------------------


LOADS = {
    # name: (batch rows: sets a step's compute, records per step, target overhead %)
    "seed_like": (1280, 100, 2.0),
    "realistic": (12800, 200, 1.0),
}
"""(b)'s loads: the seed-like one of docs/logs.md (a step of ~0.1 s with one torch thread),
and a realistic one of about a step a second (20 metrics each; the step's compute grows with
the batch)."""


def bench_training_loop(
    settings: Settings, steps: int, rounds: int, threads_list: list[int], loads: list[str]
) -> None:
    try:
        import torch
    except ImportError as exc:
        emit("b_training_loop", error=f"torch is not installed ({exc})")
        return
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
        torch.nn.ReLU(), torch.nn.Linear(1024, 512),
    )  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def loop(
        logger: logging.Logger,
        log: Callable[[dict[str, float], int], None],
        data: Any,
        records: int,
    ) -> list[float]:
        times = []
        for step in range(steps):
            start = time.perf_counter()
            loss = model(data).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            value = loss.item()
            log({f"metric_{i:02d}": value + i for i in range(20)}, step)
            for number in range(records):
                logger.info("step %d micro-batch %d loss %.4f", step, number, value)
            times.append(time.perf_counter() - start)
        return times

    def bare_loop(data: Any, records: int) -> list[float]:
        bare = quiet_logger("bench.loop.bare")
        bare.addHandler(logging.NullHandler())
        return loop(bare, lambda metrics, step: None, data, records)[2:]

    def rlpulse_loop(data: Any, records: int) -> list[float]:
        with EventLogger(f"bench-{uuid.uuid4().hex[:6]}", settings=settings) as events:
            traced = quiet_logger("bench.loop.rlpulse")
            traced.addHandler(EventHandler(events))
            times = loop(traced, lambda m, s: events.log(m, s, "trainer"), data, records)
            events.flush(60)
        return times[2:]

    def timed(run: Callable[[], list[float]], cpu: list[float]) -> list[float]:
        """``run()``, adding the process CPU seconds it took to ``cpu``."""
        began = time.process_time()
        times = run()
        cpu.append(time.process_time() - began)
        return times

    agent = running_agent(settings)

    for load in loads:
        rows, records, target = LOADS[load]
        data = torch.randn(rows, 512)
        for threads in threads_list:
            torch.set_num_threads(threads)
            bare_times: list[float] = []
            rlpulse_times: list[float] = []
            per_round: list[float] = []
            bare_cpu: list[float] = []
            rl_cpu: list[float] = []
            agent_cpu = 0.0
            for number in range(rounds):
                agent_before = cpu_seconds(agent)
                bare = partial(bare_loop, data, records)
                traced = partial(rlpulse_loop, data, records)
                if number % 2 == 0:
                    bare_round, rl_round = timed(bare, bare_cpu), timed(traced, rl_cpu)
                else:
                    rl_round, bare_round = timed(traced, rl_cpu), timed(bare, bare_cpu)
                agent_cpu += cpu_seconds(agent) - agent_before
                bare_times += bare_round
                rlpulse_times += rl_round
                per_round.append(
                    (statistics.median(rl_round) / statistics.median(bare_round) - 1) * 100
                )
            bare_ms = statistics.median(bare_times) * 1e3
            rl_ms = statistics.median(rlpulse_times) * 1e3
            overhead = (rl_ms / bare_ms - 1) * 100
            all_steps = rounds * steps  # the CPU figures cover every step, the first two too
            emit(
                "b_training_loop",
                load=load,
                steps=len(bare_times),
                records_per_step=records,
                metrics_per_step=20,
                torch_threads=threads,
                bare_step_ms=round(bare_ms, 2),
                rlpulse_step_ms=round(rl_ms, 2),
                overhead_percent=round(overhead, 2),
                rounds_overhead_percent=[round(o, 2) for o in per_round],
                training_process_cpu_ms_per_step=round(
                    (sum(rl_cpu) - sum(bare_cpu)) * 1e3 / all_steps, 3
                ),
                agent_cpu_ms_per_step=round(agent_cpu * 1e3 / all_steps, 3),
                target=f"< {target:g} %",
                met=overhead < target,
            )


def running_agent(settings: Settings) -> int:
    """The pid of the host's agent for ``settings``, started (and waited for) by a logger."""
    with EventLogger(f"bench-{uuid.uuid4().hex[:6]}", settings=settings) as events:
        events.log({"warm": 1.0}, 0)
        assert events.flush(60) == 0, "the host's agent sent nothing in 60 s"
        place = events.agent
    assert place is not None
    pid = (read_json(place.info) or {}).get("pid")
    assert isinstance(pid, int)
    return pid


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds process ``pid`` used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- (c) and (d): backlogs, archivers ------------------------------------------------------


def fill_backlog(settings: Settings, records: int, runs: int = 12) -> None:
    loggers = [
        EventLogger(f"backlog-{n}-{uuid.uuid4().hex[:4]}", settings=settings) for n in range(runs)
    ]
    for number in range(records):
        loggers[number % runs].log_record(
            "INFO", 20, "trainer.rollout", f"step {number // 100} sample {number} reward 0.25"
        )
    for logger in loggers:
        logger.close(timeout_s=120)


class ArchivedRecords:
    """Records in the archive's Parquet files of one topic (each file's row count read once)."""

    def __init__(self, store: ArchiveStore, topic: str) -> None:
        self.store = store
        self.topic = topic
        self._rows: dict[str, int] = {}

    def __call__(self) -> int:
        for path, _name in self.store.files(self.topic):
            if path not in self._rows:
                self._rows[path] = pq.read_metadata(path).num_rows
        return sum(self._rows.values())


def steady_rate(progress: Callable[[], int], total: int, timeout_s: float) -> float:
    """Records/s between 10 % and 90 % of ``total``, watching ``progress()``."""
    marks: dict[float, float] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = progress()
        for share in (0.1, 0.9):
            if share not in marks and done >= share * total:
                marks[share] = time.monotonic()
        if 0.9 in marks:
            return 0.8 * total / (marks[0.9] - marks[0.1])
        time.sleep(0.05)
    raise TimeoutError(f"only {progress()} of {total} records after {timeout_s:.0f} s")


def flushed_rate(progress: Callable[[], int], total: int, timeout_s: float) -> float:
    """Records/s of a writer whose ``progress()`` grows a flush at a time: from its first
    flush to ``total``, the records after the first flush over that time (start-up and the
    first flush's filling left out)."""
    deadline = time.monotonic() + timeout_s
    first: tuple[float, int] | None = None
    while time.monotonic() < deadline:
        done = progress()
        now = time.monotonic()
        if first is None and done > 0:
            first = (now, done)
        if first is not None and done >= total:
            return (total - first[1]) / (now - first[0])
        time.sleep(0.02)
    raise TimeoutError(f"only {progress()} of {total} records after {timeout_s:.0f} s")


def bare_consumer(bootstrap: str, topic: str, total: int) -> None:
    """Child process: consume and decode ``total`` records; print the steady rate."""
    settings = Settings(bootstrap=bootstrap)
    consumer = new_consumer(settings, f"bare-{uuid.uuid4().hex}", "bare")
    consumer.subscribe([topic])
    codec = default_codec()
    logs = tables_of(Topics(), codec)["logs"]  # the archiver's own decoding, nothing else
    count = [0]

    def run() -> None:
        while count[0] < total:
            for message in consumer.consume(10_000, 0.5):
                if message.error() is None:
                    count[0] += len(logs.decode(codec, message.value() or b""))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    rate = steady_rate(lambda: count[0], total, 600)
    worker.join()
    consumer.close()
    print(json.dumps({"rate": rate}), flush=True)


def run_bare(bootstrap: str, topic: str, total: int) -> float:
    done = subprocess.run(
        [sys.executable, __file__, "--bare-consumer", bootstrap, topic, str(total)],
        capture_output=True, text=True, check=True, timeout=900,
    )  # fmt: skip
    return float(json.loads(done.stdout.strip().splitlines()[-1])["rate"])


def run_archiver(bootstrap: str, topics: Topics, total: int, work: Path) -> tuple[float, int]:
    root = work / f"archive-{uuid.uuid4().hex[:6]}"
    archiver = ArchiverProcess(
        bootstrap, topics.prefix, root, work / "archiver.log",
        {"archive.group_id": f"bench-{uuid.uuid4().hex[:6]}", "archive.roll_bytes": 1_000_000,
         "archive.roll_s": 1, "archive.audit": "false"},
    ).start()  # fmt: skip
    archived = ArchivedRecords(ArchiveStore(str(root)), topics.logs)
    try:
        rate = flushed_rate(archived, total, 900)
    finally:
        archiver.stop()
    size = sum(f.stat().st_size for f in root.rglob("*.parquet"))
    return rate, size


def bench_drain(bootstrap: str, work: Path, records: int) -> None:
    topics = Topics(prefix=f"bench-{uuid.uuid4().hex[:8]}")
    settings = load_settings(
        {"bootstrap": bootstrap, "prefix": topics.prefix, "producer.spool_dir": work / "spool"}
    )
    ensure_topics(settings, topics, partitions=PARTITIONS)
    start = time.monotonic()
    fill_backlog(settings, records)
    emit(
        "c_backlog",
        records=records,
        partitions=PARTITIONS,
        seconds=round(time.monotonic() - start, 1),
    )
    bare_before = run_bare(bootstrap, topics.logs, records)
    one, size = run_archiver(bootstrap, topics, records, work)
    bare_after = run_bare(bootstrap, topics.logs, records)  # the machine is shared: twice
    bare = max(bare_before, bare_after)
    emit(
        "c_bare_consumer",
        records_per_s=round(bare),
        before=round(bare_before),
        after=round(bare_after),
    )
    emit(
        "c_archiver_1_process",
        records_per_s=round(one),
        parquet_bytes_per_record=round(size / records, 1),
    )
    emit(
        "c_target",
        one_archiver_over_bare=round(one / bare, 2),
        target_ratio=0.7,
        ratio_met=one / bare >= 0.7,
        one_archiver_records_per_s=round(one),
        target_rate=100_000,
        rate_met=one >= 100_000,
    )


def paced_producer(bootstrap: str, prefix: str, rate: float, seconds: float) -> None:
    """Child process: log ``rate`` records/s for ``seconds`` in 10 ms ticks."""
    settings = Settings(bootstrap=bootstrap, prefix=prefix)
    with EventLogger(f"paced-{uuid.uuid4().hex[:6]}", settings=settings) as events:
        start = time.monotonic()
        sent = 0
        total = int(rate * seconds)
        while sent < total:
            due = min(total, int((time.monotonic() - start) * rate))
            for number in range(sent, due):
                events.log_record("INFO", 20, "trainer", f"sample {number} reward 0.25")
            sent = due
            time.sleep(0.01)
        events.flush(60)


IDLE_TOPIC_PARTITIONS = 100


def add_idle_partitions(bootstrap: str, count: int) -> None:
    """Topics of ``count`` partitions in all, none written: a broker as a shared cluster's."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    prefix = f"idle-{uuid.uuid4().hex[:6]}"
    step = IDLE_TOPIC_PARTITIONS
    sizes = [min(step, count - start) for start in range(0, count, step)]
    started = time.monotonic()
    for index, size in enumerate(sizes):
        futures = admin.create_topics([NewTopic(f"{prefix}-{index}", size, 1)])
        for future in futures.values():
            future.result(timeout=120)
    emit(
        "d_idle_partitions",
        partitions=count,
        topics=len(sizes),
        seconds=round(time.monotonic() - started, 1),
    )


def bench_end_to_end(
    bootstrap: str, work: Path, rates: list[int], seconds: float, idle_partitions: int = 0
) -> None:
    """(d): per rate, two paced producers and one archiver; the lag early and late.

    ``idle_partitions``: how many partitions :func:`add_idle_partitions` gave the broker
    (said in each line).
    """
    best = 0
    for rate in rates:
        topics = Topics(prefix=f"bench-{uuid.uuid4().hex[:8]}")
        settings = Settings(bootstrap=bootstrap, prefix=topics.prefix)
        ensure_topics(settings, topics, partitions=PARTITIONS)
        root = work / f"e2e-{rate}-{idle_partitions}"
        archiver = ArchiverProcess(
            bootstrap, topics.prefix, root, work / f"e2e-{rate}-{idle_partitions}.log",
            {"archive.roll_bytes": 4_000_000, "archive.roll_s": 1, "archive.audit": "false"},
        ).start()  # fmt: skip
        time.sleep(5)  # joined and assigned
        producers = [
            subprocess.Popen(
                [sys.executable, __file__, "--paced-producer", bootstrap, topics.prefix,
                 str(rate / 2), str(seconds)]
            )
            for _ in range(2)
        ]  # fmt: skip
        started = time.monotonic()
        archived = ArchivedRecords(ArchiveStore(str(root)), topics.logs)
        lags = []
        while any(p.poll() is None for p in producers):
            time.sleep(1.0)
            logged = min(seconds, time.monotonic() - started) * rate
            lags.append(logged - archived())
        for producer in producers:
            producer.wait()
        total = int(rate / 2 * seconds) * 2
        settle = time.monotonic()
        while archived() < total and time.monotonic() - settle < 120:
            time.sleep(0.2)
        drain_s = time.monotonic() - settle
        archiver.stop()
        third = max(1, len(lags) // 3)
        early, late = statistics.fmean(lags[1 : third + 1]), statistics.fmean(lags[-third - 1 : -1])
        growing = late > early + rate * 1.5  # more than ~1.5 s of records behind, and rising
        emit(
            "d_end_to_end", rate=rate, idle_partitions=idle_partitions, seconds=seconds,
            records=total, archived=archived(),
            lag_early=round(early), lag_late=round(late), drain_after_s=round(drain_s, 1),
            sustained=not growing and archived() == total,
        )  # fmt: skip
        if growing or archived() != total:
            break
        best = rate
    emit(
        "d_result", idle_partitions=idle_partitions, highest_sustained_rate=best, producers=2,
        archivers=1, target=150_000,
        met=best >= 150_000,
    )  # fmt: skip


# -- (e) ----------------------------------------------------------------------------------


def bench_write_ahead(settings: Settings, work: Path, calls: int) -> None:
    """(e): the write-ahead log's share of a call: an append of a record's entry alone (what
    ``log_record()`` writes), and ``log_record()`` whole."""
    meta = LogMeta(work / "wal-bench", "run", "producer", "e", "l", time.time_ns())
    writer = WalWriter(meta, segment_bytes=64 * 1024 * 1024, max_bytes=1 << 34)
    with EventLogger(f"bench-{uuid.uuid4().hex[:6]}", settings=settings) as events:
        events.log_record("INFO", 20, "trainer", "warm-up")
        source = RecordSource("run", 0, 0, {}, "host", "10.0.0.1", os.getpid(), "producer")
        encoder = LogEncoder(source, default_codec(), 100_000)
        packed = encoder.entry(
            LogFields(1, "trainer", "INFO", 20, "trainer", "step 1 loss 0.5"), 0, 1
        )
        clock = time.perf_counter_ns
        appends, records = [], []
        for seq in range(calls):
            start = clock()
            writer.append(LOG, seq, packed)
            appends.append(clock() - start)
        for step in range(calls):
            start = clock()
            events.log_record("INFO", 20, "trainer", "step %d loss 0.5", step=step)
            records.append(clock() - start)
        events.flush(60)
    writer.close()
    for name, samples in (("e_wal_append", appends), ("e_log_record", records)):
        emit(
            name,
            calls=calls,
            entry_bytes=len(packed),
            p50_us=round(percentile(samples, 50) / 1e3, 2),
            p99_us=round(percentile(samples, 99) / 1e3, 2),
        )


def profile_archiver(bootstrap: str, work: Path, records: int) -> None:
    from rlpulse.streams.archiver.archiver import Archiver

    topics = Topics(prefix=f"bench-{uuid.uuid4().hex[:8]}")
    settings = load_settings(
        {
            "bootstrap": bootstrap,
            "prefix": topics.prefix,
            "producer.spool_dir": work / "spool",
            "archive": {"root": str(work / "profiled"), "roll_bytes": 4_000_000, "roll_s": 1,
                        "audit": False},
        }
    )  # fmt: skip
    ensure_topics(settings, topics, partitions=PARTITIONS)
    fill_backlog(settings, records)
    archiver = Archiver(settings, lambda text: None)
    archived = ArchivedRecords(ArchiveStore(str(work / "profiled")), topics.logs)

    def stop_when_done() -> None:
        while archived() < records:
            time.sleep(0.2)
        archiver.stop()

    threading.Thread(target=stop_when_done, daemon=True).start()
    profiler = cProfile.Profile()
    profiler.runcall(archiver.run)
    pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(15)


def indexed(url: str, pattern: str) -> int:
    """Documents the indices of ``pattern`` hold (0 before the first exists)."""
    status, body = request_json("GET", f"{url}/{pattern}/_count")
    return int(body["count"]) if status == 200 else 0


def bare_bulk(url: str, bodies: list[bytes], total: int) -> float:
    """Records/s of ``_bulk`` requests of ready documents, one after the other."""
    client = OpenSearch(hosts=[url], timeout=120, max_retries=0)
    start = time.monotonic()
    for body in bodies:
        response = client.bulk(body=body)
        assert not response["errors"], "the bare client's documents must all land"
    return total / (time.monotonic() - start)


def bench_indexing(bootstrap: str, url: str, work: Path, records: int) -> None:
    # The indexer's child process is the tests' (tests/support): this repository's tests/,
    # ahead of any installed package named "tests".
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.support.indexer_process import IndexerProcess

    topics = Topics(prefix=f"bench-{uuid.uuid4().hex[:8]}")
    settings = load_settings(
        {"bootstrap": bootstrap, "prefix": topics.prefix, "producer.spool_dir": work / "spool"}
    )
    ensure_topics(settings, topics, partitions=PARTITIONS)
    fill_backlog(settings, records)
    # The bare client's documents: the indexer's own, built before the clock starts.
    codec = default_codec()
    consumer = new_consumer(settings, f"bare-{uuid.uuid4().hex}", "bare")
    consumer.subscribe([topics.logs])
    batches: list[Any] = []
    while sum(len(batch["entries"]) for batch in batches) < records:
        for message in consumer.consume(10_000, 0.5):
            if message.error() is None:
                batches.append(codec.decode_log_batch(message.value() or b""))
    consumer.close()
    size = settings.index.bulk_max_docs

    def bodies(prefix: str) -> list[bytes]:
        """The documents in ``_bulk`` bodies, under the indexer's mappings for ``prefix``."""
        names = IndexNames(prefix)
        for name, template in templates(names, settings.index.shards, None).items():
            request_json("PUT", f"{url}/_index_template/{name}", template)
        lines = [doc.bulk_lines() for batch in batches for doc in log_batch_documents(names, batch)]
        return [b"".join(lines[n : n + size]) for n in range(0, len(lines), size)]

    bare_before = bare_bulk(url, bodies(f"{topics.prefix}-bare1"), records)
    indexer = IndexerProcess(
        bootstrap, topics.prefix, url, work / "indexer.log",
        {"index.group_id": f"bench-{uuid.uuid4().hex[:6]}"},
    ).start()  # fmt: skip
    try:
        one = steady_rate(lambda: indexed(url, f"{topics.prefix}-logs-*"), records, 900)
    finally:
        indexer.stop()
    bare_after = bare_bulk(url, bodies(f"{topics.prefix}-bare2"), records)
    bare = max(bare_before, bare_after)
    emit(
        "f_bare_bulk",
        records=records,
        docs_per_request=size,
        records_per_s=round(bare),
        before=round(bare_before),
        after=round(bare_after),
    )
    emit("f_indexer_1_process", records_per_s=round(one))
    ratio = one / bare
    emit("f_target", indexer_over_bare=round(ratio, 2), target_ratio=0.7, met=ratio >= 0.7)
    request_json("DELETE", f"{url}/{topics.prefix}-*")
    for prefix in (topics.prefix, f"{topics.prefix}-bare1", f"{topics.prefix}-bare2"):
        for kind in ("logs", "steps"):
            request_json("DELETE", f"{url}/_index_template/{prefix}-{kind}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--torch-threads", default="2,1", help="(b) with each count of threads")
    parser.add_argument("--loads", default="seed_like,realistic", help="(b)'s loads")
    parser.add_argument("--backlog", type=int, default=1_000_000)
    parser.add_argument("--rates", default="50000,100000,120000,150000")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument(
        "--idle-partitions", type=int, default=0, help="(d) on a broker holding this many more"
    )
    parser.add_argument("--index-records", type=int, default=200_000, help="(f)'s backlog")
    parser.add_argument("--only", default="abcdef")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--bare-consumer", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--paced-producer", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_consumer:
        bootstrap, topic, total = args.bare_consumer
        bare_consumer(bootstrap, topic, int(total))
        return
    if args.paced_producer:
        bootstrap, prefix, rate, seconds = args.paced_producer
        paced_producer(bootstrap, prefix, float(rate), float(seconds))
        return
    work = Path(tempfile.mkdtemp(prefix="rlpulse-logs-bench-"))
    with bootstrap_or_local_broker(Settings(), work / "broker") as bootstrap:
        topics = Topics(prefix=f"bench-{uuid.uuid4().hex[:8]}")
        settings = load_settings(
            {"bootstrap": bootstrap, "prefix": topics.prefix, "producer.spool_dir": work / "spool"}
        )
        ensure_topics(settings, topics, partitions=PARTITIONS)
        emit("machine", cpus=os.cpu_count(), python=sys.version.split()[0])
        if args.profile:
            profile_archiver(bootstrap, work, args.backlog)
            return
        if "a" in args.only:
            bench_call_cost(settings, work, args.calls)
        if "b" in args.only:
            threads = [int(n) for n in args.torch_threads.split(",")]
            bench_training_loop(settings, args.steps, args.rounds, threads, args.loads.split(","))
        if "c" in args.only:
            bench_drain(bootstrap, work, args.backlog)
        if "d" in args.only:
            rates = [int(r) for r in args.rates.split(",")]
            bench_end_to_end(bootstrap, work, rates, args.seconds)
            if args.idle_partitions:  # the same again, the broker holding thousands more
                add_idle_partitions(bootstrap, args.idle_partitions)
                bench_end_to_end(bootstrap, work, rates, args.seconds, args.idle_partitions)
        if "e" in args.only:
            bench_write_ahead(settings, work, args.calls)
        if "f" in args.only:
            with local_search_or_url(settings, work / "search") as url:
                bench_indexing(bootstrap, url, work, args.index_records)


if __name__ == "__main__":
    main()
