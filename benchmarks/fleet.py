"""Fleet benchmark: rlpulse at the size users run, on this machine.

Each rank is what a real rank is: its own ``RunLink`` (an ``EventLogger`` with its own
librdkafka producer, write-ahead log and sender thread; rank 0 adds the ``ControlClient``),
taking commands through ``poll_commands``, a collective over a real broadcast between
processes: the ranks of a run are spread over ``--nodes`` node processes, and a run's
broadcast goes between them over ``torch.distributed`` (gloo), then to the node's other
ranks (threads). Ranks log 16 metrics a step, one step every ``--step-s`` s; the worker runs
the seed rules plus a probe rule that answers every ``--probe-every``-th step with a command;
KL passes 0.3 ten steps before the end, so kl-guard stops every run.

Scenarios (``--scenarios``, default all): ``a`` one run of 1,024 ranks; ``b`` 64 runs of 64
ranks; ``c`` scenario b with 1, 2 and 3 workers in one group (``--workers``), and a drain of
a backlog of the fleet's events by each group (``drain``: those drains alone). Each prints
JSON lines:

- ``join``: last rank's ``log()`` of a step -> its StepSummary's emission: p50/p99/max, the
  summaries closed complete / by grace, revisions;
- ``fanout``: command issued -> every rank applied it (all at one step, asserted), p50/p99,
  and the ack's arrival; ``stop``: the steps between kl-guard's step and where it was applied;
- ``host``: the broker's CPU share and its connections, the worker(s)' CPU share and RSS,
  the node processes' RSS and threads, the machine's busy share;
- ``exporter``: series count and scrape time of ``/metrics``; ``prometheus``: the
  dashboard's heatmap and band queries over the run on a real Prometheus (Debian's);
- ``drain`` (scenario c): events/s of the group on a backlog, and per worker events per
  CPU-second.

Uses ``RLPULSE_BOOTSTRAP`` if set, otherwise starts (and stops) a local broker.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from figures import encoded_events, percentile, printer, produce_all

from rlpulse.local.broker import LocalBroker
from rlpulse.local.child_process import ChildProcess, free_port
from rlpulse.local.exporter_process import ExporterProcess
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.settings import ProducerSettings, Settings
from rlpulse.transport.clients import trainer_producer
from rlpulse.transport.topics import ensure_topics

emit = printer("fleet")
REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "compose" / "grafana" / "dashboards" / "rlpulse.json"
FILLERS = 13  # with kl_divergence, reward_mean and probe: 16 metrics an event
KL_GUARD_LEAD = 10  # KL passes 0.3 this many steps before the last step
PROBE_RULE = """
  - id: probe
    metric: probe
    stage: actor
    when: "> 0.5"
    actions:
      - checkpoint: {tag: probe}
"""


@dataclass(frozen=True)
class Plan:
    """What every node process runs (written to a file the nodes read)."""

    bootstrap: str
    prefix: str
    runs: list[str]
    ranks: int
    nodes: int
    steps: int
    step_s: float
    probe_every: int
    gloo_port: int
    out_dir: str
    spool_dir: str

    @property
    def kl_from(self) -> int:
        """The first step whose KL is above 0.3 (kl-guard is due two steps later)."""
        return self.steps - KL_GUARD_LEAD

    def metrics(self, step: int, rank: int) -> dict[str, float]:
        """The 16 metrics a rank logs at ``step``."""
        values = {f"m{i}": (step * 31 + rank * 7 + i) % 97 / 97 for i in range(FILLERS)}
        values["kl_divergence"] = 0.5 if step >= self.kl_from else 0.1
        values["reward_mean"] = 1.0
        values["probe"] = 1.0 if step and step % self.probe_every == 0 else 0.0
        return values


# -- a node: ranks as threads, a gloo broadcast between nodes -------------------------------


class NodeShare:
    """One run's broadcast on one node: the node's first rank takes part in the gloo
    broadcast between nodes; the node's other ranks wait for its result."""

    def __init__(self, group: Any, leader: int) -> None:
        self.group = group
        self.leader = leader
        self.calls: Counter[int] = Counter()
        self.results: dict[int, Any] = {}
        self.ready = threading.Condition()

    def for_rank(self, rank: int) -> Callable[[Any], Any]:
        """The broadcast function of ``rank`` (a thread of this node)."""

        def share(value: Any) -> Any:
            call = self.calls[rank]
            self.calls[rank] += 1
            if rank == self.leader:
                import torch.distributed as dist

                box = [value]
                dist.broadcast_object_list(box, src=0, group=self.group)
                with self.ready:
                    self.results[call] = box[0]
                    self.results.pop(call - 8, None)
                    self.ready.notify_all()
                return box[0]
            with self.ready:
                self.ready.wait_for(lambda: call in self.results)
                return self.results[call]

        return share


