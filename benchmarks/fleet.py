"""Fleet benchmark: rlpulse at the size users run, hosts packed into processes on this machine.

A host is one process: its ranks are threads, each a real ``RunLink`` with its own write-ahead
log (1 MiB segments), and the host has its own agent, which its ranks start by themselves
(``producer.hostname`` differs per host, so each host has an agent of its own, as on a
cluster). No process imports torch: a run's broadcast (``poll_commands``' collective) crosses
hosts over sockets: the host of rank 0 sends rank 0's list to one thread of every other host
of the run, which hands it to that host's other ranks. rlpulse owns poll -> broadcast call ->
apply on every rank; the broadcast is the benchmark's, as it is the user's. What the packing
changes: 128 hosts share two cores with the broker and the worker, which on a cluster have
machines of their own, so the hosts (and the agents they start) run in the idle scheduling
class (``chrt --idle``: they get the CPU the broker, the worker and the agents leave; the
agents are given the normal class back, as an agent on a node has cores beside the ranks'),
and they are started 16 at a time, each batch once its agents deliver.

Ranks log 16 metrics a step, one step every ``--step-s`` s (1 s: a command issued for a
step is applied at the next step's poll, so fan-out is about one step); the worker runs the
seed rules
plus a probe rule that answers every ``--probe-every``-th step with a command; KL passes 0.3
ten steps before the end, so kl-guard stops every run. Scenarios (``--scenarios``):

- ``a``: one run of ``--a-ranks`` (1,024) ranks as hosts of ``--a-host-ranks`` (8), and
  ``--capture-at-s`` (15) seconds into it an operator's ``capture_stacks``: how long until
  the last rank's stacks are on the logs topic (``capture``) and in the archive's Parquet
  files (``capture_archived``: an archiver runs beside the worker, writing at least every
  2 s), the agents' CPU for it, and the stacks grouped as ``rlpulse show --stacks`` does;
- ``b``: ``--b-runs`` (64) runs of ``--b-ranks`` (64) ranks on ``--b-hosts`` (64) hosts of 64
  ranks: each run spans 8 hosts, each host holds 8 runs' ranks, the runs' step phases
  staggered over the step as on a real cluster;
- ``c``: one run of 8 ranks on one host whose rank 1 is a process of its own, SIGKILLed
  mid-run ``--kills`` (10) times and started again each time: from each kill to the moment
  every record that rank's ``log()`` accepted (events and text records) is on its topic,
  none twice, while the host's other ranks train on.

Each prints JSON lines: ``join`` (last rank's ``log()`` -> its StepSummary's emission,
p50/p99), ``fanout`` (issued -> every rank applied, all at one step, p50/p99; and its two
parts: issued -> rank 0's next poll, the loop's own wait, and that poll -> every rank
applied), ``stop`` (steps between kl-guard's due step and where it was applied), ``host``
(broker connections; CPU share and RSS of the agents, the host processes, the broker and the
worker; the machine's busy share), ``kill`` (scenario c). Uses its own local broker (it
measures the broker).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from figures import percentile, printer

from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.local.broker import LocalBroker
from rlpulse.local.child_process import free_port
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers.delivery.agent_place import agent_alive, agents_under, read_json
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.settings import AgentSettings, ProducerSettings, Settings
from rlpulse.transport.partitioning import partition_for
from rlpulse.transport.topics import ensure_topics

emit = printer("fleet")
REPO = Path(__file__).resolve().parents[1]
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
SEGMENT_BYTES = 1 << 20  # 4,096 logs reserve 4 GiB, not 32
_FRAME = struct.Struct("<I")


@dataclass(frozen=True)
class Plan:
    """What every host process runs (written to a file the hosts read)."""

    bootstrap: str
    prefix: str
    runs: list[str]
    ranks: int
    hosts: list[list[tuple[str, int]]]
    """Per host, its (run, rank) pairs."""
    bus_ports: dict[str, int]
    """Per run, the port the host of its rank 0 listens on for the other hosts."""
    steps: int
    step_s: float
    probe_every: int
    stagger: bool
    out_dir: str
    spool_dir: str
    go_file: str

    @property
    def kl_from(self) -> int:
        """The first step whose KL is above 0.3 (kl-guard is due two steps later)."""
        return self.steps - KL_GUARD_LEAD

    def offset_s(self, run: str) -> float:
        """Where in the step the run's steps fall (staggered runs spread over the step)."""
        if not self.stagger:
            return 0.0
        return self.runs.index(run) / len(self.runs) * self.step_s

    def metrics(self, step: int, rank: int) -> dict[str, float]:
        """The 16 metrics a rank logs at ``step``."""
        values = {f"m{i}": (step * 31 + rank * 7 + i) % 97 / 97 for i in range(FILLERS)}
        values["kl_divergence"] = 0.5 if step >= self.kl_from else 0.1
        values["reward_mean"] = 1.0
        values["probe"] = 1.0 if step and step % self.probe_every == 0 else 0.0
        return values


