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
- ``command_latency``: with a background load of ``--load-fraction`` (80 %) of the
  measured worker rate running on the same worker, runs whose KL passes 0.3 for three
  steps are played one after another; latency is from producing the last rank's event of
  the firing step to reading the kl-guard command from the control topic;
  ``worker_cpu_share_under_load`` is the worker's CPU share while the background load ran,
  ``machine_cpu_busy_under_load`` how busy all cores were (broker, load, worker);
- ``latency_vs_kafka``: the ratio of the two latency medians;
- ``targets``: each target of issue 5 and whether this run met it.

``--profile FILE`` runs only the worker throughput phase, with the worker under cProfile,
and prints its 30 most expensive functions. Uses ``RLPULSE_BOOTSTRAP`` if set, otherwise
starts (and stops) a local broker.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple

from confluent_kafka import Consumer, Producer

from rlpulse.local.broker import bootstrap_or_local_broker
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers import EventLogger, Settings
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.transport import clients as transport_clients
from rlpulse.transport.topics import ensure_topics

PARTITIONS = 6


def emit(name: str, **fields: Any) -> None:
    print(json.dumps({"bench": "pipeline", "name": name, **fields}), flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


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
        self.names = [f"metric_{i}" for i in range(metrics)]
        self.label = label
        self.codec = default_codec()

    def encode(self, steps: range) -> list[tuple[bytes, bytes]]:
        """(key, value) of every event of ``steps``, in the order trainers would send them."""
        out = []
        now = time.time_ns()
        for step in steps:
            for run in range(self.runs):
                run_id = f"{self.label}-{run}"
                for rank in range(self.ranks):
                    event = {
                        "kind": "metrics",
                        "run_id": run_id,
                        "attempt": 0,
                        "step": step,
                        "stage": "rollout",
                        "rank": rank,
                        "world_size": self.ranks,
                        "metrics": {name: 0.1 * step + rank for name in self.names},
                        "tags": {},
                        "timestamp_ns": now,
                        "hostname": "bench",
                        "pid": 0,
                        "producer_id": f"{run_id}/{rank}",
                        "seq": step,
                    }
                    out.append((run_id.encode(), self.codec.encode("TrainerEvent", event)))
        return out

    def describe(self, **extra: Any) -> dict[str, Any]:
        return {"runs": self.runs, "ranks": self.ranks, "metrics_per_event": self.metrics, **extra}


def produce_all(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    producer = trainer_producer(bootstrap)
    for key, value in messages:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(120)


class BareAgentProcess(WorkerProcess):
    """This file run as ``bare-agent``: a faust agent that only decodes the events topic."""

    def __init__(self, bootstrap: str, prefix: str, log_file: Path, expect: int) -> None:
        super().__init__(bootstrap, prefix, log_file, partitions=PARTITIONS)
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
    from rlpulse.streams.app import batches, faust_app

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

    async def decode_only(stream: Any) -> None:
        nonlocal decoded, first
        async for events in batches(stream, settings):
            for event in events:
                codec.decode_event(event.message.value)
            decoded += len(events)
            if first is None:
                first = (time.time(), decoded)
            if decoded >= expect:
                Path(done_file).write_text(json.dumps([*first, time.time()]))

    topic = app.topic(Topics(prefix).events, key_type=bytes, value_type=bytes)
    app.agent(topic, name="bench.decode")(decode_only)
    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


def backlog(bootstrap: str, load: Load, steps: int) -> Topics:
    """Fresh topics whose events topic holds ``steps`` steps of ``load``."""
    topics = Topics(prefix=f"bench-tp-{uuid.uuid4().hex[:8]}")
    ensure_topics(Settings(bootstrap=bootstrap), topics, partitions=PARTITIONS)
    produce_all(bootstrap, topics.events, load.encode(range(steps)))
    return topics


def drain_rates(
    bootstrap: str, load: Load, steps: int, workdir: Path, baseline: Path | None
) -> dict[str, float]:
    """Events/s of the bare agent and the worker (and a baseline worker) over one backlog."""
    topics = backlog(bootstrap, load, steps)
    events = load.runs * load.ranks * steps
    shape = load.describe(steps=steps)
    rates = {"bare": bare_rate(bootstrap, topics, events, workdir)}
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
    drain = worker_rate(bootstrap, topics, load.runs * steps, workdir)
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


def bare_rate(bootstrap: str, topics: Topics, events: int, workdir: Path) -> float:
    agent = BareAgentProcess(bootstrap, topics.prefix, workdir / "bare-agent.log", events)
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
) -> Drain:
    """Summaries per second from the first to the last of ``want``, and whether all came.

    Counting from the first summary leaves the worker's start-up (table recovery) out.

    ``code``: run the worker from that source tree instead; ``profile``: under cProfile.
    """
    reader = consumer(bootstrap, topics.steps)
    log = workdir / f"{topics.prefix}-worker.log"
    worker = (
        WorkerProcess(bootstrap, topics.prefix, log, partitions=PARTITIONS)
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


class BackgroundLoad(threading.Thread):
    """Produces pre-encoded events at a steady rate until stopped."""

    def __init__(
        self, bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]], rate: float
    ):
        super().__init__(daemon=True)
        self.producer = trainer_producer(bootstrap)
        self.topic, self.messages, self.rate = topic, messages, rate
        self.sent = 0
        self.elapsed = 0.0
        self.halt = threading.Event()

    def run(self) -> None:
        started = time.perf_counter()
        while not self.halt.is_set() and self.sent < len(self.messages):
            due = min(len(self.messages), int((time.perf_counter() - started) * self.rate))
            for key, value in self.messages[self.sent : due]:
                try:
                    self.producer.produce(self.topic, key=key, value=value)
                except BufferError:
                    break
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.005)
        self.elapsed = time.perf_counter() - started
        self.producer.flush(30)


