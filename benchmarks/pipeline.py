"""Pipeline benchmark: events/s through one worker against its ceiling, and command latency.

Prints one JSON object per line, all measured in the same run on the same broker:

- ``kafka_roundtrip``: produce -> consume latency of bare Kafka (the floor under any
  pipeline latency);
- ``bare_agent_throughput``: a backlog of events (runs x ranks x steps, ``--metrics``
  metrics each, produced with the trainers' producer settings) read by a faust agent that
  only decodes them, built from the worker's own faust app and batching (the ceiling of
  this design); events/s is the backlog over the time from the agent joining its group to
  its last decode;
- ``worker_throughput``: the same backlog through a full worker (joiner, rule engine,
  tables); events/s is the backlog over the time from the worker joining its group to the
  last StepSummary read back; ``worker_cpu_share`` is the CPU time the worker used over that
  time (1.0 = one core: the worker is one Python process and runs on one core at most);
- ``worker_vs_bare``: the ratio of the two rates;
- ``command_latency``: a fresh worker (the seed rules plus a ``probe`` rule that answers
  every step of the probe run with a command) under a background load of
  ``--load-fraction`` (80 %) of the measured worker rate, produced on a fixed schedule for
  ``--latency-seconds`` (each event stamped with its scheduled send time). The probe run's
  8 long-lived ranks log one step every ``--probe-interval`` s inside the load window (the
  line says whether every probe was); a probe's latency is from the last rank's ``log()``
  of its step to its command arriving on the control topic. Reported: p50/p90/p99/max over
  all probes, how many got an answer, the join latency of the background steps
  (``emitted_ns - last_event_ns`` of their summaries), the worker's backlog each second
  (uncommitted events), its CPU share, and its RSS and GC pauses (from its /metrics);
- ``after_sigstop_2s``: the same for 60 s with the worker stopped (SIGSTOP) for 2 s after
  15 s; ``recovery_s`` is how long after SIGCONT every later probe stays under 1 s;
- ``soak`` (``--soak-minutes N``): the same for N minutes, with one ``soak_minute`` line a
  minute (latency percentiles, worker RSS, longest GC pause so far, GC counts);
- ``targets``: each target (issue 21: command latency p50 < 100 ms and p99 < 500 ms at 80 %
  of the drain rate, drain >= 0.7 of the bare agent) and whether this run met it.

``--worker-env NAME=VALUE`` sets the worker's (and the bare agent's) environment, e.g.
``RLPULSE_WORKER__BUFFER_MAX=32768``, to compare settings in one run.
``--profile FILE`` runs only the worker throughput phase, with the worker under cProfile,
and prints its 30 most expensive functions. Uses ``RLPULSE_BOOTSTRAP`` if set, otherwise
starts (and stops) a local broker, or with ``--nodes 3`` a local three-node cluster
(replication 3, ``min.insync.replicas`` 2: what ``rlpulse broker up --nodes 3`` runs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pstats
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from confluent_kafka import Consumer, Producer
from figures import encoded_events, percentile, printer, produce_all

from rlpulse.local.broker import bootstrap_or_local_broker
from rlpulse.local.cluster import LocalCluster
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers import EventLogger, Settings
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.transport import clients as transport_clients
from rlpulse.transport.topics import ensure_topics

PARTITIONS = 6


emit = printer("pipeline")


def cpu_seconds(process: WorkerProcess) -> float:
    """CPU time (user + system) the worker process has used so far, from /proc."""
    assert process.process is not None
    fields = Path(f"/proc/{process.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far, from /proc/stat."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return sum(ticks) - idle, sum(ticks)


class CpuShare:
    """Between two points in time: the share of one core a worker process used, and how busy
    the whole machine was (0..1 of all its cores)."""

    def __init__(self, process: WorkerProcess) -> None:
        self.process = process
        self.start = (time.perf_counter(), cpu_seconds(process), machine_ticks())
        self.share = self.machine_busy = 0.0

    def stop(self) -> float:
        """Measure from the start to now (again, if called again); returns the worker's share."""
        wall, cpu, (busy, total) = self.start
        self.share = round((cpu_seconds(self.process) - cpu) / (time.perf_counter() - wall), 2)
        busy_now, total_now = machine_ticks()
        self.machine_busy = round((busy_now - busy) / max(total_now - total, 1), 2)
        return self.share


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


