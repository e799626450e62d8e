"""A scripted 4-rank, 60-step run whose rule firings can be computed by hand.

reward_mean (stage ``rollout``) is 1.0 on every rank except at step 30, where it is
3.0. The unstable-reward window (5 steps, population variance) first contains step
30 at step 30: values [1, 1, 1, 1, 3], mean 1.4, var (4 * 0.4**2 + 1.6**2) / 5 = 0.64
> 0.5 -> fires at step 30. It stays above 0.5 for steps 31..34 (the 3.0 is still in
the window) but the rule is in its 5-evaluation cooldown; from step 35 the window is
all 1.0 (var 0). So exactly one command, at step 30.

kl_divergence (stage ``actor``) is 0.1, except 0.4 at steps 45 and 46 (two in a row:
not enough), 0.2 at 47 (breaks the streak), and 0.5 from step 50 on: the third
consecutive value > 0.3 is step 52 -> checkpoint, then stop, exactly once (``once``,
and nothing follows a stop).

Rank 2 also logs ``entropy`` as NaN in every rollout step, which no rule watches: the
worker's state, its changelogs and a restarted worker's recovery all carry NaN.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer

from rlpulse.local.broker import tail
from rlpulse.producers import ControlClient, EventLogger
from rlpulse.schemas import default_codec
from rlpulse.schemas.records import CommandAck, ControlCommand, StepSummary
from rlpulse.schemas.topics import REASON_HEADER, Topics
from tests.kafka import read_all, read_to_end, settings_at

RANKS = 4
STEPS = 60
STAGES = ("rollout", "actor")
UNSTABLE_REWARD_STEP = 30
KL_GUARD_STEP = 52


def reward(step: int) -> float:
    return 3.0 if step == UNSTABLE_REWARD_STEP else 1.0


def kl(step: int) -> float:
    if step in (45, 46):
        return 0.4
    if step == 47:
        return 0.2
    return 0.5 if step >= 50 else 0.1


class ScriptedRun:
    """The trainer side of the scripted run: one EventLogger per rank and rank 0's ControlClient."""

    def __init__(self, bootstrap: str, topics: Topics, run_id: str | None = None) -> None:
        self.run_id = run_id or f"run-{uuid.uuid4().hex[:8]}"
        self.settings = settings_at(bootstrap, topics)
        self.ranks = [
            EventLogger(self.run_id, rank=rank, world_size=RANKS, settings=self.settings)
            for rank in range(RANKS)
        ]
        self.control = ControlClient(self.run_id, settings=self.settings)
        self.received: list[ControlCommand] = []

    def log_steps(
        self, steps: Iterable[int], ranks: Iterable[int] = range(RANKS), *, flush: bool = True
    ) -> None:
        """Log ``steps`` on ``ranks`` (default: all) and wait until the broker has them.

        ``flush=False`` returns once they are logged; :meth:`flush` waits for them later.
        """
        chosen = list(ranks)
        for step in steps:
            for rank in chosen:
                logger = self.ranks[rank]
                rollout = {"reward_mean": reward(step), "rank_time_s": 1.0 + rank}
                if rank == 2:  # a NaN in every rollout step: state and changelogs hold NaN
                    rollout["entropy"] = math.nan
                logger.log(rollout, step, "rollout")
                logger.log({"kl_divergence": kl(step)}, step, "actor")
        if flush:
            self.flush(chosen)

    def flush(self, ranks: Iterable[int] = range(RANKS)) -> None:
        """Wait until the broker has everything ``ranks`` logged."""
        for rank in ranks:
            assert self.ranks[rank].flush(timeout_s=30.0) == 0

    def receive_commands(self, want: int, timeout_s: float, settle_s: float = 3.0) -> None:
        """Poll and ack until ``want`` commands arrived (at most ``timeout_s``), then keep
        polling for ``settle_s`` whatever happened: a command that comes twice shows up."""
        deadline = time.monotonic() + timeout_s
        while len(self.received) < want and time.monotonic() < deadline:
            self._poll_once()
        settle_until = time.monotonic() + settle_s
        while time.monotonic() < settle_until:
            self._poll_once()

    def _poll_once(self) -> None:
        for command in self.control.poll(timeout_s=0.2):
            self.received.append(command)
            self.control.ack(command, "applied", applied_at_step=command["step"] + 1)

    def close(self) -> None:
        for logger in self.ranks:
            logger.close(timeout_s=10.0)
        self.control.close()