def probe(run_id: str, ranks: int, settings: Settings, reader: Consumer) -> float | None:
    """Milliseconds from a kl-guard run's firing event to its command; None after 30 s."""
    codec = default_codec()
    loggers = [
        EventLogger(run_id, rank=r, world_size=ranks, settings=settings) for r in range(ranks)
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
    latency = None
    deadline = time.monotonic() + 30
    while latency is None and time.monotonic() < deadline:
        message = reader.poll(0.01)
        if message is None or message.error() is not None:
            continue
        if codec.decode_command(message.value() or b"")["run_id"] == run_id:
            latency = (time.perf_counter() - produced) * 1000
    for logger in loggers:
        logger.close(10)
    return latency


def command_latency(
    bootstrap: str, samples: int, load: Load, rate: float, workdir: Path
) -> tuple[list[float], dict[str, Any]]:
    """Latencies of ``samples`` probes while ``load`` runs at ``rate``, and the load's shape."""
    topics = Topics(prefix=f"bench-lat-{uuid.uuid4().hex[:8]}")
    ensure_topics(Settings(bootstrap=bootstrap), topics, partitions=PARTITIONS)
    settings = Settings(bootstrap=bootstrap, prefix=topics.prefix)
    # enough background events for the whole phase: ~0.6 s per sample plus slack
    per_step = load.runs * load.ranks
    background = load.encode(range(int(rate * (samples * 0.6 + 30) / per_step) + 1))
    reader = consumer(bootstrap, topics.control)
    worker = WorkerProcess(bootstrap, topics.prefix, workdir / "lat-worker.log", partitions=6)
    worker.start()
    latencies: list[float] = []
    loader = BackgroundLoad(bootstrap, topics.events, background, rate)
    try:
        worker.wait_consuming(timeout_s=120)
        while not reader.assignment():
            reader.poll(0.1)
        # the first probe waits for the worker to finish starting (table recovery)
        probe("warm-up", load.ranks, settings, reader)
        loader.start()
        time.sleep(3.0)  # let the worker reach its steady state under the load
        cpu = CpuShare(worker)
        for sample in range(samples):
            latency = probe(f"lat-{sample}", load.ranks, settings, reader)
            if latency is not None:
                latencies.append(latency)
            if loader.is_alive():
                cpu.stop()  # while the background load runs
    finally:
        loader.halt.set()
        loader.join(60)
        worker.stop()
        reader.close()
    achieved = loader.sent / loader.elapsed if loader.elapsed else 0.0
    shape = load.describe(
        target_events_per_s=round(rate, 1),
        achieved_events_per_s=round(achieved, 1),
        probe_ranks=load.ranks,
        probes="one kl-guard run at a time",
        worker_cpu_share_under_load=cpu.share,
        machine_cpu_busy_under_load=cpu.machine_busy,
    )
    return latencies, shape


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
    parser.add_argument("--latency-samples", type=int, default=40)
    parser.add_argument("--load-fraction", type=float, default=0.8)
    parser.add_argument("--profile", type=Path, default=None)
    parser.add_argument(
        "--latency-at", type=float, default=None, help="only the latency phase, at this load"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="also measure a worker run from this source tree (e.g. an earlier commit)",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="rlpulse-bench-"))
    load = Load(args.runs, args.ranks, args.metrics, label="run")
    with bootstrap_or_local_broker(
        Settings(), Path(tempfile.mkdtemp(prefix="rlpulse-bench-"))
    ) as bootstrap:
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
            rates = drain_rates(bootstrap, load, args.steps, workdir, args.baseline)
        rate = args.load_fraction * rates["full"]
        background = Load(args.runs, args.ranks, args.metrics, label="bg")
        latencies, shape = command_latency(
            bootstrap, args.latency_samples, background, rate, workdir
        )
        p50, p99 = statistics.median(latencies), percentile(latencies, 99)
        emit(
            "command_latency",
            samples=len(latencies),
            p50_ms=round(p50, 2),
            p99_ms=round(p99, 2),
            max_ms=round(max(latencies), 2),
            in_order_ms=[round(x) for x in latencies],
            load=shape,
        )
        emit("latency_vs_kafka", p50_ratio=round(p50 / statistics.median(baseline), 1))
        emit(
            "targets",
            worker_events_per_s_ge_10000=rates["full"] >= 10_000,
            worker_ge_half_bare=rates["full"] >= 0.5 * rates["bare"],
            command_p99_lt_1s=p99 < 1000 and len(latencies) == args.latency_samples,
        )


if __name__ == "__main__":
    main()