def trainer_producer(bootstrap: str) -> Producer:
    """A producer with the settings EventLogger uses (batching, compression)."""
    return transport_clients.trainer_producer(Settings(bootstrap=bootstrap), "benchmark")


def kafka_roundtrip(bootstrap: str, samples: int) -> list[float]:
    topics = Topics(prefix=f"bench-rt-{uuid.uuid4().hex[:8]}")
    ensure_topics(Settings(bootstrap=bootstrap), topics, partitions=1)
    producer = trainer_producer(bootstrap)
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


class Load:
    """TrainerEvents of ``runs`` runs x ``ranks`` ranks, step after step, encoded up front."""

    def __init__(self, runs: int, ranks: int, metrics: int, label: str) -> None:
        self.runs, self.ranks, self.metrics = runs, ranks, metrics
        self.label = label

    def encode(
        self, steps: range, start_ns: int | None = None, step_s: float = 0.0
    ) -> list[tuple[bytes, bytes]]:
        """(key, value) of every event of ``steps``, in the order trainers would send them.

        Step ``i`` carries ``timestamp_ns = start_ns + i * step_s`` (default: now).
        """
        return encoded_events(
            self.label, self.runs, self.ranks, self.metrics, steps, start_ns, step_s
        )

    def describe(self, **extra: Any) -> dict[str, Any]:
        return {"runs": self.runs, "ranks": self.ranks, "metrics_per_event": self.metrics, **extra}


class BareAgentProcess(WorkerProcess):
    """This file run as ``bare-agent``: a faust agent that only decodes the events topic."""

    def __init__(
        self, bootstrap: str, prefix: str, log_file: Path, expect: int, env: dict[str, str]
    ) -> None:
        super().__init__(bootstrap, prefix, log_file, partitions=PARTITIONS, env=env)
        self.expect = expect
        self.done_file = log_file.with_suffix(".done")

    @property
    def group_id(self) -> str:
        return f"{self.prefix}-bare"

    def command(self) -> list[str]:
        return [
            sys.executable,
            str(Path(__file__).resolve()),
            "bare-agent",
            self.bootstrap,
            self.prefix,
            str(self.expect),
            str(self.done_file),
        ]