class PacedRuns(threading.Thread):
    """Logs ``steps`` of the given runs, one step of every run at a time, with a pause.

    Each step is logged by every run, then flushed by every run (the broker has it).
    ``gates``: steps it logs only once :meth:`open` was called for them (it waits up to
    ``gate_timeout_s`` before each), so that a test can keep the runs from outpacing what it
    does meanwhile. :attr:`step` is the last step every run has logged and the broker has;
    :attr:`logged_ns` the wall-clock time each run's events of each step were logged (before
    the flush), :attr:`held_s` how long each gate held the runs back. :meth:`stop` ends it at
    the next step.
    """

    def __init__(
        self,
        runs: Iterable[ScriptedRun],
        pause_s: float,
        steps: Iterable[int],
        gates: Iterable[int] = (),
        gate_timeout_s: float = 180.0,
    ) -> None:
        super().__init__(daemon=True)
        self.runs = list(runs)
        self.pause_s = pause_s
        self.steps = list(steps)
        self.error: BaseException | None = None
        self.step = 0
        self.logged_ns: dict[tuple[str, int], int] = {}
        self.held_s: dict[int, float] = {}
        self._gates = {step: threading.Event() for step in gates}
        self._gate_timeout_s = gate_timeout_s
        self._stopped = threading.Event()

    def open(self, step: int) -> None:
        """Let the runs go on to ``step`` (one of the gates)."""
        self._gates[step].set()

    def stop(self) -> None:
        """End the thread before its next step (a failing test's clean-up)."""
        self._stopped.set()
        for gate in self._gates.values():
            gate.set()

    def run(self) -> None:
        try:
            for step in self.steps:
                gate = self._gates.get(step)
                if gate is not None:
                    began = time.monotonic()
                    if not gate.wait(self._gate_timeout_s):
                        raise TimeoutError(f"the gate before step {step} was never opened")
                    self.held_s[step] = time.monotonic() - began
                if self._stopped.is_set():
                    return
                for run in self.runs:
                    run.log_steps([step], flush=False)
                    self.logged_ns[(run.run_id, step)] = time.time_ns()
                for run in self.runs:  # a flush waits a sender's round: one for all the runs
                    run.flush()
                self.step = step
                time.sleep(self.pause_s)
        except BaseException as exc:  # reported by the test
            self.error = exc


def by_run(values: list[bytes], decode: Callable[[bytes], Any]) -> dict[str, list[Any]]:
    """Decoded records grouped by their ``run_id``, in the order read."""
    grouped: dict[str, list[Any]] = {}
    for record in map(decode, values):
        grouped.setdefault(record["run_id"], []).append(record)
    return grouped


def dead_letters(bootstrap: str, topics: Topics) -> str:
    """What the worker sent to the dead-letter topic, one reason a line."""
    reasons = [
        dict(message.headers() or []).get(REASON_HEADER, b"?").decode(errors="replace")
        for message in read_all(bootstrap, topics.dlq, lambda _m: False, 3.0)
    ]
    return f"dead letters: {len(reasons)}" + "".join(f"\n  {reason}" for reason in reasons)


def log_tails(logs: Iterable[Path], lines: int = 30) -> str:
    """The last ``lines`` of each log, each under its name."""
    return "\n".join(f"--- {log.name}\n{tail(log, lines)}" for log in logs)


