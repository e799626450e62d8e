"""Commands on every rank at the same step, stop and its exit code, attempts (no broker).

Ranks are threads here; a fake broadcast built on a barrier stands in for
torch.distributed, and rank 0's control client is fed scripted commands.
"""

from __future__ import annotations

import concurrent.futures
import copy
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from rlpulse.producers import (
    EXIT_STOPPED_BY_RULE,
    CommandBus,
    InvalidValueError,
    RunLink,
    Settings,
    StopRequested,
    single_process_broadcast,
)
from rlpulse.producers.caller.attempts import (
    ATTEMPT_FILE,
    read_attempt,
    resume_attempt,
    write_attempt,
)
from rlpulse.producers.control.bus import Broadcast
from rlpulse.schemas.records import Action, ControlCommand

T = TypeVar("T")


def unreachable() -> Settings:
    """Settings for a broker that is not there (built per test: the home is the test's own)."""
    return Settings(bootstrap="127.0.0.1:1", prefix="unit")


@pytest.fixture(autouse=True)
def rlpulse_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLPULSE_HOME", str(tmp_path))


class ThreadBroadcast:
    """An in-process collective: rank 0's value, deep-copied (as if pickled) to every rank."""

    def __init__(self, world_size: int) -> None:
        self._barrier = threading.Barrier(world_size, timeout=10)
        self._value: Any = None
        self.calls = 0

    def for_rank(self, rank: int) -> Broadcast:
        def broadcast(value: T, /) -> T:
            if rank == 0:
                self._value = value
                self.calls += 1
            self._barrier.wait()
            result: T = copy.deepcopy(self._value)
            self._barrier.wait()  # nobody overwrites it before every rank has read it
            return result

        return broadcast


def command(name: str, *actions: str, step: int = 0) -> ControlCommand:
    return {
        "command_id": name,
        "run_id": "run-a",
        "attempt": 0,
        "stage": "trainer",
        "step": step,
        "origin": "rule",
        "rule_id": name,
        "rule_version": "1",
        "dry_run": False,
        "actions": [Action(type=a, params={}) for a in actions],
        "reason": f"{name} fired",
        "evidence": {},
        "issued_ns": 0,
    }


class ScriptedControl:
    """Stands in for rank 0's ControlClient: commands become visible at given polls."""

    def __init__(self, script: dict[int, list[ControlCommand]]) -> None:
        self.script = script
        self.polls = 0
        self.acks: list[tuple[str, str, int | None]] = []
        self.acked_command_ids: frozenset[str] = frozenset()

    def poll(self, timeout_s: float = 0.0) -> list[ControlCommand]:
        found = self.script.get(self.polls, [])
        self.polls += 1
        return found

    def ack(self, cmd: ControlCommand, status: str, *, applied_at_step: int | None = None,
            detail: Any = None) -> bool:  # fmt: skip
        self.acks.append((cmd["command_id"], status, applied_at_step))
        self.acked_command_ids = self.acked_command_ids | {cmd["command_id"]}
        return True

    def close(self) -> None:
        pass