class ProfiledWorker(WorkerProcess):
    """The worker child under cProfile, writing its profile to ``profile_file`` on exit."""

    def __init__(self, *args: Any, profile_file: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.profile_file = profile_file

    def command(self) -> list[str]:
        python, *rest = super().command()
        return [python, "-m", "cProfile", "-o", str(self.profile_file), *rest]


def bare_agent_main(bootstrap: str, prefix: str, expect: int, done_file: str) -> None:
    """Child process: decode ``expect`` events of ``<prefix>.events``, then write the time."""
    import faust

    from rlpulse.settings import WorkerSettings
    from rlpulse.streams.worker.app import Batcher, faust_app

    worker = WorkerSettings(
        app_id=f"{prefix}-bare",
        partitions=PARTITIONS,
        data_dir=Path(done_file).parent / f"{prefix}-bare-data",
    )
    settings = Settings(bootstrap=bootstrap, prefix=prefix, worker=worker)
    app = faust_app(settings)
    codec = default_codec()
    decoded = 0
    first: tuple[float, int] | None = None

    async def decode(event: Any) -> None:
        nonlocal decoded
        codec.decode_event(event.message.value)
        decoded += 1

    async def batch_done() -> None:
        nonlocal first
        if first is None:
            first = (time.time(), decoded)
        if decoded >= expect:
            Path(done_file).write_text(json.dumps([*first, time.time()]))

    async def decode_only(stream: Any) -> None:
        await Batcher(settings).run(stream, batch_done, decode)

    topic = app.topic(Topics(prefix).events, key_type=bytes, value_type=bytes)
    app.agent(topic, name="bench.decode")(decode_only)
    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


def backlog(bootstrap: str, load: Load, steps: int) -> Topics:
    """Fresh topics whose events topic holds ``steps`` steps of ``load``."""
    topics = Topics(prefix=f"bench-tp-{uuid.uuid4().hex[:8]}")
    ensure_topics(Settings(bootstrap=bootstrap), topics, partitions=PARTITIONS)
    produce_all(trainer_producer(bootstrap), topics.events, load.encode(range(steps)))
    return topics


def drain_rates(
    bootstrap: str,
    load: Load,
    steps: int,
    workdir: Path,
    baseline: Path | None,
    env: dict[str, str],
) -> dict[str, float]:
    """Events/s of the bare agent and the worker (and a baseline worker) over one backlog."""
    topics = backlog(bootstrap, load, steps)
    events = load.runs * load.ranks * steps
    shape = load.describe(steps=steps)
    rates = {"bare": bare_rate(bootstrap, topics, events, workdir, env)}
    emit("bare_agent_throughput", events=events, events_per_s=rates["bare"], load=shape)
    if baseline is not None:
        # same events, own topics: a worker of another version must not share our tables
        old_topics = backlog(bootstrap, load, steps)
        old = worker_rate(bootstrap, old_topics, load.runs * steps, workdir, baseline)
        emit(
            "baseline_worker_throughput",
            code=str(baseline),
            events=events,
            events_per_s=round(old.summaries_per_s * load.ranks, 1),
            complete=old.complete,
            worker_cpu_share=old.cpu_share,
            load=shape,
        )
    drain = worker_rate(bootstrap, topics, load.runs * steps, workdir, env=env)
    rates["full"] = round(drain.summaries_per_s * load.ranks, 1)
    emit(
        "worker_throughput",
        events=events,
        events_per_s=rates["full"],
        complete=drain.complete,
        worker_cpu_share=drain.cpu_share,
        load=shape,
    )
    emit("worker_vs_bare", ratio=round(rates["full"] / rates["bare"], 3))
    return rates


def profile_worker(bootstrap: str, load: Load, steps: int, workdir: Path, out: Path) -> None:
    """The worker over a backlog under cProfile; prints its most expensive functions."""
    topics = backlog(bootstrap, load, steps)
    drain = worker_rate(bootstrap, topics, load.runs * steps, workdir, profile=out)
    emit(
        "profiled_worker_throughput",
        events_per_s=round(drain.summaries_per_s * load.ranks, 1),
        complete=drain.complete,
    )
    pstats.Stats(str(out)).sort_stats("tottime").print_stats(30)


def bare_rate(
    bootstrap: str, topics: Topics, events: int, workdir: Path, env: dict[str, str]
) -> float:
    agent = BareAgentProcess(bootstrap, topics.prefix, workdir / "bare-agent.log", events, env)
    agent.start()
    try:
        agent.wait_consuming(timeout_s=120)
        deadline = time.monotonic() + 600
        while not agent.done_file.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        started, first_batch, finished = map(float, json.loads(agent.done_file.read_text()))
    finally:
        agent.stop()
    return round((events - first_batch) / (finished - started), 1)


class Drain(NamedTuple):
    """One worker over a backlog: summaries/s, whether all came, its share of one core."""

    summaries_per_s: float
    complete: bool
    cpu_share: float


def worker_rate(
    bootstrap: str,
    topics: Topics,
    want: int,
    workdir: Path,
    code: Path | None = None,
    profile: Path | None = None,
    env: dict[str, str] | None = None,
) -> Drain:
    """Summaries per second from the first to the last of ``want``, and whether all came.

    Counting from the first summary leaves the worker's start-up (table recovery) out.

    ``code``: run the worker from that source tree instead; ``profile``: under cProfile.
    """
    reader = consumer(bootstrap, topics.steps)
    log = workdir / f"{topics.prefix}-worker.log"
    worker = (
        WorkerProcess(bootstrap, topics.prefix, log, partitions=PARTITIONS, env=env)
        if profile is None
        else ProfiledWorker(
            bootstrap, topics.prefix, log, partitions=PARTITIONS, profile_file=profile
        )
    )
    saved = os.environ.get("PYTHONPATH")
    if code is not None:
        os.environ["PYTHONPATH"] = str(code)
    try:
        worker.start()
    finally:
        if code is not None:
            os.environ.pop("PYTHONPATH")
            if saved is not None:
                os.environ["PYTHONPATH"] = saved
    try:
        worker.wait_consuming(timeout_s=120)
        cpu = CpuShare(worker)
        seen: set[str] = set()
        deadline = time.monotonic() + 600
        codec = default_codec()
        started = finished = 0.0
        while len(seen) < want and time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is not None and message.error() is None:
                seen.add(codec.decode_summary(message.value() or b"")["summary_id"])
                finished = time.perf_counter()
                started = started or finished
        cpu.stop()
    finally:
        worker.stop()
        reader.close()
    return Drain((len(seen) - 1) / (finished - started), len(seen) == want, cpu.share)


# -- latency under load -------------------------------------------------------------------

PROBE_RULES = """\
version: 1
rules:
  - id: unstable-reward
    metric: reward_mean
    stage: rollout
    over_steps: {window: 5, stat: var}
    when: "> 0.5"
    cooldown_steps: 5
    actions: [{scale_rollout_batch: {factor: 2, max: 256}}]
  - id: kl-guard
    metric: kl_divergence
    when: "> 0.3"
    for_steps: 3
    once: true
    actions: [{checkpoint: {tag: kl_violation}}, {stop: {}}]
  - id: probe
    metric: probe
    stage: probe
    when: "> 0"
    actions: [{alert: {severity: info, message: probe}}]
"""
"""The seed rules, plus one that answers every step of the probe run with a command."""

PROBE_RUN = "probe"


class ScheduledLoad(threading.Thread):
    """Background runs, one step of every run at a time, at ``rate`` events/s for a duration.

    Events are encoded up front, each with the time its step is scheduled to leave as its
    ``timestamp_ns``, so a summary's ``emitted_ns - last_event_ns`` is its join latency.
    """

    def __init__(self, bootstrap: str, topic: str, load: Load, rate: float, seconds: float):
        super().__init__(daemon=True)
        self.producer = trainer_producer(bootstrap)
        self.topic = topic
        self.per_step = load.runs * load.ranks
        steps = max(1, round(rate * seconds / self.per_step))
        self.step_s = self.per_step / rate
        self.start_ns = time.time_ns() + round((steps * self.per_step * 12e-6 + 3) * 1e9)
        self.messages = load.encode(range(steps), self.start_ns, self.step_s)
        self.sent = 0
        self.ended_ns = 0
        self.halt = threading.Event()

    def run(self) -> None:
        while time.time_ns() < self.start_ns:
            time.sleep(0.001)
        total = len(self.messages)
        while not self.halt.is_set() and self.sent < total:
            elapsed = (time.time_ns() - self.start_ns) / 1e9
            due = min(total, (int(elapsed / self.step_s) + 1) * self.per_step)
            for key, value in self.messages[self.sent : due]:
                try:
                    self.producer.produce(self.topic, key=key, value=value)
                except BufferError:
                    self.producer.poll(0.01)
                    break
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.002)
        self.ended_ns = time.time_ns()
        self.producer.flush(60)

    @property
    def achieved_rate(self) -> float:
        """Events/s actually produced, from the scheduled start to the last send."""
        seconds = (self.ended_ns - self.start_ns) / 1e9
        return self.sent / seconds if seconds > 0 else 0.0


