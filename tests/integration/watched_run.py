"""A scripted 8-rank, 20-step run whose dashboard values can be computed by hand.

Every rank is a RunLink with system metrics on (every second, stage ``system``). Per step:

- ``rollout``: reward_mean = 1 + rank/8 + step/16 and throughput_tokens_per_sec =
  1000 + 10 rank + step (binary-exact, so sums over ranks are exact in any order);
- ``actor``: kl_divergence = 0.1 + rank/1000, and 0.5 + rank/1000 from step 18 on: the third
  step in a row above 0.3 is step 20 -> kl-guard (checkpoint, stop) at step 20;
  actor_loss and critic_loss cycle through small deviations around 0.5 and 0.8, the same on
  every rank, except actor_loss = 5.0 at step 15: with a z-score window of 10 steps the only
  step more than 3 std from the previous steps' mean is actor_loss at step 15.

Each rank logs one INFO record per step; rank 7 also an ERROR record in each step from
:data:`ERRORS_FROM` on (3 in all). Ranks 0-6 are delivered before rank 7 in every step, so
rank 7 is the straggler. A step takes
``step_s`` seconds, longer than Prometheus's 1 s scrape, so every step is scraped.
"""

from __future__ import annotations

import time
import uuid

from rlpulse.producers import RunLink
from rlpulse.schemas.records import ControlCommand
from rlpulse.schemas.topics import Topics
from tests.kafka import settings_at

RANKS = 8
STEPS = 20
KL_GUARD_STEP = 20
SPIKE_STEP = 15
SPIKE = 5.0
ZSCORE_WINDOW = 10
ERRORS_FROM = 18


def reward(step: int, rank: int) -> float:
    return 1.0 + rank / 8 + step / 16


def throughput(step: int, rank: int) -> float:
    return 1000.0 + 10 * rank + step


def kl(step: int, rank: int) -> float:
    return (0.5 if step >= 18 else 0.1) + rank / 1000


def actor_loss(step: int) -> float:
    return SPIKE if step == SPIKE_STEP else 0.5 + 0.01 * ((step * 7) % 5 - 2)


def critic_loss(step: int) -> float:
    return 0.8 + 0.01 * ((step * 3) % 5 - 2)


class WatchedRun:
    """The trainer side: one RunLink per rank (rank 0 polls and acks)."""

    def __init__(self, bootstrap: str, topics: Topics, step_s: float = 1.6) -> None:
        self.run_id = f"watched-{uuid.uuid4().hex[:8]}"
        self.step_s = step_s
        settings = settings_at(bootstrap, topics, producer={"system_metrics_interval_s": 1.0})
        self.links = [
            RunLink(self.run_id, rank=rank, world_size=RANKS, settings=settings)
            for rank in range(RANKS)
        ]
        self.commands: list[ControlCommand] = []

    def play(self) -> None:
        self.links[0].run_start(1)
        for step in range(1, STEPS + 1):
            began = time.monotonic()
            for stage, metrics in (("rollout", self.rollout), ("actor", self.actor)):
                for ranks in (range(RANKS - 1), [RANKS - 1]):  # rank 7 last
                    for rank in ranks:
                        self.links[rank].log(metrics(step, rank), step, stage)
                        if stage == "rollout":
                            self.log_text(step, rank)
                    for rank in ranks:
                        assert self.links[rank].flush(timeout_s=30.0) == 0
            time.sleep(max(0.0, self.step_s - (time.monotonic() - began)))

    def log_text(self, step: int, rank: int) -> None:
        link = self.links[rank]
        link.log_record("INFO", 20, "trainer", f"step {step} on rank {rank}", step=step)
        if rank == RANKS - 1 and step >= ERRORS_FROM:
            link.log_record("ERROR", 40, "trainer", f"KL too high at step {step}", step=step)

    @staticmethod
    def rollout(step: int, rank: int) -> dict[str, float]:
        return {
            "reward_mean": reward(step, rank),
            "throughput_tokens_per_sec": throughput(step, rank),
        }

    @staticmethod
    def actor(step: int, rank: int) -> dict[str, float]:
        return {
            "kl_divergence": kl(step, rank),
            "actor_loss": actor_loss(step),
            "critic_loss": critic_loss(step),
        }

    def receive_commands(self, want: int, timeout_s: float) -> None:
        """Poll (rank 0) until ``want`` commands arrived; ack each as applied."""
        deadline = time.monotonic() + timeout_s
        while len(self.commands) < want and time.monotonic() < deadline:
            for command in self.links[0].poll_commands(timeout_s=0.2):
                self.commands.append(command)
                self.links[0].ack(command, "applied", applied_at_step=STEPS)
        assert len(self.commands) >= want, f"got {self.commands}"

    def end(self) -> None:
        """Stop every rank's system sampling, then rank 0's run_end, then close."""
        for link in self.links:
            if link.system is not None:
                link.system.stop()
        self.links[0].run_end(STEPS)
        for link in self.links:
            link.close(timeout_s=10.0)
