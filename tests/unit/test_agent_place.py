"""The host agent's place, its wake and the clock estimate: without a broker or an agent."""

from __future__ import annotations

import os
from pathlib import Path

from rlpulse.producers.delivery.agent_place import (
    AWAKE,
    LINGERING,
    SLEEPING,
    AgentBell,
    AgentPlace,
    agent_alive,
    agent_place,
    agents_under,
)
from rlpulse.producers.delivery.clock import ClockOffset
from rlpulse.producers.delivery.spool_root import SpoolRoot
from rlpulse.producers.delivery.wal import EVENT, LOG, WalClaim
from rlpulse.schemas.clock import corrected_ns, parse_clock_header


def place(
    root: Path, host: str = "node-1", bootstrap: str = "k:9092", prefix: str = "p"
) -> AgentPlace:
    return agent_place(SpoolRoot(root, "ext4"), host, bootstrap, prefix, None)


def test_one_agent_per_spool_host_cluster_and_prefix(tmp_path: Path) -> None:
    base = place(tmp_path)
    assert base == place(tmp_path)  # every rank with the same settings finds the same agent
    others = [
        place(tmp_path / "other"),
        place(tmp_path, host="node-2"),
        place(tmp_path, bootstrap="other:9092"),
        place(tmp_path, prefix="q"),
    ]
    assert len({p.key for p in [base, *others]}) == 5
    assert base.directory == tmp_path / ".agents" / base.key  # never a run's directory
    shared = agent_place(SpoolRoot(tmp_path, "nfs4"), "node-1", "k:9092", "p", None)
    assert shared.directory.parent != tmp_path / ".agents"  # a flock must be node-local


def test_the_place_is_made_private_and_a_live_agent_is_seen(tmp_path: Path) -> None:
    agent = place(tmp_path)
    agent.make()
    assert oct(agent.directory.stat().st_mode & 0o777) == "0o700"
    assert agents_under(tmp_path) == [agent.directory]
    assert not agent_alive(agent.lock)
    claim = WalClaim.take(agent.directory, agent.lock.name)
    assert claim is not None and agent_alive(agent.lock)
    claim.release()
    assert not agent_alive(agent.lock)


def test_a_writer_wakes_a_sleeping_agent_once_and_a_lingering_one_for_events_only(
    tmp_path: Path,
) -> None:
    """What the agent's side of the FIFO reads, as the state byte says it sleeps or not."""
    agent = place(tmp_path)
    bell = AgentBell(agent)
    ear = os.open(agent.wake, os.O_RDWR | os.O_NONBLOCK)

    def heard() -> bytes:
        try:
            return os.read(ear, 1024)
        except BlockingIOError:
            return b""

    try:
        bell.state[0] = AWAKE
        for _ in range(100):
            bell.ring(EVENT)
        assert heard() == b""  # awake: nothing per record
        bell.state[0] = SLEEPING
        for _ in range(100):
            bell.ring(LOG)
        assert heard() == b"\n" and bell.state[0] == AWAKE  # one wake for the burst
        bell.state[0] = LINGERING
        bell.ring(LOG)
        assert heard() == b""  # it holds records for the linger anyway
        bell.ring(EVENT)
        assert heard() == b"\n"  # an event must not wait for the linger
        bell.register(tmp_path / "run" / "host" / "p-1")
        assert heard() == b"+" + os.fsencode(tmp_path / "run" / "host" / "p-1") + b"\n"
    finally:
        os.close(ear)
        bell.close()


def test_ringing_with_no_agent_listening_costs_nothing_and_raises_nothing(tmp_path: Path) -> None:
    bell = AgentBell(place(tmp_path))
    bell.state[0] = SLEEPING
    bell.ring(EVENT)  # no reader of the FIFO: ENXIO, ignored
    bell.close()


def test_the_clock_offset_is_the_shortest_round_trip_s() -> None:
    """A host 5 s behind the broker: appended at broker time b, between sent and reported."""
    clock = ClockOffset()
    behind = 5_000_000_000
    for sent, trip in ((10_000_000_000, 40_000_000), (11_000_000_000, 4_000_000)):
        reported = sent + trip
        broker_ms = (sent + trip // 2 + behind) // 1_000_000
        clock.sample(sent, reported, broker_ms)
    assert clock.offset_ns is not None and clock.error_ns is not None
    assert abs(clock.offset_ns - behind) <= clock.error_ns
    assert clock.error_ns == 2_000_000 + 500_000  # half the 4 ms trip, half a millisecond
    assert parse_clock_header(clock.header) == (clock.offset_ns, clock.error_ns)
    assert corrected_ns(1_000, clock.offset_ns) == 1_000 + clock.offset_ns
    assert corrected_ns(1_000, None) == 1_000
    assert parse_clock_header(b"nonsense") is None and parse_clock_header(None) is None