class TopicWatch(threading.Thread):
    """Reads a topic from its end as it is now; hands each decoded record to ``take``."""

    def __init__(self, bootstrap: str, topic: str, take: Any) -> None:
        super().__init__(daemon=True)
        self.consumer = consumer(bootstrap, topic)
        self.take = take
        self.halt = threading.Event()

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                for message in self.consumer.consume(500, timeout=0.05):
                    if message.error() is None:
                        self.take(message.value() or b"", time.time_ns())
        finally:
            self.consumer.close()


class Probes(threading.Thread):
    """The probe run: 8 long-lived ranks log one step every ``interval_s``; the probe rule
    answers every step with a command, and latency is from the last rank's log() of a step
    to that command arriving."""

    def __init__(self, settings: Settings, ranks: int, interval_s: float, count: int) -> None:
        super().__init__(daemon=True)
        self.loggers = [
            EventLogger(PROBE_RUN, rank=r, world_size=ranks, settings=settings)
            for r in range(ranks)
        ]
        self.interval_s, self.count = interval_s, count
        self.sent_ns: dict[int, int] = {}
        self.arrived_ns: dict[int, int] = {}
        self.halt = threading.Event()

    def run(self) -> None:
        next_at = time.monotonic()
        for step in range(self.count):
            if self.halt.is_set():
                break
            for logger in self.loggers:
                logger.log({"probe": 1.0}, step=step, stage="probe")
            self.sent_ns[step] = time.time_ns()
            next_at += self.interval_s
            time.sleep(max(0.0, next_at - time.monotonic()))

    def take_command(self, value: bytes, now_ns: int) -> None:
        command = default_codec().decode_command(value)
        if command["run_id"] == PROBE_RUN and command["step"] not in self.arrived_ns:
            self.arrived_ns[command["step"]] = now_ns

    def latencies_ms(self, first: int = 0, last: int | None = None) -> dict[int, float | None]:
        """Per probe step sent: its latency in ms, None if its command never came."""
        return {
            step: None if step not in self.arrived_ns else (self.arrived_ns[step] - sent) / 1e6
            for step, sent in self.sent_ns.items()
            if first <= step and (last is None or step <= last)
        }

    def close(self) -> None:
        for logger in self.loggers:
            logger.close(10)