def host_settings(plan: Plan, host: int) -> Settings:
    """A host's settings: its own name (so its own agent) and small write-ahead log segments."""
    producer = ProducerSettings(
        spool_dir=Path(plan.spool_dir) / f"host-{host:03d}",
        hostname=f"fleet-host-{host:03d}",
        spool_file_bytes=SEGMENT_BYTES,
        spool_max_bytes=64 * SEGMENT_BYTES,
    )
    agent = AgentSettings(idle_exit_s=5.0)  # gone soon after the run, as the benchmark ends
    return Settings(bootstrap=plan.bootstrap, prefix=plan.prefix, producer=producer, agent=agent)


# -- a run's broadcast between hosts ---------------------------------------------------------


def _send(sock: socket.socket, value: Any) -> None:
    data = pickle.dumps(value)
    sock.sendall(_FRAME.pack(len(data)) + data)


def _receive(sock: socket.socket) -> Any:
    def exactly(count: int) -> bytes:
        parts, left = [], count
        while left:
            part = sock.recv(left)
            if not part:
                raise ConnectionError("the run's root host closed the connection")
            parts.append(part)
            left -= len(part)
        return b"".join(parts)

    (length,) = _FRAME.unpack(exactly(_FRAME.size))
    return pickle.loads(exactly(length))


class HostBus:
    """One run's broadcast on one host.

    On the host of rank 0, rank 0's thread sends its value to every other host of the run;
    elsewhere the host's first rank receives it. The host's other ranks wait for that value.
    Connections are made in the background (hosts start in batches, the run's root host
    perhaps after some of its peers): the first broadcast waits until they are all there.
    """

    def __init__(
        self, plan: Plan, run: str, leader: int, root: bool, peers: int, local: int
    ) -> None:
        self.leader = leader
        self.root = root
        self.expected = peers if root else 1
        self.peers: list[socket.socket] = []
        self.calls: Counter[int] = Counter()
        self.local = local  # the run's ranks on this host: each takes every result once
        self.results: dict[int, list[Any]] = {}  # call -> [value, ranks yet to take it]
        self.ready = threading.Condition()
        target = self._accept if root else self._connect
        threading.Thread(target=target, args=(plan.bus_ports[run],), daemon=True).start()

    def _accept(self, port: int) -> None:
        listener = socket.create_server(("127.0.0.1", port), backlog=256)
        for _ in range(self.expected):
            peer, _address = listener.accept()
            with self.ready:
                self.peers.append(peer)
                self.ready.notify_all()
        listener.close()

    def _connect(self, port: int) -> None:
        while True:
            try:
                peer = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.2)
        with self.ready:
            self.peers.append(peer)
            self.ready.notify_all()

    def for_rank(self, rank: int) -> Callable[[Any], Any]:
        """The broadcast function of ``rank`` (a thread of this host)."""

        def share(value: Any) -> Any:
            call = self.calls[rank]
            self.calls[rank] += 1
            if rank == self.leader:
                with self.ready:
                    self.ready.wait_for(lambda: len(self.peers) == self.expected)
                if self.root:
                    for peer in self.peers:
                        _send(peer, value)
                    result = value
                else:
                    result = _receive(self.peers[0])
                if self.local > 1:
                    with self.ready:
                        self.results[call] = [result, self.local - 1]
                        self.ready.notify_all()
                return result
            with self.ready:  # a rank that lags steps behind its leader still finds its value
                self.ready.wait_for(lambda: call in self.results)
                taken = self.results[call]
                taken[1] -= 1
                if taken[1] == 0:
                    del self.results[call]
                return taken[0]

        return share


def connect_buses(plan: Plan, host: int) -> dict[str, HostBus]:
    """This host's bus of each run it has ranks of."""
    hosts_of: dict[str, set[int]] = defaultdict(set)
    for index, pairs in enumerate(plan.hosts):
        for run, _rank in pairs:
            hosts_of[run].add(index)
    mine = plan.hosts[host]
    buses = {}
    for run in sorted({run for run, _rank in mine}):
        ranks = sorted(rank for r, rank in mine if r == run)
        root = 0 in ranks
        buses[run] = HostBus(
            plan, run, 0 if root else ranks[0], root, len(hosts_of[run]) - 1, len(ranks)
        )
    return buses


# -- a host ------------------------------------------------------------------------------------


def run_host(plan_file: Path, host: int) -> None:
    """A host process: its ranks as threads, until each run is stopped or done."""
    from rlpulse.producers import RunLink

    plan = Plan(**json.loads(plan_file.read_text()))
    settings = host_settings(plan, host)
    buses = connect_buses(plan, host)
    links = {
        (run, rank): RunLink(
            run, rank=rank, world_size=plan.ranks, settings=settings,
            broadcast=buses[run].for_rank(rank),
        )
        for run, rank in plan.hosts[host]
    }  # fmt: skip
    for (_run, rank), link in links.items():  # as a trainer does at its start: its agent runs
        if rank == 0:
            link.run_start(0)
        else:
            link.log({"up": 1.0}, 0, "setup")
    for link in links.values():
        link.flush(300)  # the host's agent runs and delivers
    (Path(plan.out_dir) / f"ready-{host}").touch()
    go = Path(plan.go_file)
    while not go.exists():
        time.sleep(0.05)
    start = float(go.read_text())
    log_ns: dict[tuple[str, int], int] = {}
    applied: list[tuple[str, str, int, int, int]] = []
    polled: dict[str, int] = {}
    lock = threading.Lock()

    def rank_loop(run: str, rank: int) -> None:
        link = links[(run, rank)]
        offset = plan.offset_s(run)
        for step in range(plan.steps + KL_GUARD_LEAD):
            time.sleep(max(0.0, start + offset + step * plan.step_s - time.time()))
            link.log(plan.metrics(step, rank), step, "actor")
            now = time.time_ns()
            with lock:
                log_ns[(run, step)] = max(log_ns.get((run, step), 0), now)
            poll_ns = time.time_ns()
            for command in link.poll_commands(step=step):
                if rank == 0:
                    polled[command["command_id"]] = poll_ns
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
    peak_threads = threading.active_count()
    for thread in threads:
        thread.join()
    (Path(plan.out_dir) / f"host-{host}.json").write_text(
        json.dumps(
            {
                "log_ns": [[run, step, ns] for (run, step), ns in log_ns.items()],
                "applied": applied,
                "polled": polled,
                "rss_mb": _rss_mb(os.getpid()),
                "cpu_s": cpu_s(os.getpid()),
                "threads": peak_threads,
                "seconds": time.time() - start,
            }
        )
    )