def on_threads(target: Callable[[int], object], world_size: int) -> None:
    """Run ``target(rank)`` on one thread per rank; an exception in any fails the test."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=world_size) as pool:
        futures = [pool.submit(target, rank) for rank in range(world_size)]
        for future in futures:
            future.result(timeout=30)


def run_ranks(world_size: int, script: dict[int, list[ControlCommand]], steps: int) -> tuple[
    dict[int, list[tuple[int, list[str]]]], dict[int, int], ScriptedControl
]:  # fmt: skip
    """Every rank: log, poll, ack, exit_if_stopped, each step; return what each saw."""
    bus = ThreadBroadcast(world_size)
    control = ScriptedControl(script)
    seen: dict[int, list[tuple[int, list[str]]]] = {r: [] for r in range(world_size)}
    stopped: dict[int, int] = {}

    def rank_loop(rank: int) -> None:
        link = RunLink(
            "run-a", rank=rank, world_size=world_size, settings=unreachable(),
            broadcast=bus.for_rank(rank),
        )  # fmt: skip
        if rank == 0:
            assert link.control is not None
            link.control.close()
            link.control = control  # type: ignore[assignment]
        else:
            assert link.control is None
        step = 0
        try:
            for step in range(steps):
                commands = link.poll_commands()
                seen[rank].append((step, [c["command_id"] for c in commands]))
                for cmd in commands:
                    if cmd is not link.stop_command:
                        assert link.ack(cmd, "applied", applied_at_step=step)
                link.exit_if_stopped(step)
        except StopRequested:
            stopped[rank] = step
        finally:
            link.close(timeout_s=0)

    on_threads(rank_loop, world_size)
    return seen, stopped, control


def test_every_rank_gets_the_same_commands_at_the_same_step() -> None:
    script = {
        3: [command("scale", "scale_rollout_batch")],
        7: [command("ckpt", "checkpoint"), command("alert", "alert")],
    }
    seen, stopped, control = run_ranks(4, script, steps=12)
    assert stopped == {}
    assert control.polls == 12  # only rank 0 polled
    for rank in range(4):
        assert seen[rank] == seen[0]
    assert [(step, ids) for step, ids in seen[0] if ids] == [(3, ["scale"]), (7, ["ckpt", "alert"])]
    assert control.acks == [
        ("scale", "applied", 3),
        ("ckpt", "applied", 7),
        ("alert", "applied", 7),
    ]


def test_a_stop_ends_every_rank_at_the_same_step_and_is_acked_once() -> None:
    script = {5: [command("kl-guard", "checkpoint", "stop")], 6: [command("late", "stop")]}
    seen, stopped, control = run_ranks(3, script, steps=20)
    assert stopped == {0: 5, 1: 5, 2: 5}
    assert all(len(seen[rank]) == 6 for rank in range(3))
    assert control.acks == [("kl-guard", "applied", 5)]


def test_without_a_broadcast_only_rank_0_may_poll() -> None:
    assert CommandBus(0).commands(lambda: [command("c")])[0]["command_id"] == "c"
    with pytest.raises(InvalidValueError, match="rank 2 can only get what rank 0 polled"):
        CommandBus(2).commands(None)
    assert single_process_broadcast([1, 2]) == [1, 2]


def test_stop_requested_is_a_system_exit_with_the_documented_code() -> None:
    assert EXIT_STOPPED_BY_RULE == 0
    stop = StopRequested("kl-guard-1", "kl > 0.3 for 3 steps")
    assert isinstance(stop, SystemExit) and not isinstance(stop, Exception)
    assert stop.code == EXIT_STOPPED_BY_RULE
    assert "kl-guard-1" in str(stop)


@pytest.mark.parametrize("exit_code", [None, 3])
def test_an_uncaught_stop_exits_the_process_with_its_code(
    exit_code: int | None, tmp_path: Path
) -> None:
    code = (
        "from rlpulse.producers import StopRequested\n"
        "try:\n"
        "    raise StopRequested('c1', 'stop'"
        + ("" if exit_code is None else f", {exit_code}")
        + ")\n"
        "except Exception:\n"
        "    raise SystemExit(99)  # a training loop's broad except does not catch it\n"
    )
    result = subprocess.run([sys.executable, "-c", code], timeout=60, check=False)
    assert result.returncode == (EXIT_STOPPED_BY_RULE if exit_code is None else exit_code)


def test_attempt_file_round_trip(tmp_path: Path) -> None:
    assert read_attempt(tmp_path, "run-a") is None
    path = write_attempt(tmp_path / "ckpt-100", "run-a", 2)
    assert path.name == ATTEMPT_FILE
    assert read_attempt(tmp_path / "ckpt-100", "run-a") == 2
    assert read_attempt(tmp_path / "ckpt-100", "run-b") is None  # another run's checkpoint
    assert resume_attempt(tmp_path / "ckpt-100", "run-a") == 3
    assert resume_attempt(tmp_path / "ckpt-100", "run-a") == 4  # resumed twice: two attempts
    assert resume_attempt(tmp_path / "no-record", "run-a") == 1
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / ATTEMPT_FILE).write_text("{not json")
    with pytest.raises(InvalidValueError, match=ATTEMPT_FILE):
        read_attempt(tmp_path / "bad", "run-a")


def test_resume_gives_every_rank_the_attempt_rank_0_took(tmp_path: Path) -> None:
    write_attempt(tmp_path, "run-a", 4)
    bus = ThreadBroadcast(3)
    attempts: dict[int, int] = {}

    def resume(rank: int) -> None:
        link = RunLink.resume(
            "run-a", tmp_path, rank=rank, world_size=3, settings=unreachable(),
            broadcast=bus.for_rank(rank),
        )  # fmt: skip
        attempts[rank] = link.attempt
        if link.control is not None:
            assert link.control.attempt == link.attempt
        link.save_attempt(tmp_path / "ckpt-next")
        link.close(timeout_s=0)

    on_threads(resume, 3)
    assert attempts == {0: 5, 1: 5, 2: 5}
    assert read_attempt(tmp_path, "run-a") == 5
    assert read_attempt(tmp_path / "ckpt-next", "run-a") == 5


def test_single_process_resume_needs_no_broadcast(tmp_path: Path) -> None:
    link = RunLink.resume("run-a", tmp_path, settings=unreachable())
    assert link.attempt == 1
    link.close(timeout_s=0)
    with pytest.raises(InvalidValueError, match="broadcast"):
        RunLink.resume("run-a", tmp_path, rank=1, world_size=2, settings=unreachable())
