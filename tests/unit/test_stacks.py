"""Stacks from outside, without a broker: a rank's registration, the agent's signal and wait
on real processes, the dump's parsing, and the ranks grouped by where their loops are."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlpulse.offline.stacks import describe_groups, group_ranks
from rlpulse.producers.caller.stacks import signal_number
from rlpulse.producers.delivery.stacks import RankProcess, take_stacks
from rlpulse.producers.delivery.wal import LogMeta
from rlpulse.schemas.stacks import RankStacks, parse_dump, render
from tests.waiting import wait_for

CHILD = textwrap.dedent(
    """
    import ctypes, logging, signal, sys, threading
    from pathlib import Path
    from rlpulse.producers.caller.stacks import enable_stack_dumps

    logging.basicConfig(level=logging.WARNING)
    if sys.argv[2] == "taken":
        signal.signal(signal.SIGRTMIN + 3, lambda *_: None)
    dump = enable_stack_dumps("SIGRTMIN+3", Path(sys.argv[1]))
    started = threading.Event()

    def waits_for_a_peer_forever():
        started.set()
        threading.Event().wait()

    threading.Thread(target=waits_for_a_peer_forever, name="helper", daemon=True).start()
    started.wait()
    print("registered" if dump else "unregistered", threading.get_ident(), flush=True)
    if sys.argv[2] == "holds-the-gil":
        ctypes.PyDLL(None).sleep(3600)  # stuck in C, the GIL held: no thread can answer
    waits_for_a_peer_forever()
    """
)


def start_child(directory: Path, mode: str = "free") -> tuple[subprocess.Popen[str], str, int]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    said, ident = child.stdout.readline().split()[-2:]
    return child, said, int(ident)


def test_a_signal_name_reads_as_its_number() -> None:
    assert signal_number("SIGRTMIN+3") == signal.SIGRTMIN + 3
    assert signal_number("sigusr2") == signal.SIGUSR2
    assert signal_number("off") is None
    with pytest.raises(ValueError, match="no signal called 'SIGNOPE'"):
        signal_number("SIGNOPE")
    with pytest.raises(ValueError, match="cannot carry a stack dump"):
        signal_number("SIGKILL")


def test_the_agent_takes_a_blocked_process_stacks_and_reports_a_gone_one(
    tmp_path: Path,
) -> None:
    child, said, loop = start_child(tmp_path)
    assert said == "registered"
    path = tmp_path / f"{child.pid}.stacks"
    alive = RankProcess(child.pid, signal.SIGRTMIN + 3, path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    ended = RankProcess(gone.pid, signal.SIGRTMIN + 3, tmp_path / "none.stacks")
    try:
        take_stacks([alive, ended], wait_s=10.0)
        assert child.poll() is None  # asked, it did not die
    finally:
        child.kill()
        child.wait()
    assert (alive.outcome, ended.outcome) == ("stacks", "gone")
    assert alive.via == "thread"  # the GIL was free: its own thread answered, no signal
    threads = parse_dump(alive.text)
    assert len(threads) == 2
    assert all(any("in waits_for_a_peer_forever" in f for f in t.frames) for t in threads)
    first = parse_dump(render(threads, loop))[0]
    assert first.ident == loop  # the training loop's thread comes first


def test_a_pid_given_to_a_newer_process_is_never_signalled(tmp_path: Path) -> None:
    """A rank that died long ago may share its pid with a live process (pids wrap): the agent
    reports the rank gone and leaves that process alone (the signal's default would end it)."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    made_long_before = time.time_ns() - 3_600_000_000_000
    meta = LogMeta(tmp_path, "run", "p-1", "events", "logs", made_long_before, pid=stranger.pid)
    rank = RankProcess(stranger.pid, signal.SIGRTMIN + 3, tmp_path / "rank.stacks", [meta])
    try:
        time.sleep(0.5)
        take_stacks([rank], wait_s=1.0)
        assert stranger.poll() is None  # not signalled
    finally:
        stranger.kill()
        stranger.wait()
    assert rank.outcome == "gone"


NANOSLEEPS = {"x86_64": {35, 230}, "aarch64": {101, 115}}
"""The system calls ``sleep()`` makes (nanosleep, clock_nanosleep), by machine."""


def in_sleep(pid: int) -> bool:
    """Whether ``pid``'s main thread is in ``sleep()``'s system call (``/proc``: its wait
    channel, or the call it is in)."""
    wchan = Path(f"/proc/{pid}/wchan").read_text()
    call = Path(f"/proc/{pid}/syscall").read_text().split()[0]
    return "nanosleep" in wchan or (
        call.isdigit() and int(call) in NANOSLEEPS.get(os.uname().machine, set())
    )


def test_a_process_stuck_in_c_holding_the_gil_answers_the_signal(tmp_path: Path) -> None:
    child, _said, loop = start_child(tmp_path, "holds-the-gil")
    process = RankProcess(child.pid, signal.SIGRTMIN + 3, tmp_path / f"{child.pid}.stacks")
    try:
        # From its print to its sleep() the GIL changes hands: asked then, its thread answers.
        wait_for(lambda: in_sleep(child.pid), "the child in sleep(), the GIL held", 10.0, 0.01)
        take_stacks([process], wait_s=4.0)
        assert child.poll() is None  # faulthandler dumped, the signal did not kill
    finally:
        child.kill()
        child.wait()
    assert (process.outcome, process.via) == ("stacks", "signal")
    threads = {thread.ident: thread for thread in parse_dump(process.text)}
    assert threads[loop].top.endswith("in <module>")  # the line that called sleep()
    assert any("in _answer" in f for t in threads.values() for f in t.frames)  # it waited


def test_a_signal_with_a_handler_is_left_alone_with_one_warning(tmp_path: Path) -> None:
    child, said, _loop = start_child(tmp_path, "taken")
    child.kill()
    _out, err = child.communicate()
    assert said == "unregistered"
    assert "already has a handler" in err and "agent.stacks_signal" in err


C10D = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
DUMP_WAITING = f"""Thread 0x00007f0000000001 (most recent call first):
  File "{C10D}", line 2806 in all_reduce
  File "/home/me/train.py", line 40 in step
"""
DUMP_STUCK = """Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 629 in wait
  File "/home/me/data.py", line 88 in next_batch
  File "/home/me/train.py", line 35 in step
"""


def test_ranks_are_grouped_by_their_loops_frame_the_smallest_group_first() -> None:
    ranks = [
        RankStacks(0, "stacks", 4, "h0", 10, DUMP_WAITING),
        RankStacks(1, "stacks", 4, "h0", 11, DUMP_WAITING),
        RankStacks(2, "stacks", 3, "h1", 12, DUMP_STUCK),
        RankStacks(3, "stacks", 4, "h1", 13, DUMP_WAITING),
        RankStacks(4, "gone", 4, "h1", 14, ""),
        RankStacks(5, "gone", 4, "h1", 15, ""),
    ]
    assert describe_groups(group_ranks(ranks)) == [
        "1 rank in wait threading.py:629, from next_batch data.py:88 (2)",
        "2 ranks process gone (4, 5)",
        "3 ranks in all_reduce distributed_c10d.py:2806, from step train.py:40 (0, 1, 3)",
    ]