class JoinWatch:
    """Join latency of the background steps: emitted_ns - last_event_ns of each summary."""

    def __init__(self) -> None:
        self.seconds: list[tuple[int, float]] = []  # (emitted_ns, join latency s)
        self.codec = default_codec()

    def take(self, value: bytes, _now_ns: int) -> None:
        summary = self.codec.decode_summary(value)
        if summary["run_id"] != PROBE_RUN and summary["revision"] == 1:
            lag = (summary["emitted_ns"] - summary["last_event_ns"]) / 1e9
            self.seconds.append((summary["emitted_ns"], lag))


def lag_of(bootstrap: str, group: str, topic: str) -> int:
    """Messages of ``topic`` the group has not committed yet."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    admin = transport_clients.new_admin(Settings(bootstrap=bootstrap), "benchmark")
    partitions = range(PARTITIONS)
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])
    committed = admin.list_consumer_group_offsets([request])[group].result()
    reader = consumer(bootstrap, topic)
    try:
        ends = {
            p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        }
    finally:
        reader.close()
    done = {tp.partition: max(tp.offset, 0) for tp in committed.topic_partitions}
    return sum(max(ends[p] - done.get(p, 0), 0) for p in partitions)


def summarize(latencies: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(latencies, 50), 1),
        "p90_ms": round(percentile(latencies, 90), 1),
        "p99_ms": round(percentile(latencies, 99), 1),
        "max_ms": round(max(latencies), 1),
    }


def worker_gauges(port: int) -> dict[str, float]:
    """The worker's RSS, its longest GC pause so far and its GC pause counts, from /metrics."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "process_resident_memory_bytes":
                found["rss_mb"] = round(sample.value / 2**20, 1)
            elif sample.name == "rlpulse_gc_longest_pause_seconds":
                found["gc_longest_pause_ms"] = round(sample.value * 1e3, 1)
            elif sample.name == "rlpulse_gc_pause_seconds_count":
                found[f"gc_count_gen{sample.labels['generation']}"] = sample.value
            elif (
                sample.name == "rlpulse_gc_pause_seconds_sum" and sample.labels["generation"] == "2"
            ):
                found["gc_full_pause_total_ms"] = round(sample.value * 1e3, 1)
    return found


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def latency_under_load(
    bootstrap: str,
    load: Load,
    rate: float,
    seconds: float,
    interval_s: float,
    workdir: Path,
    env: dict[str, str],
    *,
    pause_at_s: float | None = None,
    per_minute: bool = False,
) -> dict[str, Any]:
    """Probe latency over ``seconds`` of background load at ``rate``, on a fresh worker.

    ``pause_at_s``: SIGSTOP the worker that far into the window for 2 s; then report how long
    after SIGCONT the probes stay under 1 s. ``per_minute``: emit a line per minute (latency
    percentiles, worker RSS, GC pauses) — the soak mode.
    """
    topics = Topics(prefix=f"bench-lat-{uuid.uuid4().hex[:8]}")
    ensure_topics(Settings(bootstrap=bootstrap), topics, partitions=PARTITIONS)
    rules = workdir / f"{topics.prefix}-rules.yaml"
    rules.write_text(PROBE_RULES)
    port = free_port()
    worker = WorkerProcess(
        bootstrap,
        topics.prefix,
        workdir / f"{topics.prefix}-worker.log",
        rules=str(rules),
        partitions=PARTITIONS,
        extra_args=("--metrics-port", str(port), "--metrics-host", "127.0.0.1"),
        env=env,
    )
    settings = Settings(bootstrap=bootstrap, prefix=topics.prefix)
    background = ScheduledLoad(bootstrap, topics.events, load, rate, seconds + 15)
    probes = Probes(settings, load.ranks, interval_s, count=int(seconds / interval_s))
    joins = JoinWatch()
    watchers = [
        TopicWatch(bootstrap, topics.control, probes.take_command),
        TopicWatch(bootstrap, topics.steps, joins.take),
    ]
    backlog: list[tuple[float, int]] = []
    minutes: list[dict[str, Any]] = []
    worker.start()
    cpu: CpuShare | None = None
    try:
        worker.wait_consuming(timeout_s=120)
        for watcher in watchers:
            watcher.start()
        background.start()
        while time.time_ns() < background.start_ns + 5 * 10**9:  # the load settles first
            time.sleep(0.05)
        window_start_ns = time.time_ns()
        cpu = CpuShare(worker)
        probes.start()
        paused_ns: int | None = None
        next_minute = time.monotonic() + 60
        minute_first = 0
        while probes.is_alive():
            elapsed = (time.time_ns() - window_start_ns) / 1e9
            backlog.append((round(elapsed, 1), lag_of(bootstrap, worker.group_id, topics.events)))
            if pause_at_s is not None and paused_ns is None and elapsed >= pause_at_s:
                assert worker.process is not None
                os.kill(worker.process.pid, signal.SIGSTOP)
                time.sleep(2.0)
                os.kill(worker.process.pid, signal.SIGCONT)
                paused_ns = time.time_ns()
            if per_minute and time.monotonic() >= next_minute:
                next_minute += 60
                last = max(probes.sent_ns, default=0)
                minute = [v for v in probes.latencies_ms(minute_first, last - 4).values() if v]
                minute_first = last - 3
                line = {
                    "minute": len(minutes) + 1,
                    **summarize(minute or [0.0]),
                    **worker_gauges(port),
                }
                minutes.append(line)
                emit("soak_minute", **line)
            time.sleep(1.0)
        window_end_ns = time.time_ns()
        cpu.stop()
        time.sleep(5.0)  # the last probes' commands
        gauges = worker_gauges(port)
    finally:
        background.halt.set()
        probes.halt.set()
        background.join(60)
        for watcher in watchers:
            watcher.halt.set()
            watcher.join(10)
        probes.close()
        worker.stop()
    per_probe = probes.latencies_ms()
    answered = [v for v in per_probe.values() if v is not None]
    in_window = all(
        window_start_ns <= sent <= window_end_ns and sent <= background.ended_ns
        for sent in probes.sent_ns.values()
    )
    join = [lag for emitted, lag in joins.seconds if window_start_ns <= emitted <= window_end_ns]
    result: dict[str, Any] = {
        "samples": len(per_probe),
        "answered": len(answered),
        "all_probes_under_load": in_window,
        **summarize(answered or [0.0]),
        "join_p50_ms": round(percentile(join or [0.0], 50) * 1e3, 1),
        "join_p99_ms": round(percentile(join or [0.0], 99) * 1e3, 1),
        "join_samples": len(join),
        "backlog": backlog,
        "load": load.describe(
            target_events_per_s=round(rate, 1),
            achieved_events_per_s=round(background.achieved_rate, 1),
            probe_interval_s=interval_s,
            worker_cpu_share_under_load=cpu.share if cpu else None,
            machine_cpu_busy_under_load=cpu.machine_busy if cpu else None,
        ),
        "worker": gauges,
    }
    if pause_at_s is not None and paused_ns is not None:
        after = {
            step: ms
            for step, ms in per_probe.items()
            if probes.sent_ns[step] >= paused_ns - 2 * 10**9
        }
        recovered_ns = None
        for step in sorted(after):
            if all(ms is not None and ms < 1000 for s, ms in after.items() if s >= step):
                recovered_ns = max(probes.sent_ns[step] - paused_ns, 0)
                break
        result["recovery_s"] = None if recovered_ns is None else round(recovered_ns / 1e9, 1)
        result["worst_after_pause_ms"] = round(max(v for v in after.values() if v), 1)
    if per_minute:
        result["minutes"] = minutes
    return result


