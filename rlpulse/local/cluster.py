"""A real multi-node Apache Kafka cluster (KRaft) on 127.0.0.1, for fault tests and trials.

``rlpulse broker up --nodes 3`` starts three :class:`~rlpulse.local.broker.LocalBroker` nodes
from the same jars, each a broker and a KRaft controller (one static quorum of all nodes), in
``<state>/node-<id>``, formatted with one cluster id. The cluster replicates like a production
one: ``default.replication.factor`` = ``min(3, nodes)``, ``min.insync.replicas`` = 2 with three
or more nodes, and Kafka's internal topics the same. A dead node is fenced after 6 s without a
heartbeat (``broker.session.timeout.ms``; Kafka's default is 9 s), which bounds the leader
fail-over a broker failure costs. Node ``i`` (from 1) takes clients on ``port + 2 (i - 1)``
(9092, 9094, 9096), or on a free port with ``port=0``; the controllers take free ports, chosen
at the first ``up`` and kept in each node's ``ports`` file (the quorum's addresses must not
change; 9093 is Alertmanager's). The cluster's bootstrap (every node) is recorded in
the state directory with node 1's pid, so ``status``, ``down`` and the other commands find it.
``up`` checks every node's ports before it starts one, then writes every node's directory and
ports (so a cluster whose start failed half-way is still that many nodes), and stops the nodes
it started when a later one fails. A node can be killed and started again
(:meth:`LocalCluster.kill`, :meth:`LocalCluster.start`).
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Final

from rlpulse.local.broker import STOP_TIMEOUT_S, LocalBroker, port_in_use
from rlpulse.local.child_process import free_port
from rlpulse.local.exceptions import BrokerError
from rlpulse.local.java import stop_pids
from rlpulse.settings import Settings
from rlpulse.transport.bootstrap import STATE_FILE, BrokerRecord

__all__ = ["LocalCluster", "is_cluster"]

_NODE_PREFIX: Final = "node-"
Progress = Callable[[str], None]
SESSION_TIMEOUT_MS: Final = 6000


def is_cluster(state_dir: Path) -> bool:
    """Whether ``state_dir`` holds a :class:`LocalCluster` (rather than one broker)."""
    return (state_dir / f"{_NODE_PREFIX}1").is_dir()


class LocalCluster:
    """``nodes`` local Kafka nodes forming one KRaft cluster, their files in ``state_dir``."""

    def __init__(
        self,
        settings: Settings,
        nodes: int = 3,
        state_dir: Path | None = None,
        port: int | None = None,
    ) -> None:
        if nodes < 1:
            raise BrokerError(f"a cluster has at least one node, not {nodes}")
        self.settings = settings
        self.state_dir = state_dir if state_dir is not None else settings.home / "broker"
        found = sorted(self.state_dir.glob(f"{_NODE_PREFIX}*"))
        self.nodes = len(found) if found else nodes
        base = settings.broker.port if port is None else port
        recorded = [self._recorded(node) for node in range(1, self.nodes + 1)]
        if all(ports is not None for ports in recorded):
            pairs = dict(enumerate((p for p in recorded if p is not None), start=1))
        else:
            clients = [base + 2 * node for node in range(self.nodes)] if base else []
            taken = list(clients)
            pairs = {}
            for node in range(1, self.nodes + 1):
                client = clients[node - 1] if base else free_port(avoid=taken)
                controller = free_port(avoid=[*taken, client])
                taken += [client, controller]
                pairs[node] = (client, controller)
        self.ports = {node: client for node, (client, _) in pairs.items()}
        """Client port of each node id (1-based)."""
        self.controller_ports = {node: controller for node, (_, controller) in pairs.items()}
        """Controller port of each node id (1-based): the quorum's addresses."""

    def _check_ports(self) -> None:
        """BrokerError naming a port of a node to start that something else holds."""
        for node in range(1, self.nodes + 1):
            if BrokerRecord.read(self._node_dir(node)) is not None:
                continue
            for port in (self.ports[node], self.controller_ports[node]):
                if port_in_use(port):
                    raise BrokerError(
                        f"port {port} on 127.0.0.1 (node {node} of {self.nodes}) is already in "
                        "use; stop what listens there or choose another with --port. "
                        "No node was started."
                    )

    def _formatted_id(self) -> str | None:
        """The cluster id a node's storage was formatted with (a start that failed half-way)."""
        for node in range(1, self.nodes + 1):
            meta = self._node_dir(node) / "data" / "meta.properties"
            with contextlib.suppress(OSError):
                for line in meta.read_text().splitlines():
                    if line.startswith("cluster.id="):
                        return line.removeprefix("cluster.id=").strip()
        return None

    def _recorded(self, node: int) -> tuple[int, int] | None:
        """A node's client and controller ports, kept for its restarts; None before the first.

        A ``ports`` file of one number was written when the controller took ``port + 1``.
        """
        path = self._node_dir(node) / "ports"
        if not path.exists():
            return None
        client, *controller = (int(word) for word in path.read_text().split())
        return client, controller[0] if controller else client + 1

    def _node_dir(self, node: int) -> Path:
        return self.state_dir / f"{_NODE_PREFIX}{node}"

    @property
    def bootstrap(self) -> str:
        """Every node's client address, comma-separated."""
        return ",".join(f"127.0.0.1:{self.ports[n]}" for n in sorted(self.ports))

    def node(self, node: int) -> LocalBroker:
        """The :class:`LocalBroker` of node ``node`` (1-based)."""
        factor = min(3, self.nodes)
        voters = ",".join(f"{n}@127.0.0.1:{p}" for n, p in sorted(self.controller_ports.items()))
        overrides = {
            "node.id": str(node),
            "controller.quorum.voters": voters,
            "default.replication.factor": str(factor),
            "min.insync.replicas": str(2 if factor >= 3 else 1),
            "offsets.topic.replication.factor": str(factor),
            "transaction.state.log.replication.factor": str(factor),
            "transaction.state.log.min.isr": str(2 if factor >= 3 else 1),
            "share.coordinator.state.topic.replication.factor": str(factor),
            "share.coordinator.state.topic.min.isr": str(2 if factor >= 3 else 1),
            "broker.session.timeout.ms": str(SESSION_TIMEOUT_MS),
            "broker.heartbeat.interval.ms": "1000",
        }
        loopback = self.settings.broker.model_copy(  # a cluster for trials and fault tests
            update={
                "host": "127.0.0.1",
                "advertised_host": None,
                "data_dir": self._node_dir(node) / "data",
            }
        )
        return LocalBroker(
            self.settings.model_copy(update={"broker": loopback}),
            state_dir=self._node_dir(node),
            port=self.ports[node],
            overrides=overrides,
        )

    def up(self, progress: Progress | None = None) -> BrokerRecord:
        """Start every node that is not running, wait for all; the cluster's record.

        Raises :class:`BrokerError` before starting any node when one's ports are taken; when
        a node fails to start, the nodes this call started are stopped again.
        """
        say = progress or (lambda _msg: None)
        cluster_id = self._formatted_id() or (
            base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        )
        self._check_ports()
        for node in range(1, self.nodes + 1):
            self._node_dir(node).mkdir(parents=True, exist_ok=True)
            ports = f"{self.ports[node]} {self.controller_ports[node]}\n"
            (self._node_dir(node) / "ports").write_text(ports)
        started: list[tuple[LocalBroker, subprocess.Popen[bytes], BrokerRecord]] = []
        try:
            for node in range(1, self.nodes + 1):
                broker = self.node(node)
                say(f"node {node} of {self.nodes}: 127.0.0.1:{self.ports[node]}")
                launched = broker.launch(say, cluster_id, self.controller_ports[node])
                if not isinstance(launched, BrokerRecord):
                    started.append((broker, *launched))
            for broker, process, info in started:
                broker.wait_ready(process, info)
        except BaseException:
            for broker, _process, _info in started:
                broker.down(timeout_s=5.0)
            raise
        first = BrokerRecord.read(self._node_dir(1))
        if first is None:
            raise BrokerError(f"node 1 of the cluster in {self.state_dir} is not running")
        record = replace(first, bootstrap=self.bootstrap)
        record.write(self.state_dir)
        say(f"Kafka cluster of {self.nodes} nodes is up at {self.bootstrap}")
        return record

    def start(self, node: int) -> None:
        """Start node ``node`` again (after :meth:`kill` or :meth:`stop`) and wait for it."""
        broker = self.node(node)
        launched = broker.launch(controller_port=self.controller_ports[node])
        if not isinstance(launched, BrokerRecord):
            broker.wait_ready(*launched)

    def kill(self, node: int) -> None:
        """SIGKILL node ``node`` (its data stays: :meth:`start` brings it back)."""
        info = BrokerRecord.read(self._node_dir(node))
        if info is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(info.pid, signal.SIGKILL)
        broker = self.node(node)
        broker.down(timeout_s=1.0)

    def stop(self, node: int) -> bool:
        """Stop node ``node`` (SIGTERM, then SIGKILL after 30 s); whether it ran."""
        return self.node(node).down()

    def running(self) -> list[int]:
        """The ids of the nodes whose processes are alive."""
        return [n for n in range(1, self.nodes + 1) if BrokerRecord.read(self._node_dir(n))]

    def down(self) -> bool:
        """Stop every node, all at once (one by one, the last waits for a lost quorum)."""
        records = [BrokerRecord.read(self._node_dir(n)) for n in range(1, self.nodes + 1)]
        pids = [record.pid for record in records if record is not None]
        stop_pids(pids, STOP_TIMEOUT_S)
        for node in range(1, self.nodes + 1):
            self.node(node).down()  # the state of each node
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)
        return bool(pids)

    def status(self) -> str:
        """One line per node: up (pid, address) or down."""
        lines = []
        for node in range(1, self.nodes + 1):
            info = BrokerRecord.read(self._node_dir(node))
            where = f"127.0.0.1:{self.ports[node]}"
            lines.append(
                f"node {node}: up at {where} (pid {info.pid})" if info else f"node {node}: down"
            )
        return "\n".join(lines)