def consume_all(
    bootstrap: str, topic: str, stop: Callable[[list[bytes]], bool], timeout_s: float
) -> list[bytes]:
    """Read ``topic`` from the beginning until ``stop(values)`` is true or the deadline passes."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline and not stop(values):
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value() or b"")
    finally:
        consumer.close()
    return values


def until_ids(
    want: dict[str, int], decode: Callable[[bytes], Any], id_field: str, settle_s: float = 2.0
) -> Callable[[list[bytes]], bool]:
    """A ``consume_all`` stop: every run has ``want[run]`` distinct ids, then ``settle_s`` more.

    Each call decodes only the values that are new since the last one.
    """
    ids: dict[str, set[str]] = {run_id: set() for run_id in want}
    looked, settle = [0], [0.0]

    def enough(values: list[bytes]) -> bool:
        for value in values[looked[0] :]:
            record = decode(value)
            if record["run_id"] in ids:
                ids[record["run_id"]].add(record[id_field])
        looked[0] = len(values)
        if not settle[0] and all(len(ids[r]) >= n for r, n in want.items()):
            settle[0] = time.monotonic() + settle_s
        return bool(settle[0]) and time.monotonic() >= settle[0]

    return enough


def until_every_step_whole(
    run_id: str, decode: Callable[[bytes], StepSummary], settle_s: float = 2.0
) -> Callable[[list[bytes]], bool]:
    """A ``consume_all`` stop: the newest revision of each of ``run_id``'s steps (every stage,
    steps 1 to ``STEPS``) holds all ``RANKS`` ranks, then ``settle_s`` more.

    A rank that arrives after the grace period makes a revision, some time later: this waits
    for it rather than for a while. Each call decodes only the values new since the last one.
    """
    steps = {(stage, step) for stage in STAGES for step in range(1, STEPS + 1)}
    newest: dict[tuple[str, int], StepSummary] = {}
    looked, settle = [0], [0.0]

    def enough(values: list[bytes]) -> bool:
        for value in values[looked[0] :]:
            summary = decode(value)
            key = (summary["stage"], summary["step"])
            if summary["run_id"] == run_id and (
                key not in newest or summary["revision"] > newest[key]["revision"]
            ):
                newest[key] = summary
        looked[0] = len(values)
        whole = all(k in newest and len(newest[k]["ranks_reported"]) == RANKS for k in steps)
        if not settle[0] and whole:
            settle[0] = time.monotonic() + settle_s
        return bool(settle[0]) and time.monotonic() >= settle[0]

    return enough


def summaries_of(
    bootstrap: str,
    topics: Topics,
    run_id: str,
    want: int,
    timeout_s: float,
    settle_s: float = 2.0,
    *,
    whole: bool = False,
) -> list[StepSummary]:
    """Every StepSummary of ``run_id`` on the steps topic, once ``want`` distinct ids arrived
    (``whole``: once the newest revision of every step holds every rank), then ``settle_s``."""
    codec = default_codec()
    if whole:
        enough = until_every_step_whole(run_id, codec.decode_summary, settle_s)
    else:
        enough = until_ids({run_id: want}, codec.decode_summary, "summary_id", settle_s)
    raw = consume_all(bootstrap, topics.steps, enough, timeout_s)
    return [s for s in map(codec.decode_summary, raw) if s["run_id"] == run_id]


def acks_of(
    bootstrap: str, topics: Topics, run_id: str, want: int, timeout_s: float
) -> list[CommandAck]:
    codec = default_codec()
    counted = [0, 0]  # values looked at, acks of this run among them

    def enough(values: list[bytes]) -> bool:
        for value in values[counted[0] :]:
            counted[1] += codec.decode_ack(value)["run_id"] == run_id
        counted[0] = len(values)
        return counted[1] >= want

    raw = consume_all(bootstrap, topics.acks, enough, timeout_s)
    return [a for a in map(codec.decode_ack, raw) if a["run_id"] == run_id]


def commands_on_topic(
    bootstrap: str, topics: Topics, run_id: str, timeout_s: float = 60.0
) -> list[ControlCommand]:
    """Everything on the control topic for ``run_id`` (raw, before the client's dedupe)."""
    codec = default_codec()
    raw = [m.value() for m in read_to_end(bootstrap, topics.control, timeout_s)]
    return [c for c in map(codec.decode_command, raw) if c["run_id"] == run_id]