@contextlib.contextmanager
def local_kafka(settings: Settings, state_dir: Path, nodes: int) -> Iterator[str]:
    """``RLPULSE_BOOTSTRAP``'s cluster, else a local broker (or ``nodes``), stopped on exit."""
    if settings.bootstrap or nodes <= 1:
        with bootstrap_or_local_broker(settings, state_dir) as bootstrap:
            yield bootstrap
        return
    cluster = LocalCluster(settings, nodes=nodes, state_dir=state_dir, port=0)
    cluster.up()
    try:
        yield cluster.bootstrap
    finally:
        cluster.down()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "bare-agent":
        bootstrap, prefix, expect, done_file = sys.argv[2:6]
        bare_agent_main(bootstrap, prefix, int(expect), done_file)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--metrics", type=int, default=8)
    parser.add_argument("--load-fraction", type=float, default=0.8)
    parser.add_argument("--latency-seconds", type=float, default=180.0)
    parser.add_argument("--probe-interval", type=float, default=0.5)
    parser.add_argument("--soak-minutes", type=float, default=0.0, help="also a soak this long")
    parser.add_argument("--no-pause", action="store_true", help="skip the SIGSTOP phase")
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument("--nodes", type=int, default=1, help="local cluster size (no bootstrap)")
    parser.add_argument(
        "--latency-at", type=float, default=None, help="skip the drain phase: load at this rate"
    )
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment of the worker (and bare agent), e.g. RLPULSE_WORKER__BUFFER_MAX=32768",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="also measure a worker run from this source tree (e.g. an earlier commit)",
    )
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.worker_env)
    if env:
        emit("worker_env", **env)
    workdir = Path(tempfile.mkdtemp(prefix="rlpulse-bench-"))
    load = Load(args.runs, args.ranks, args.metrics, label="run")
    state_dir = Path(tempfile.mkdtemp(prefix="rlpulse-bench-"))
    with local_kafka(Settings(), state_dir, args.nodes) as bootstrap:
        emit("kafka", nodes=args.nodes, bootstrap=bootstrap)
        if args.profile is not None:
            profile_worker(bootstrap, load, args.steps, workdir, args.profile)
            return
        baseline = kafka_roundtrip(bootstrap, samples=200)
        emit(
            "kafka_roundtrip",
            samples=len(baseline),
            p50_ms=round(statistics.median(baseline), 2),
            p99_ms=round(percentile(baseline, 99), 2),
        )
        if args.latency_at is not None:
            rates = {"full": args.latency_at / args.load_fraction, "bare": 0.0}
        else:
            rates = drain_rates(bootstrap, load, args.steps, workdir, args.baseline, env)
        rate = args.load_fraction * rates["full"]
        background = Load(args.runs, args.ranks, args.metrics, label="bg")
        steady = latency_under_load(
            bootstrap, background, rate, args.latency_seconds, args.probe_interval, workdir, env
        )
        emit("command_latency", **steady)
        paused: dict[str, Any] = {}
        if not args.no_pause:
            paused = latency_under_load(
                bootstrap,
                background,
                rate,
                60.0,
                args.probe_interval,
                workdir,
                env,
                pause_at_s=15.0,
            )
            emit(
                "after_sigstop_2s",
                recovery_s=paused.get("recovery_s"),
                worst_ms=paused.get("worst_after_pause_ms"),
                samples=paused["samples"],
            )
        soak: dict[str, Any] = {}
        if args.soak_minutes > 0:
            soak = latency_under_load(
                bootstrap,
                background,
                rate,
                args.soak_minutes * 60,
                args.probe_interval,
                workdir,
                env,
                per_minute=True,
            )
            emit("soak", **{k: v for k, v in soak.items() if k not in ("minutes", "backlog")})
        p99_minutes = [m["p99_ms"] for m in soak.get("minutes", [])]
        emit(
            "targets",
            probe_p50_lt_100ms=steady["p50_ms"] < 100,
            probe_p99_lt_500ms=steady["p99_ms"] < 500,
            all_probes_under_load=steady["all_probes_under_load"],
            every_probe_answered=steady["answered"] == steady["samples"],
            back_under_1s_within_30s_of_sigstop=(
                paused.get("recovery_s") is not None and paused["recovery_s"] <= 30
            )
            if paused
            else None,
            drain_ge_0_7_of_bare=rates["full"] >= 0.7 * rates["bare"] if rates["bare"] else None,
            soak_p99_lt_1s_every_minute=all(p < 1000 for p in p99_minutes) if p99_minutes else None,
        )


if __name__ == "__main__":
    main()