def run_node(plan_file: Path, node: int) -> None:
    """A node process: its share of every run's ranks, until each run is stopped or done."""
    import torch.distributed as dist

    from rlpulse.producers import RunLink

    plan = Plan(**json.loads(plan_file.read_text()))
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{plan.gloo_port}", rank=node, world_size=plan.nodes
    )
    groups = [dist.new_group(list(range(plan.nodes))) for _ in plan.runs]
    settings = Settings(
        bootstrap=plan.bootstrap,
        prefix=plan.prefix,
        producer=ProducerSettings(spool_dir=Path(plan.spool_dir)),
    )
    mine = [rank for rank in range(plan.ranks) if rank % plan.nodes == node]
    shares = [NodeShare(group, mine[0]) for group in groups]
    links = {
        (run, rank): RunLink(
            run, rank=rank, world_size=plan.ranks, settings=settings,
            broadcast=shares[index].for_rank(rank),
        )
        for index, run in enumerate(plan.runs)
        for rank in mine
    }  # fmt: skip
    log_ns: dict[tuple[str, int], int] = {}
    applied: list[tuple[str, str, int, int, int]] = []
    lock = threading.Lock()
    box = [time.time() + 3.0]
    dist.broadcast_object_list(box, src=0)  # every node starts step 0 at node 0's time
    start = float(box[0])

    def rank_loop(run: str, rank: int) -> None:
        link = links[(run, rank)]
        for step in range(plan.steps + KL_GUARD_LEAD):
            time.sleep(max(0.0, start + step * plan.step_s - time.time()))
            link.log(plan.metrics(step, rank), step, "actor")
            now = time.time_ns()
            with lock:
                log_ns[(run, step)] = max(log_ns.get((run, step), 0), now)
            for command in link.poll_commands(step=step):
                with lock:
                    applied.append((run, command["command_id"], step, rank, time.time_ns()))
                link.ack(command, "applied", applied_at_step=step)
            if link.stop_command is not None:
                break
        link.close(60.0, end=False)

    threads = [
        threading.Thread(target=rank_loop, args=key, name=f"rank-{key[0]}-{key[1]}")
        for key in links
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out = Path(plan.out_dir) / f"node-{node}.json"
    out.write_text(
        json.dumps(
            {
                "log_ns": [[run, step, ns] for (run, step), ns in log_ns.items()],
                "applied": applied,
                "rss_mb": _rss_mb(os.getpid()),
                "cpu_s": cpu_s(os.getpid()),
                "seconds": time.time() - start,
            }
        )
    )
    dist.destroy_process_group()


# -- the machine: CPU, memory, connections ---------------------------------------------------


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    return int(_stat(pid)[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def threads_of(pid: int) -> int:
    """How many threads process ``pid`` has."""
    return int(_stat(pid)[17])


def machine_busy() -> tuple[int, int]:
    """(busy, total) CPU ticks of the machine so far."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def connections(port: int) -> int:
    """Established TCP connections whose local port is ``port`` (the broker's side)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    count += 1
    return count


class Sampler(threading.Thread):
    """Samples CPU of the given processes and the broker's connections every second."""

    def __init__(self, pids: dict[str, int], broker_port: int) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.broker_port = broker_port
        self.stopping = threading.Event()
        self.start_cpu = {name: cpu_s(pid) for name, pid in pids.items()}
        self.start_wall = time.monotonic()
        self.start_busy = machine_busy()
        self.max_connections = 0
        self.max_rss: dict[str, float] = defaultdict(float)

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            self.max_connections = max(self.max_connections, connections(self.broker_port))
            for name, pid in self.pids.items():
                with contextlib.suppress(OSError):
                    self.max_rss[name] = max(self.max_rss[name], _rss_mb(pid))

    def shares(self) -> dict[str, Any]:
        """CPU share of each process (1.0 = one core) and the machine's busy share so far."""
        wall = time.monotonic() - self.start_wall
        busy, total = machine_busy()
        shares = {}
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                shares[name] = round((cpu_s(pid) - self.start_cpu[name]) / wall, 3)
        b0, t0 = self.start_busy
        return {
            "cpu_share": shares,
            "machine_busy": round((busy - b0) / max(total - t0, 1), 3),
            "max_rss_mb": {k: round(v) for k, v in self.max_rss.items()},
            "max_broker_connections": self.max_connections,
            "seconds": round(wall, 1),
        }


# -- Kafka: what the topics hold -------------------------------------------------------------


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[Any]:
    """Every message of ``topic`` up to the end each partition has now."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"fleet-{uuid.uuid4().hex}"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in partitions
        }
        todo = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in todo])
        found: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                if message.error() is not None:
                    continue
                found.append(message)
                if (message.offset() or 0) + 1 >= ends[message.partition() or 0]:
                    todo.discard(message.partition() or 0)
        return found
    finally:
        consumer.close()


# -- Prometheus over the run ----------------------------------------------------------------


class Prometheus(ChildProcess):
    """Debian's Prometheus scraping the exporter every ``interval_s``."""

    def __init__(self, workdir: Path, target: str, interval_s: float) -> None:
        super().__init__(workdir / "prometheus.log")
        binary = shutil.which("prometheus")
        if binary is None:
            raise SystemExit("prometheus is not on PATH: apt-get install prometheus")
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": f"{interval_s:g}s", "scrape_timeout": f"{interval_s:g}s"},
            "scrape_configs": [{"job_name": "rlpulse", "static_configs": [{"targets": [target]}]}],
        }
        (workdir / "prometheus.yml").write_text(json.dumps(config))

    def command(self) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> tuple[int, float]:
        """(series returned, seconds the query took)."""
        params = urllib.parse.urlencode(
            {"query": expr, "start": start, "end": end, "step": f"{step_s:g}"}
        )
        began = time.perf_counter()
        url = f"http://127.0.0.1:{self.port}/api/v1/query_range?{params}"
        with urllib.request.urlopen(url, timeout=120) as response:
            body = json.loads(response.read())
        return len(body["data"]["result"]), time.perf_counter() - began


def dashboard_queries() -> dict[str, str]:
    """The dashboard's KL heatmap and reward band queries, with one run's variables filled."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    wanted = {
        "heatmap": "KL divergence per rank (drift heatmap)",
        "band": "Reward: mean over ranks, \u00b11 std band",
    }
    found: dict[str, str] = {}
    for panel in panels:
        for name, title in wanted.items():
            if panel.get("title") == title:
                for index, target in enumerate(panel["targets"]):
                    found[f"{name}_{index}"] = target["expr"]
    return found


# -- one scenario ---------------------------------------------------------------------------


def rules_file(directory: Path) -> Path:
    seed = (REPO / "rlpulse" / "rules" / "presets" / "seed.yaml").read_text()
    path = directory / "fleet-rules.yaml"
    path.write_text(seed.rstrip() + "\n" + PROBE_RULE)
    return path


def scenario(
    name: str, args: argparse.Namespace, bootstrap: str, broker_pid: int, broker_port: int,
    runs: int, ranks: int, workers: int, work: Path,
) -> None:  # fmt: skip
    """Run one fleet and print its figures."""
    prefix = f"fleet-{name}-{uuid.uuid4().hex[:6]}"
    topics = Topics(prefix)
    settings = Settings(bootstrap=bootstrap, prefix=prefix)
    ensure_topics(settings, topics, partitions=args.partitions)
    started: list[Any] = []  # stopped whatever happens
    nodes: list[subprocess.Popen[bytes]] = []
    try:
        rules = rules_file(work)
        group = [
            WorkerProcess(
                bootstrap, prefix, work / f"{name}-worker-{i}.log", rules=str(rules),
                partitions=args.partitions, grace_s=args.grace_s,
            ).start()
            for i in range(workers)
        ]  # fmt: skip
        started += group
        exporter = ExporterProcess(bootstrap, prefix, work / f"{name}-exporter.log", free_port())
        exporter.start()
        started.append(exporter)
        prometheus = Prometheus(work / f"{name}-prometheus", f"127.0.0.1:{exporter.port}", 5.0)
        prometheus.start()
        started.append(prometheus)
        for worker in group:
            worker.wait_consuming(timeout_s=120)
        exporter.wait_ready()
        plan = Plan(
            bootstrap, prefix, [f"{name}-run-{i:02d}" for i in range(runs)], ranks,
            min(args.nodes, ranks), args.steps, args.step_s, args.probe_every, free_port(),
            str(work / f"{name}-out"), str(work / f"{name}-spool"),
        )  # fmt: skip
        Path(plan.out_dir).mkdir(parents=True, exist_ok=True)
        plan_file = work / f"{name}-plan.json"
        plan_file.write_text(json.dumps(asdict(plan)))
        pids = {"broker": broker_pid, **{f"worker_{i}": w.process.pid for i, w in enumerate(group)}}  # type: ignore[union-attr]
        began = time.time()
        nodes = [
            subprocess.Popen(
                [sys.executable, __file__, "node", str(plan_file), str(node)],
                stdout=(work / f"{name}-node-{node}.log").open("w"), stderr=subprocess.STDOUT,
            )
            for node in range(plan.nodes)
        ]  # fmt: skip
        sampler = Sampler(
            {**pids, **{f"node_{i}": p.pid for i, p in enumerate(nodes)}}, broker_port
        )
        sampler.start()
        node_threads = 0
        deadline = time.monotonic() + (plan.steps + KL_GUARD_LEAD) * plan.step_s + 600
        while any(node.poll() is None for node in nodes) and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                node_threads = max(node_threads, sum(threads_of(n.pid) for n in nodes))
            time.sleep(2.0)
        for node in nodes:
            if node.poll() is None:
                node.kill()
        host = sampler.shares()
        sampler.stopping.set()
        ended = time.time()
        failed = [i for i, node in enumerate(nodes) if node.wait() != 0]
        if failed:
            raise SystemExit(f"node(s) {failed} failed; see {work}/{name}-node-*.log")
        outputs = [
            json.loads((Path(plan.out_dir) / f"node-{n}.json").read_text())
            for n in range(plan.nodes)
        ]
        time.sleep(max(5.0, args.grace_s / 3))  # the last summaries and acks land
        report(name, plan, bootstrap, topics, outputs, group, workers)
        emit(
            "host", scenario=name, runs=runs, ranks=ranks, workers=workers, nodes=plan.nodes,
            node_threads=node_threads,
            node_rss_mb=[round(o["rss_mb"]) for o in outputs],
            rank_cpu_ms_per_s=round(
                sum(o["cpu_s"] for o in outputs) * 1000
                / (runs * ranks * max(o["seconds"] for o in outputs)), 3,
            ),
            **host,
        )  # fmt: skip
        scrape_figures(name, exporter)
        query_figures(name, prometheus, began, ended)
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
        for process in reversed(started):
            process.stop()


def report(
    name: str, plan: Plan, bootstrap: str, topics: Topics, outputs: list[dict[str, Any]],
    group: list[WorkerProcess], workers: int,
) -> None:  # fmt: skip
    """Join latency, command fan-out and the stop's step, from the topics and the nodes."""
    codec = default_codec()
    last_log: dict[tuple[str, int], int] = {}
    for output in outputs:
        for run, step, ns in output["log_ns"]:
            last_log[(run, step)] = max(last_log.get((run, step), 0), ns)
    summaries = [
        codec.decode_summary(m.value() or b"") for m in read_topic(bootstrap, topics.steps)
    ]
    mine = [s for s in summaries if s["stage"] == "actor" and s["run_id"] in plan.runs]
    firsts = {(s["run_id"], s["step"]): s for s in mine if s["revision"] == 1}
    join_ms = [
        (s["emitted_ns"] - last_log[key]) / 1e6 for key, s in firsts.items() if key in last_log
    ]
    closed = Counter(s["closed_by"] for s in firsts.values())
    if not join_ms:
        dead = [w.log_file.name for w in group if not w.alive()]
        raise SystemExit(
            f"scenario {name}: no StepSummary of the {len(last_log)} steps logged; "
            f"worker(s) exited: {dead or 'none'} (their logs are in {group[0].log_file.parent})"
        )
    emit(
        "join", scenario=name, workers=workers, summaries=len(firsts), steps_logged=len(last_log),
        revisions=len(mine) - len(firsts), closed_by=dict(closed),
        p50_ms=round(percentile(join_ms, 50), 1), p99_ms=round(percentile(join_ms, 99), 1),
        max_ms=round(max(join_ms), 1),
    )  # fmt: skip
    commands = {
        c["command_id"]: c
        for c in (
            codec.decode_command(m.value() or b"") for m in read_topic(bootstrap, topics.control)
        )
        if c["run_id"] in plan.runs
    }
    acks = {}
    for message in read_topic(bootstrap, topics.acks):
        ack = codec.decode_ack(message.value() or b"")
        acks[ack["command_id"]] = message.timestamp()[1] * 1_000_000
    applied: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for output in outputs:
        for _run, command_id, step, rank, ns in output["applied"]:
            applied[command_id].append((rank, step, ns))
    fanout_ms, ack_ms, split, partial = [], [], 0, 0
    for command_id, command in commands.items():
        got = applied.get(command_id, [])
        if len({rank for rank, _, _ in got}) < plan.ranks:
            partial += 1
            continue
        if len({step for _, step, _ in got}) != 1:
            split += 1
        fanout_ms.append((max(ns for _, _, ns in got) - command["issued_ns"]) / 1e6)
        if command_id in acks:
            ack_ms.append((acks[command_id] - command["issued_ns"]) / 1e6)
    stops = [
        step
        for command_id, command in commands.items()
        if command["rule_id"] == "kl-guard"
        for _, step, _ in applied.get(command_id, [])[:1]
    ]
    due = plan.kl_from + 2
    emit(
        "fanout", scenario=name, workers=workers, commands=len(commands),
        applied_everywhere=len(fanout_ms), not_on_every_rank=partial, not_at_one_step=split,
        p50_ms=round(percentile(fanout_ms, 50), 1) if fanout_ms else None,
        p99_ms=round(percentile(fanout_ms, 99), 1) if fanout_ms else None,
        ack_p50_ms=round(percentile(ack_ms, 50), 1) if ack_ms else None,
        ack_p99_ms=round(percentile(ack_ms, 99), 1) if ack_ms else None,
    )  # fmt: skip
    emit(
        "stop", scenario=name, workers=workers, runs=len(plan.runs), stopped=len(stops),
        due_step=due, steps_late_max=max((s - due for s in stops), default=None),
        steps_late_p50=percentile([s - due for s in stops], 50) if stops else None,
    )  # fmt: skip
    for index, worker in enumerate(group):
        emit("worker_log", scenario=name, worker=index, holding=_holding(worker))


def _holding(worker: WorkerProcess) -> list[str]:
    return [line for line in worker.log_text().splitlines() if "holding" in line][-2:]


def scrape_figures(name: str, exporter: ExporterProcess) -> None:
    """Series count and scrape time of the exporter's /metrics (three scrapes)."""
    times, series, size = [], 0, 0
    for _ in range(3):
        began = time.perf_counter()
        text = exporter.scrape(timeout_s=60)
        times.append(time.perf_counter() - began)
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        size = len(text)
    emit(
        "exporter", scenario=name, series=series, bytes=size,
        scrape_s_median=round(sorted(times)[1], 3), scrape_s_max=round(max(times), 3),
    )  # fmt: skip


def query_figures(name: str, prometheus: Prometheus, start: float, end: float) -> None:
    """The dashboard's heatmap and band queries over the run (the first run's variables)."""
    for label, expr in dashboard_queries().items():
        filled = (
            expr.replace("$run", ".*").replace("$stage", "actor").replace("${namespace}", "rlpulse")
        )
        series, took = prometheus.query_range(filled, start, end, 5.0)
        emit("prometheus", scenario=name, query=label, series=series, seconds=round(took, 3))


def drain(
    args: argparse.Namespace, bootstrap: str, runs: int, ranks: int, workers: int, work: Path
) -> None:
    """A backlog of the fleet's events (``--drain-steps`` steps) through a group of workers."""
    prefix = f"fleet-drain-{uuid.uuid4().hex[:6]}"
    topics = Topics(prefix)
    settings = Settings(bootstrap=bootstrap, prefix=prefix)
    ensure_topics(settings, topics, partitions=args.partitions)
    backlog = encoded_events("drain", runs, ranks, 16, range(args.drain_steps))
    producer = trainer_producer(settings, "fleet backlog")
    produce_all(producer, topics.events, backlog)
    steps_wanted = runs * args.drain_steps
    ports = [free_port() for _ in range(workers)]
    group = [
        WorkerProcess(
            bootstrap, prefix, work / f"drain-{workers}-{i}.log", rules="seed",
            partitions=args.partitions, grace_s=args.grace_s,
            extra_args=("--metrics-port", str(port), "--metrics-host", "127.0.0.1"),
        ).start()
        for i, port in enumerate(ports)
    ]  # fmt: skip
    try:
        for worker in group:
            worker.wait_consuming(timeout_s=120)
        cpu0 = [cpu_s(w.process.pid) for w in group]  # type: ignore[union-attr]
        began = time.monotonic()
        codec = default_codec()
        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": f"fleet-{uuid.uuid4().hex}",
             "auto.offset.reset": "earliest"}
        )  # fmt: skip
        consumer.subscribe([topics.steps])
        seen: set[tuple[str, int]] = set()
        last = began
        deadline = began + 900
        while len(seen) < steps_wanted and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                if message.error() is None:
                    summary = codec.decode_summary(message.value() or b"")
                    seen.add((summary["run_id"], summary["step"]))
                    last = time.monotonic()
        consumer.close()
        seconds = last - began
        cpu = [cpu_s(w.process.pid) - c for w, c in zip(group, cpu0, strict=True)]  # type: ignore[union-attr]
        events = len(backlog)
        per_worker = [_events_counted(port) for port in ports]
        emit(
            "drain", workers=workers, events=events, summaries=len(seen), seconds=round(seconds, 1),
            events_per_s=round(events / seconds), worker_cpu_s=[round(c, 1) for c in cpu],
            worker_events=per_worker,
            events_per_cpu_s=[round(e / c) for e, c in zip(per_worker, cpu, strict=True) if c],
        )  # fmt: skip
    finally:
        for worker in group:
            worker.stop()


def _events_counted(port: int) -> int:
    """``rlpulse_events_total`` of the worker serving its metrics on ``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(
        int(float(line.split()[-1]))
        for line in text.splitlines()
        if line.startswith("rlpulse_events_total")
    )


@contextlib.contextmanager
def kafka(work: Path) -> Iterator[tuple[str, int, int]]:
    """(bootstrap, broker pid, broker port): ``RLPULSE_BOOTSTRAP``'s, or a local broker's."""
    configured = os.environ.get("RLPULSE_BOOTSTRAP")
    if configured:
        raise SystemExit("fleet.py measures the broker's CPU: run it on its own local broker")
    broker = LocalBroker(Settings(), state_dir=work / "broker", port=0)
    record = broker.up()
    try:
        yield record.bootstrap, record.pid, record.port
    finally:
        broker.down()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "node":
        run_node(Path(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenarios", default="a,b,c", help="a, b, c, drain (c's drains alone); comma-separated"
    )
    parser.add_argument("--nodes", type=int, default=8, help="node processes a run spans")
    parser.add_argument("--steps", type=int, default=60, help="steps of each run")
    parser.add_argument("--step-s", type=float, default=2.0, help="seconds between steps")
    parser.add_argument("--probe-every", type=int, default=5, help="a command every N steps")
    parser.add_argument("--partitions", type=int, default=12, help="of the run-keyed topics")
    parser.add_argument("--grace-s", type=float, default=30.0, help="the worker's grace")
    parser.add_argument("--workers", default="1,2,3", help="group sizes of scenario c")
    parser.add_argument("--drain-steps", type=int, default=20, help="backlog of the drains")
    parser.add_argument("--a-ranks", type=int, default=1024)
    parser.add_argument("--b-runs", type=int, default=64)
    parser.add_argument("--b-ranks", type=int, default=64)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    chosen = set(args.scenarios.split(","))
    unknown = sorted(chosen - {"a", "b", "c", "drain"})
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}: choose from a, b, c, drain")
    work = Path(tempfile.mkdtemp(prefix="rlpulse-fleet-"))
    emit("setup", work=str(work), cores=os.cpu_count(), **{k: v for k, v in vars(args).items()})
    try:
        with kafka(work) as (bootstrap, broker_pid, broker_port):
            common = (args, bootstrap, broker_pid, broker_port)
            if "a" in chosen:
                scenario("a", *common, runs=1, ranks=args.a_ranks, workers=1, work=work)
            if "b" in chosen:
                scenario("b", *common, runs=args.b_runs, ranks=args.b_ranks, workers=1, work=work)
            if "drain" in chosen:  # the drains of scenario c alone, without the fleets
                for workers in (int(n) for n in args.workers.split(",")):
                    drain(args, bootstrap, args.b_runs, args.b_ranks, workers, work)
            if "c" in chosen:
                for workers in (int(n) for n in args.workers.split(",")):
                    if workers > 1:
                        scenario(
                            f"c{workers}", *common, runs=args.b_runs, ranks=args.b_ranks,
                            workers=workers, work=work,
                        )  # fmt: skip
                    drain(args, bootstrap, args.b_runs, args.b_ranks, workers, work)

    except BaseException:
        print(f"kept {work}: every process's log is there", file=sys.stderr)
        raise
    if args.keep:
        print(f"kept {work}", file=sys.stderr)
    else:  # the ranks' write-ahead logs and the broker's data: gigabytes at 1,024 ranks
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