# -- the machine: CPU, memory, connections ---------------------------------------------------


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    return int(_stat(pid)[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20


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


def agent_pids(spool: Path) -> list[int]:
    """The pids of the live agents kept under ``spool`` (each host's root below it)."""
    pids = []
    for root in sorted(spool.glob("host-*")):
        for directory in agents_under(root):
            pid = (read_json(directory / "agent.json") or {}).get("pid")
            if isinstance(pid, int) and agent_alive(directory / "lock"):
                pids.append(pid)
    return pids


@dataclass(eq=False)
class Sampler(threading.Thread):
    """Every second: CPU of named processes and groups, RSS, the broker's connections."""

    pids: dict[str, int]
    groups: dict[str, Callable[[], list[int]]]
    broker_port: int
    stopping: threading.Event = field(default_factory=threading.Event)
    max_connections: int = 0
    max_rss: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    cpu_seen: dict[int, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(daemon=True)
        self.start_wall = time.monotonic()
        self.start_busy = machine_busy()
        self.start_cpu = {name: cpu_s(pid) for name, pid in self.pids.items()}
        self.group_pids: dict[str, set[int]] = defaultdict(set)

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            self.max_connections = max(self.max_connections, connections(self.broker_port))
            for name, pid in self.pids.items():
                with contextlib.suppress(OSError):
                    self.max_rss[name] = max(self.max_rss[name], _rss_mb(pid))
            for name, pids_now in self.groups.items():
                total_rss = 0.0
                for pid in pids_now():
                    with contextlib.suppress(OSError):
                        used = cpu_s(pid)
                        first = self.cpu_seen.get(pid, (used, used))[0]
                        self.cpu_seen[pid] = (first, used)
                        self.group_pids[name].add(pid)
                        total_rss += _rss_mb(pid)
                self.max_rss[name] = max(self.max_rss[name], total_rss)

    def shares(self) -> dict[str, Any]:
        """CPU share of each process and group (1.0 = one core), and the machine's."""
        wall = time.monotonic() - self.start_wall
        busy, total = machine_busy()
        shares: dict[str, float] = {}
        for name, pid in self.pids.items():
            with contextlib.suppress(OSError):
                shares[name] = round((cpu_s(pid) - self.start_cpu[name]) / wall, 3)
        for name, pids in self.group_pids.items():
            used = sum(last - first for pid, (first, last) in self.cpu_seen.items() if pid in pids)
            shares[name] = round(used / wall, 3)
        b0, t0 = self.start_busy
        return {
            "cpu_share": shares,
            "machine_busy": round((busy - b0) / max(total - t0, 1), 3),
            "max_rss_mb": {k: round(v) for k, v in self.max_rss.items()},
            "processes": {k: len(v) for k, v in self.group_pids.items()},
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


# -- scenarios a and b ----------------------------------------------------------------------


def rules_file(directory: Path) -> Path:
    seed = (REPO / "rlpulse" / "rules" / "presets" / "seed.yaml").read_text()
    path = directory / "fleet-rules.yaml"
    path.write_text(seed.rstrip() + "\n" + PROBE_RULE)
    return path


def layout_a(ranks: int, per_host: int) -> list[list[tuple[str, int]]]:
    """One run's ranks, ``per_host`` consecutive ones a host."""
    return [
        [("a-run-00", rank) for rank in range(first, min(first + per_host, ranks))]
        for first in range(0, ranks, per_host)
    ]


def layout_b(runs: int, ranks: int, hosts: int) -> list[list[tuple[str, int]]]:
    """Each run in blocks of 8 ranks on consecutive hosts (wrapping): with 64 runs of 64
    ranks on 64 hosts, each run spans 8 hosts and each host holds 8 runs' ranks."""
    layout: list[list[tuple[str, int]]] = [[] for _ in range(hosts)]
    block = 8 if ranks % 8 == 0 else ranks
    spans = ranks // block
    for run in range(runs):
        for part in range(spans):
            ranks_here = range(part * block, (part + 1) * block)
            layout[(run * spans + part) % hosts] += [(f"b-run-{run:02d}", r) for r in ranks_here]
    return layout


def scenario(
    name: str, args: argparse.Namespace, bootstrap: str, broker_pid: int, broker_port: int,
    layout: list[list[tuple[str, int]]], ranks: int, stagger: bool, work: Path,
) -> None:  # fmt: skip
    """Run one fleet of hosts and print its figures."""
    prefix = f"fleet-{name}-{uuid.uuid4().hex[:6]}"
    topics = Topics(prefix)
    ensure_topics(Settings(bootstrap=bootstrap, prefix=prefix), topics, partitions=args.partitions)
    runs = sorted({run for host in layout for run, _rank in host})
    hosts: list[subprocess.Popen[bytes]] = []
    worker: WorkerProcess | None = None
    archiver: ArchiverProcess | None = None
    out = work / f"{name}-out"
    out.mkdir(parents=True, exist_ok=True)
    spool = work / f"{name}-spool"
    try:
        worker = WorkerProcess(
            bootstrap, prefix, work / f"{name}-worker.log", rules=str(rules_file(work)),
            partitions=args.partitions, grace_s=args.grace_s,
        ).start()  # fmt: skip
        worker.wait_consuming(timeout_s=180)
        if name == "a" and args.capture_at_s > 0:  # the capture is timed to the archive too
            archiver = ArchiverProcess(
                bootstrap, prefix, work / f"{name}-archive", work / f"{name}-archiver.log",
                {"archive.roll_s": ARCHIVE_ROLL_S},
            ).start()  # fmt: skip
        plan = Plan(
            bootstrap, prefix, runs, ranks, layout, {run: free_port() for run in runs},
            args.steps, args.step_s, args.probe_every, stagger, str(out), str(spool),
            str(work / f"{name}-go"),
        )  # fmt: skip
        plan_file = work / f"{name}-plan.json"
        plan_file.write_text(json.dumps(asdict(plan)))
        began_start = time.monotonic()
        deadline = time.monotonic() + 1800
        for first in range(0, len(layout), args.start_batch):  # a burst of 256 starting
            for host in range(first, min(first + args.start_batch, len(layout))):  # processes
                hosts.append(  # would starve the broker and the worker on two cores
                    subprocess.Popen(
                        [*AS_A_HOST, sys.executable, __file__, "host", str(plan_file), str(host)],
                        stdout=(work / f"{name}-host-{host}.log").open("w"),
                        stderr=subprocess.STDOUT,
                    )
                )
            while len(list(out.glob("ready-*"))) < len(hosts):
                failed = [i for i, h in enumerate(hosts) if h.poll() not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    raise SystemExit(f"host(s) {failed} failed; see {work}/{name}-host-*.log")
                time.sleep(0.5)
        took = round(time.monotonic() - began_start, 1)
        agents_as_on_a_node(spool)
        quiet = wait_quiet(60.0)
        emit("start", scenario=name, hosts=len(layout), seconds=took, busy_before_go=quiet)
        sampler = Sampler(
            {"broker": broker_pid, "worker": worker.process.pid},  # type: ignore[union-attr]
            {
                "hosts": lambda: [h.pid for h in hosts if h.poll() is None],
                "agents": lambda: agent_pids(spool),
            },
            broker_port,
        )
        sampler.start()
        start = time.time() + 5.0
        written = Path(plan.go_file + ".tmp")
        written.write_text(repr(start))
        written.rename(plan.go_file)  # whole when a host sees it
        capture = None
        if name == "a" and args.capture_at_s > 0:
            settings = Settings(bootstrap=bootstrap, prefix=prefix)
            capture = StackCapture(
                settings, runs[0], spool, start + args.capture_at_s, work / f"{name}-archive",
                ranks,
            )  # fmt: skip
            capture.start()
        deadline = time.monotonic() + (plan.steps + KL_GUARD_LEAD) * plan.step_s + 600
        while any(h.poll() is None for h in hosts) and time.monotonic() < deadline:
            time.sleep(2.0)
        for h in hosts:
            if h.poll() is None:
                h.kill()
        figures = sampler.shares()
        sampler.stopping.set()
        failed = [i for i, h in enumerate(hosts) if h.wait() != 0]
        if failed:
            raise SystemExit(f"host(s) {failed} failed; see {work}/{name}-host-*.log")
        outputs = [json.loads((out / f"host-{n}.json").read_text()) for n in range(len(layout))]
        emit(
            "host", scenario=name, runs=len(runs), ranks=ranks, hosts=len(layout),
            host_threads_max=max(o["threads"] for o in outputs),
            host_rss_mb_max=round(max(o["rss_mb"] for o in outputs)),
            rank_cpu_ms_per_s=round(
                sum(o["cpu_s"] for o in outputs) * 1000
                / (sum(len(h) for h in layout) * max(o["seconds"] for o in outputs)), 3,
            ),
            **figures,
        )  # fmt: skip
        time.sleep(max(5.0, args.grace_s / 3))  # the last summaries and acks land
        report(name, plan, bootstrap, topics, outputs, worker)
        if capture is not None:
            capture.join()
            capture.report(bootstrap, topics, ranks)
    finally:
        if archiver is not None:
            archiver.stop()
        for h in hosts:
            if h.poll() is None:
                h.kill()
        wait_agents_gone(spool, 120)  # they outlive their ranks: gone once all is sent
        if worker is not None:
            worker.stop()


class StackCapture(threading.Thread):
    """Scenario a's capture: ``capture_stacks`` for the run at ``at`` (epoch seconds), the
    agents' CPU while they answer (against the same span before), each rank's record's
    arrival on the logs topic (its LogAppendTime)."""

    WAIT_S = 5.0
    SPAN_S = 12.0
    ARCHIVE_TIMEOUT_S = 120.0

    def __init__(
        self, settings: Settings, run_id: str, spool: Path, at: float, archive: Path, ranks: int
    ) -> None:
        super().__init__(daemon=True)
        self.settings, self.run_id, self.spool, self.at = settings, run_id, spool, at
        self.archive, self.ranks = archive, ranks
        self.command_id = ""
        self.issued_ns = 0
        self.cpu_before_s = self.cpu_during_s = 0.0
        self.archived_s: float | None = None
        self.archived_records = 0

    def _agents_cpu(self) -> float:
        total = 0.0
        for pid in agent_pids(self.spool):
            with contextlib.suppress(OSError):
                total += cpu_s(pid)
        return total

    def run(self) -> None:
        from rlpulse.ops.commands import action, operator_command, publish_command

        time.sleep(max(0.0, self.at - self.SPAN_S - time.time()))
        before = self._agents_cpu()
        time.sleep(max(0.0, self.at - time.time()))
        at_command = self._agents_cpu()
        command = operator_command(self.run_id, [action("capture_stacks", wait_s=self.WAIT_S)])
        self.command_id, self.issued_ns = command["command_id"], command["issued_ns"]
        publish_command(self.settings, command)
        self.cpu_before_s = at_command - before
        span_ends: float | None = time.monotonic() + self.SPAN_S
        deadline = time.monotonic() + self.ARCHIVE_TIMEOUT_S
        while True:  # the agents' CPU over the span; the archive every half second
            if span_ends is not None and time.monotonic() >= span_ends:
                self.cpu_during_s, span_ends = self._agents_cpu() - at_command, None
            if self.archived_s is None:
                self.archived_records = self._archived_records()
                if self.archived_records >= self.ranks:
                    self.archived_s = round((time.time_ns() - self.issued_ns) / 1e9, 1)
            if span_ends is None and (self.archived_s is not None or time.monotonic() > deadline):
                return
            time.sleep(0.5)

    def _archived_records(self) -> int:
        """How many of this capture's records the archive's Parquet files hold now."""
        from rlpulse.archive.catalog import open_archive
        from rlpulse.offline.stacks import CAPTURE_QUERY, capture_parameters

        try:
            con = open_archive(str(self.archive), Topics(self.settings.prefix))
            rows = con.execute(CAPTURE_QUERY, capture_parameters(self.run_id)).fetchall()
            con.close()
        except Exception:  # no file of the logs table yet
            return 0
        return sum(1 for row in rows if row[0] == self.command_id)

    def grouped(self, topics: Topics) -> tuple[str, float]:
        """The page's first group line for the capture, and the seconds reading and grouping
        the archive's 1,024 dumps took (what ``rlpulse show RUN --stacks`` does)."""
        from rlpulse.archive.catalog import open_archive
        from rlpulse.offline.stacks import (
            CAPTURE_QUERY,
            capture_parameters,
            describe_groups,
            group_ranks,
            newest_capture,
        )

        began = time.perf_counter()
        con = open_archive(str(self.archive), topics)
        cursor = con.execute(CAPTURE_QUERY, capture_parameters(self.run_id))
        names = [column[0] for column in cursor.description]
        capture = newest_capture([dict(zip(names, row, strict=True)) for row in cursor.fetchall()])
        con.close()
        lines = describe_groups(group_ranks(capture[1])) if capture is not None else []
        return (lines[0] if lines else ""), round(time.perf_counter() - began, 2)

    def report(self, bootstrap: str, topics: Topics, ranks: int) -> None:
        """Print the capture's figures."""
        codec = default_codec()
        arrived_ms: list[float] = []
        outcomes: Counter[str] = Counter()
        for message in read_topic(bootstrap, topics.logs):
            batch = codec.decode_log_batch(message.value())
            for entry in batch["entries"]:
                if entry["fields"].get("command_id") == self.command_id:
                    outcomes[entry["fields"].get("outcome", "?")] += 1
                    arrived_ms.append(message.timestamp()[1] - self.issued_ns / 1e6)
        emit(
            "capture", scenario="a", ranks=ranks, records=len(arrived_ms),
            outcomes=dict(outcomes),
            command_to_stack_on_topic_p50_ms=percentile(arrived_ms, 50) if arrived_ms else None,
            command_to_stack_on_topic_max_ms=round(max(arrived_ms), 1) if arrived_ms else None,
            agents_cpu_s_during=round(self.cpu_during_s, 2),
            agents_cpu_s_same_span_before=round(self.cpu_before_s, 2),
            span_s=self.SPAN_S, wait_s=self.WAIT_S,
        )  # fmt: skip
        first_group, grouping_s = self.grouped(topics)
        emit(
            "capture_archived", scenario="a", ranks=ranks, archived_records=self.archived_records,
            command_to_last_stack_archived_s=self.archived_s, archive_roll_s=ARCHIVE_ROLL_S,
            first_group=first_group, read_and_group_s=grouping_s,
        )  # fmt: skip


ARCHIVE_ROLL_S = 2.0
"""Scenario a's archiver writes a partition's buffer at least this often (default 300 s): the
capture is timed until its last record is in a Parquet file."""

AS_A_HOST = ("chrt", "--idle", "0")
"""Host processes run at the idle scheduling class: on a cluster the broker and the worker
have machines of their own; here they share two cores with every simulated host, and
hundreds of host threads, even at niceness 10, starved the broker's controller and the
worker's heartbeats (a fenced broker, a group rebalance mid-run). The agents the ranks start
inherit it; :func:`agents_as_on_a_node` gives them the normal class back."""


def agents_as_on_a_node(spool: Path) -> int:
    """Give the agents under ``spool`` (every thread) the normal scheduling class back: on a
    node an agent has cores beside the ranks'. Returns how many agents it moved."""
    moved = 0
    for pid in agent_pids(spool):
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                os.sched_setscheduler(int(task), os.SCHED_OTHER, os.sched_param(0))
            moved += 1
    return moved


def wait_quiet(timeout_s: float, busy: float = 0.5) -> float:
    """Wait (at most ``timeout_s``) until the machine was less than ``busy`` busy over 3 s;
    the share it last measured."""
    deadline = time.monotonic() + timeout_s
    while True:
        b0, t0 = machine_busy()
        time.sleep(3.0)
        b1, t1 = machine_busy()
        share = (b1 - b0) / max(t1 - t0, 1)
        if share < busy or time.monotonic() > deadline:
            return round(share, 3)


def wait_agents_gone(spool: Path, timeout_s: float) -> None:
    """Wait for the hosts' agents to exit by themselves (their ranks are gone), then end the
    rest (one that cannot send, the broker gone, would keep trying) and wait for them."""
    deadline = time.monotonic() + timeout_s
    while agent_pids(spool) and time.monotonic() < deadline:
        time.sleep(1.0)
    for pid in agent_pids(spool):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def report(
    name: str, plan: Plan, bootstrap: str, topics: Topics, outputs: list[dict[str, Any]],
    worker: WorkerProcess,
) -> None:  # fmt: skip
    """Join latency, command fan-out and the stop's step, from the topics and the hosts."""
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
        raise SystemExit(
            f"scenario {name}: no StepSummary of the {len(last_log)} steps logged; worker "
            f"alive: {worker.alive()} (its log: {worker.log_file})"
        )
    emit(
        "join", scenario=name, summaries=len(firsts), steps_logged=len(last_log),
        revisions=len(mine) - len(firsts), closed_by=dict(closed),
        p50_ms=round(percentile(join_ms, 50), 1), p99_ms=round(percentile(join_ms, 99), 1),
        max_ms=round(max(join_ms), 1), target_p99_ms=1000,
        met=percentile(join_ms, 99) < 1000,
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
    polled: dict[str, int] = {}
    for output in outputs:
        for _run, command_id, step, rank, ns in output["applied"]:
            applied[command_id].append((rank, step, ns))
        polled.update(output["polled"])
    fanout_ms, ack_ms, wait_ms, spread_ms, split, partial = [], [], [], [], 0, 0
    for command_id, command in commands.items():
        got = applied.get(command_id, [])
        if len({rank for rank, _, _ in got}) < plan.ranks:
            partial += 1
            continue
        if len({step for _, step, _ in got}) != 1:
            split += 1
        last = max(ns for _, _, ns in got)
        fanout_ms.append((last - command["issued_ns"]) / 1e6)
        if command_id in polled:  # the loop's own wait for its next step, then the rest
            wait_ms.append((polled[command_id] - command["issued_ns"]) / 1e6)
            spread_ms.append((last - polled[command_id]) / 1e6)
        if command_id in acks:
            ack_ms.append((acks[command_id] - command["issued_ns"]) / 1e6)
    emit(
        "fanout", scenario=name, commands=len(commands),
        applied_everywhere=len(fanout_ms), not_on_every_rank=partial, not_at_one_step=split,
        p50_ms=round(percentile(fanout_ms, 50), 1) if fanout_ms else None,
        p99_ms=round(percentile(fanout_ms, 99), 1) if fanout_ms else None,
        ack_p50_ms=round(percentile(ack_ms, 50), 1) if ack_ms else None,
        ack_p99_ms=round(percentile(ack_ms, 99), 1) if ack_ms else None,
        issued_to_next_poll_p50_ms=round(percentile(wait_ms, 50), 1) if wait_ms else None,
        poll_to_every_rank_applied_p50_ms=round(percentile(spread_ms, 50), 1)
        if spread_ms else None,
        poll_to_every_rank_applied_p99_ms=round(percentile(spread_ms, 99), 1)
        if spread_ms else None,
        target_p99_ms=2000, met=bool(fanout_ms) and percentile(fanout_ms, 99) < 2000,
    )  # fmt: skip
    due = plan.kl_from + 2
    stops: dict[str, set[int]] = defaultdict(set)
    for command_id, command in commands.items():
        if command["rule_id"] == "kl-guard":
            stops[command["run_id"]] |= {step for _, step, _ in applied.get(command_id, [])}
    late = [max(steps) - due for steps in stops.values() if steps]
    emit(
        "stop", scenario=name, runs=len(plan.runs), stopped=len(late), due_step=due,
        at_one_step_on_every_rank=all(len(steps) == 1 for steps in stops.values()),
        steps_late_max=max(late, default=None),
        steps_late_p50=percentile(late, 50) if late else None,
        target="every rank at one step, at most 2 steps after the third violating step",
        met=len(late) == len(plan.runs) and all(len(s) == 1 for s in stops.values())
        and max(late, default=99) <= 2,
    )  # fmt: skip


# -- scenario c: a rank process SIGKILLed again and again ------------------------------------

VICTIM = """
import mmap, os, sys, time
from pathlib import Path
from rlpulse.producers import EventLogger
sys.path.insert(0, {benchmarks!r})
from fleet import host_settings, Plan
import json

plan = Plan(**json.loads(Path(sys.argv[1]).read_text()))
counter = Path(sys.argv[2])
logger = EventLogger(plan.runs[0], rank=1, world_size=8, settings=host_settings(plan, 0))
descriptor = os.open(counter, os.O_RDWR)
seen = mmap.mmap(descriptor, 64)
seen[0:32] = logger.producer_id.encode()
step = 0
while True:
    logger.log(plan.metrics(step, 1), step, "actor")
    for number in range(5):
        logger.log_record("INFO", 20, "trainer", f"step {{step}} line {{number}}", step=step)
    seen[32:40] = logger.logged.to_bytes(8, "little")
    step += 1
    time.sleep(0.02)
"""


def host_ranks_c(plan_file: Path, seconds: float) -> None:
    """Scenario c's host: ranks 0 and 2..7 of the run, logging as threads for ``seconds``."""
    from rlpulse.producers import EventLogger

    plan = Plan(**json.loads(plan_file.read_text()))
    settings = host_settings(plan, 0)
    loggers = [
        EventLogger(plan.runs[0], rank=rank, world_size=8, settings=settings)
        for rank in (0, 2, 3, 4, 5, 6, 7)
    ]
    until = time.monotonic() + seconds

    def loop(index: int, logger: Any) -> None:
        step = 0
        while time.monotonic() < until:
            logger.log(plan.metrics(step, logger.rank), step, "actor")
            logger.log_record("INFO", 20, "trainer", f"step {step}", step=step)
            step += 1
            time.sleep(0.05)
        logger.close(60)

    threads = [threading.Thread(target=loop, args=(i, lg)) for i, lg in enumerate(loggers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


class Arrivals(threading.Thread):
    """Reads the run's partition of the events and logs topics; notes when each (producer,
    seq) arrived (the broker's append time) and how often."""

    def __init__(self, bootstrap: str, topics: Topics, run: str, partitions: int) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": f"fleet-{uuid.uuid4().hex}",
             "enable.auto.commit": False}
        )  # fmt: skip
        partition = partition_for(run.encode(), partitions)
        self.consumer.assign(
            [TopicPartition(topics.events, partition, 0), TopicPartition(topics.logs, partition, 0)]
        )
        self.topics = topics
        self.seen: dict[tuple[str, int], float] = {}
        self.count: Counter[tuple[str, int]] = Counter()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.codec = default_codec()

    def run(self) -> None:
        while not self.stopping.is_set():
            for message in self.consumer.consume(1000, timeout=0.2):
                if message.error() is not None:
                    continue
                at = message.timestamp()[1] / 1000
                headers = {pair[0]: _text(pair[1]) for pair in message.headers() or []}
                producer = headers.get("rlpulse-producer", "")
                first = headers.get("rlpulse-seqs", "0-0").partition("-")[0]
                if message.topic() == self.topics.events:
                    seqs = [int(first)]
                else:
                    seqs = [r["seq"] for r in self.codec.decode_logs(message.value() or b"")]
                with self.lock:
                    for seq in seqs:
                        self.count[(producer, seq)] += 1
                        self.seen.setdefault((producer, seq), at)
        self.consumer.close()

    def last_arrival(self, producer: str, logged: int) -> float | None:
        """When the last of seqs 0..logged-1 arrived; None while one is missing."""
        with self.lock:
            times = [self.seen.get((producer, seq)) for seq in range(logged)]
        return None if any(t is None for t in times) else max(t for t in times if t is not None)


def _text(value: str | bytes | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


def scenario_c(args: argparse.Namespace, bootstrap: str, work: Path) -> None:
    """One run of 8 ranks on one host; its rank 1, a process of its own, killed ``--kills``
    times: kill -> every accepted record of it on its topic."""
    prefix = f"fleet-c-{uuid.uuid4().hex[:6]}"
    topics = Topics(prefix)
    ensure_topics(Settings(bootstrap=bootstrap, prefix=prefix), topics, partitions=args.partitions)
    run = "c-run-00"
    spool = work / "c-spool"
    plan = Plan(
        bootstrap, prefix, [run], 8, [[(run, r) for r in range(8)]], {}, 0, 1.0, 5, False,
        str(work / "c-out"), str(spool), "",
    )  # fmt: skip
    plan_file = work / "c-plan.json"
    plan_file.write_text(json.dumps(asdict(plan)))
    arrivals = Arrivals(bootstrap, topics, run, args.partitions)
    arrivals.start()
    seconds = args.kills * 8.0 + 30
    others = subprocess.Popen(
        [*AS_A_HOST, sys.executable, __file__, "c-host", str(plan_file), str(seconds)],
        stdout=(work / "c-host.log").open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    script = VICTIM.format(benchmarks=str(Path(__file__).resolve().parent))
    latencies: list[float] = []
    victims: list[tuple[str, int]] = []
    try:
        for kill in range(args.kills):
            counter = work / f"c-victim-{kill}"
            counter.write_bytes(b"\0" * 64)
            victim = subprocess.Popen(
                [*AS_A_HOST, sys.executable, "-c", script, str(plan_file), str(counter)],
                stdout=(work / f"c-victim-{kill}.log").open("w"), stderr=subprocess.STDOUT,
            )  # fmt: skip
            time.sleep(1.0)
            agents_as_on_a_node(spool)
            time.sleep(random.uniform(2.0, 5.0))
            victim.send_signal(signal.SIGKILL)
            killed = time.time()
            victim.wait()
            data = counter.read_bytes()
            producer, logged = data[0:32].decode(), int.from_bytes(data[32:40], "little")
            victims.append((producer, logged))
            deadline = time.monotonic() + 60
            last = arrivals.last_arrival(producer, logged)
            while last is None and time.monotonic() < deadline:
                time.sleep(0.02)
                last = arrivals.last_arrival(producer, logged)
            if last is None:
                raise SystemExit(f"kill {kill}: records of {producer} never arrived")
            latencies.append(max(0.0, last - killed))
        others.wait(timeout=seconds + 120)
    finally:
        if others.poll() is None:
            others.kill()
        time.sleep(3.0)
        arrivals.stopping.set()
        arrivals.join(10)
    twice = sum(
        1
        for (producer, _seq), count in arrivals.count.items()
        if count > 1 and producer in {p for p, _ in victims}
    )
    emit(
        "kill", scenario="c", kills=len(latencies),
        records_accepted=[logged for _p, logged in victims],
        kill_to_topic_p50_s=round(percentile(latencies, 50), 3),
        kill_to_topic_p99_s=round(percentile(latencies, 99), 3),
        kill_to_topic_max_s=round(max(latencies), 3), records_twice=twice,
        target="p99 <= 2 s, none twice",
        met=percentile(latencies, 99) <= 2.0 and twice == 0,
    )  # fmt: skip
    wait_agents_gone(spool, 60)


@contextlib.contextmanager
def kafka(work: Path) -> Iterator[tuple[str, int, int]]:
    """(bootstrap, broker pid, broker port) of a local broker this benchmark starts."""
    if os.environ.get("RLPULSE_BOOTSTRAP"):
        raise SystemExit("fleet.py measures the broker's CPU: run it on its own local broker")
    broker = LocalBroker(Settings(), state_dir=work / "broker", port=0)
    record = broker.up()
    try:
        yield record.bootstrap, record.pid, record.port
    finally:
        broker.down()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "host":
        run_host(Path(sys.argv[2]), int(sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "c-host":
        host_ranks_c(Path(sys.argv[2]), float(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="a,b,c", help="a, b, c; comma-separated")
    parser.add_argument("--steps", type=int, default=40, help="steps of each run")
    parser.add_argument("--step-s", type=float, default=1.0, help="seconds between steps")
    parser.add_argument("--probe-every", type=int, default=5, help="a command every N steps")
    parser.add_argument("--partitions", type=int, default=12, help="of the run-keyed topics")
    parser.add_argument("--grace-s", type=float, default=30.0, help="the worker's grace")
    parser.add_argument("--a-ranks", type=int, default=1024)
    parser.add_argument("--a-host-ranks", type=int, default=8)
    parser.add_argument("--b-runs", type=int, default=64)
    parser.add_argument("--b-ranks", type=int, default=64)
    parser.add_argument("--b-hosts", type=int, default=64)
    parser.add_argument("--kills", type=int, default=10, help="scenario c's kills")
    parser.add_argument(
        "--start-batch", type=int, default=16, help="host processes started at a time"
    )
    parser.add_argument(
        "--capture-at-s", type=float, default=15.0,
        help="(a): capture_stacks this many seconds into the run (0: none)",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the broker and workers stop too
    chosen = set(args.scenarios.split(","))
    unknown = sorted(chosen - {"a", "b", "c"})
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}: choose from a, b, c")
    work = Path(tempfile.mkdtemp(prefix="rlpulse-fleet-"))
    emit("setup", work=str(work), cores=os.cpu_count(), **vars(args))
    try:
        with kafka(work) as (bootstrap, broker_pid, broker_port):
            common = (args, bootstrap, broker_pid, broker_port)
            if "a" in chosen:
                layout = layout_a(args.a_ranks, args.a_host_ranks)
                scenario("a", *common, layout=layout, ranks=args.a_ranks, stagger=False, work=work)
            if "b" in chosen:
                layout = layout_b(args.b_runs, args.b_ranks, args.b_hosts)
                scenario("b", *common, layout=layout, ranks=args.b_ranks, stagger=True, work=work)
            if "c" in chosen:
                scenario_c(args, bootstrap, work)
    except BaseException:
        print(f"kept {work}: every process's log is there", file=sys.stderr)
        raise
    if args.keep:
        print(f"kept {work}", file=sys.stderr)
    else:  # the ranks' write-ahead logs and the broker's data
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
