"""``rlpulse demo``: one simulated 8-rank RL run through the real pipeline.

The demo starts (or reuses) the local Kafka broker, a worker with the seed rules and an
exporter (Prometheus metrics, namespace ``verl``, on a free port; its URL is printed first),
an archiver (into the demo's own directory, rolled every second) and the run page
(``rlpulse ui``, its URL printed), then plays a PPO-like run: its reward turns unstable
around step 20 and its KL divergence passes 0.3 from step 40. Each rank logs text records
too (a WARNING when the reward swings, an ERROR while the KL is above 0.3), and rank 0 its
rollout samples (64 a step; once the KL is past the limit more and more of them end in a
loop, cut at the length limit). The run reacts to
the commands it receives — the rollout batch doubles to 128, then 256 and no further; a
checkpoint is written; the run stops — and acknowledges each one. At the end it prints a few
of the gauges the exporter serves and the verdicts on the doublings (they did not help: the
reward keeps swinging); on a terminal, the page stays up until Ctrl-C. It exits 0
when kl-guard stopped the run.
"""

from __future__ import annotations

import math
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.local.broker import LocalBroker, tail
from rlpulse.local.child_process import free_port
from rlpulse.local.exceptions import LocalError
from rlpulse.local.exporter_process import ExporterProcess
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers import ControlClient, EventLogger
from rlpulse.schemas.records import AckStatus, ControlCommand
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.transport.bootstrap import bootstrap_servers
from rlpulse.transport.clients import new_admin
from rlpulse.transport.topics import delete_topics, ensure_topics
from rlpulse.ui.exceptions import UiError

if TYPE_CHECKING:
    from rlpulse.ui.server import UiServer

__all__ = ["SimulatedRun", "play", "run_demo"]

WORLD_SIZE = 8
INITIAL_ROLLOUT_BATCH = 64
MAX_STEPS = 90
UNSTABLE_FROM, UNSTABLE_UNTIL = 20, 38
KL_BREACH_FROM = 40
KL_LIMIT = 0.3
NAMESPACE = "verl"
SHOWN_GAUGES = ("verl_reward_mean", "verl_kl_divergence")
SHOWN_VERDICTS = "rlpulse_run_action_verdicts_total{"
SHOWN_RANKS = ('rank="0"', 'rank="1"')
SAMPLES_PER_STEP = 64
"""Rollout samples rank 0 logs each step (16 prompts, 4 answers each)."""


@dataclass
class SimulatedRun:
    """The trainer's side of the demo: metrics per rank, and the knobs commands turn."""

    run_id: str
    checkpoint_dir: Path
    rollout_batch: int = INITIAL_ROLLOUT_BATCH
    stopped_by: str | None = None
    checkpoints: list[str] = field(default_factory=list)
    rng: random.Random = field(default_factory=lambda: random.Random(7))

    def rollout_metrics(self, step: int, rank: int) -> dict[str, float]:
        """Reward is steady, then swings by +-1.5 between steps from step 20 to 38."""
        reward = 1.0 + 0.02 * step + self.rng.gauss(0.0, 0.05)
        if UNSTABLE_FROM <= step <= UNSTABLE_UNTIL:
            reward += 1.5 if step % 2 else -1.5
        return {"reward_mean": reward, "response_length": 400.0 + 5 * rank}

    def actor_metrics(self, step: int, rank: int) -> dict[str, float]:
        """KL creeps up slowly, then jumps past 0.3 from step 40."""
        kl = 0.05 + 0.002 * step + self.rng.uniform(0.0, 0.01)
        if step >= KL_BREACH_FROM:
            kl = 0.35 + 0.01 * (step - KL_BREACH_FROM) + self.rng.uniform(0.0, 0.02)
        return {"kl_divergence": kl, "policy_loss": 0.3 + self.rng.gauss(0.0, 0.01)}

    def rollout_samples(self, step: int) -> list[dict[str, object]]:
        """Rank 0's rollout samples of the step: 16 prompts x 4 answers, arithmetic.

        While the KL is past the limit more and more answers end in a loop (and hit the
        length limit); the reward stays as the metrics say. A random source of its own: the
        metrics (and so the commands) are those of a run without samples.
        """
        rng = random.Random(step)
        looping = max(0.0, min(0.8, 0.1 * (step - KL_BREACH_FROM + 1)))
        samples: list[dict[str, object]] = []
        prompts = [
            (rng.randrange(2, 50), rng.randrange(2, 50)) for _ in range(SAMPLES_PER_STEP // 4)
        ]
        for index in range(SAMPLES_PER_STEP):
            a, b = prompts[index // 4]  # a group: 4 answers to one prompt
            right = rng.random() < 0.6
            answer = a + b if right else a + b + rng.choice((-1, 1))
            response = (
                f"{a} plus {b}: first {a} + {b - b % 10} = {a + b - b % 10}, then add "
                f"{b % 10}. The answer is {answer}."
            )
            cut = rng.random() < looping
            if cut:
                response = f"{a} plus {b}: " + "let me add them again, " * 200
            samples.append(
                {
                    "prompt": f"What is {a} plus {b}?",
                    "response": response,
                    "reward": 0.0 if cut else float(right),
                    "group": f"step{step}-q{index // 4}",
                    "data_source": "word-problems" if index // 4 % 4 == 0 else "arithmetic",
                    "scores": {"correct": float(right and not cut), "format": 0.0 if cut else 1.0},
                    "truncated": cut,
                    "ground_truth": str(a + b),
                }
            )
        return samples

    def apply(self, command: ControlCommand, step: int) -> tuple[AckStatus, dict[str, str]]:
        """Apply every action of ``command``; return the ack status and its detail."""
        status: AckStatus = "noop"
        detail: dict[str, str] = {}
        for action in command["actions"]:
            params = action["params"]
            if action["type"] == "scale_rollout_batch":
                factor = float(params.get("factor") or 1.0)
                low = int(params.get("min") or 1)
                high = int(params.get("max") or 1 << 30)
                old = self.rollout_batch
                self.rollout_batch = min(max(round(old * factor), low), high)
                detail.update(old_batch=str(old), new_batch=str(self.rollout_batch))
                if self.rollout_batch != old:
                    status = "applied"
            elif action["type"] == "checkpoint":
                path = self.checkpoint_dir / f"step_{step}_{params.get('tag') or 'manual'}.ckpt"
                path.write_text(f"simulated weights of {self.run_id} at step {step}\n")
                self.checkpoints.append(str(path))
                detail["checkpoint_path"] = str(path)
                status = "applied"
            elif action["type"] == "stop":
                self.stopped_by = command["rule_id"] or "operator"
                detail["stopped_at_step"] = str(step)
                status = "applied"
        return status, detail


def run_demo(
    settings: Settings,
    step_interval_s: float = 0.25,
    console: Console | None = None,
) -> int:
    """Run the demo end to end; return the process exit code (0 = stopped by kl-guard).

    Without a ``bootstrap`` setting it starts (or reuses) the local broker, and stops it at
    the end if it started it. The run page (``rlpulse ui``) is served while it plays, and on
    a terminal until Ctrl-C after it.
    """
    say = console or Console()
    broker: LocalBroker | None = None
    if settings.bootstrap is None:
        broker = LocalBroker(settings)
        started_here = broker.info() is None
        address = broker.up(progress=lambda msg: say.print(f"[dim]{msg}…[/]")).bootstrap
        if not started_here:
            broker = None  # reused: not ours to stop
    else:
        address = bootstrap_servers(settings)
    topics = Topics(prefix=f"rlpulse-demo-{uuid.uuid4().hex[:8]}")
    workdir = Path(tempfile.mkdtemp(prefix="rlpulse-demo-"))
    archive = workdir / "archive"
    settings = settings.model_copy(
        update={
            "bootstrap": address,
            "prefix": topics.prefix,
            "archive": settings.archive.model_copy(update={"root": str(archive)}),
        }
    )
    worker = WorkerProcess(
        address, topics.prefix, workdir / "worker.log", rules="seed", partitions=3, grace_s=5.0
    )
    exporter = ExporterProcess(
        address, topics.prefix, workdir / "exporter.log", free_port(), namespace=NAMESPACE
    )
    archiver = ArchiverProcess(
        address, topics.prefix, archive, workdir / "archiver.log", {"archive.roll_s": 1}
    )
    server = None
    try:
        ensure_topics(settings, topics, partitions=3)
        say.print(f"[dim]Starting a worker with the seed rules (log: {worker.log_file})…[/]")
        worker.start()
        exporter.start()
        archiver.start()
        server = _serve_page(settings)
        say.print(f"The run's page: {server.url}", highlight=False)
        say.print(f"Prometheus metrics of the run: {exporter.url}", highlight=False)
        worker.wait_consuming(timeout_s=90.0)
        exporter.wait_ready(timeout_s=90.0)
        code = play(say, settings, workdir, lambda: _alive(worker), step_interval_s)
        _show_gauges(say, exporter)
        if sys.stdin.isatty() and sys.stdout.isatty():
            _keep_page(say, server.url, archive, topics.prefix)
        return code
    finally:
        if server is not None:
            server.stop()
        archiver.stop()
        exporter.stop()
        worker.stop()
        _delete_topics(settings, topics)
        if broker is not None:
            say.print("[dim]Stopping the Kafka broker the demo started…[/]")
            broker.down()


def _alive(worker: WorkerProcess) -> bool:
    if not worker.alive():
        raise LocalError(f"the worker died; its log:\n{tail(worker.log_file, 30)}")
    return True


def _serve_page(settings: Settings) -> UiServer:
    """The run page on ``ui.port`` (another free port if that one is taken)."""
    from rlpulse.ui.data import run_data
    from rlpulse.ui.server import UiServer

    data = run_data(settings)
    for port in (settings.ui.port, 0):
        server = UiServer(data, settings.ui.host, port)
        try:
            server.start()
            return server
        except UiError:
            if port == 0:
                data.close()
                raise
    raise AssertionError("unreachable")


def _keep_page(say: Console, url: str, archive: Path, prefix: str) -> None:
    say.print(
        f"The run's page stays at {url} until Ctrl-C (later: rlpulse ui --archive {archive} "
        f"--prefix {prefix} --no-live).",
        highlight=False,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        say.print("")


def play(
    say: Console,
    settings: Settings,
    workdir: Path,
    worker_alive: Callable[[], bool],
    step_interval_s: float,
    run_id: str | None = None,
) -> int:
    """Play the simulated run on the broker ``settings`` name, with a worker already running.

    Returns 0 when kl-guard stopped it. ``worker_alive`` is checked every step (a dead worker
    raises :class:`LocalError`). Used by the demo and by the run page's tests.
    """
    run = SimulatedRun(run_id=run_id or f"demo-ppo-{uuid.uuid4().hex[:6]}", checkpoint_dir=workdir)
    ranks = [
        EventLogger(run.run_id, rank=rank, world_size=WORLD_SIZE, settings=settings)
        for rank in range(WORLD_SIZE)
    ]
    control = ControlClient(run.run_id, settings=settings)
    say.print(
        f"[bold]Run {run.run_id}[/]: {WORLD_SIZE} ranks, rollout batch {run.rollout_batch}; "
        "rules: unstable-reward (var of reward over 5 steps > 0.5 -> x2, max 256), "
        "kl-guard (KL > 0.3 for 3 steps -> checkpoint, stop)"
    )
    ranks[0].run_start()
    try:
        for step in range(1, MAX_STEPS + 1):
            if not worker_alive():
                raise LocalError("the worker died; see its log")
            _log_step(say, run, ranks, step)
            time.sleep(step_interval_s)
            for command in control.poll(timeout_s=0.05):
                _apply_and_ack(say, run, control, command, step)
            if run.stopped_by is not None:
                break
        else:
            say.print(f"[bold red]The run reached step {MAX_STEPS} without being stopped.[/]")
            return 1
    finally:
        ranks[0].run_end(step)
        for logger in ranks:
            logger.close(timeout_s=5.0)
        control.close()
    say.print(
        f"[bold]Run stopped by {run.stopped_by} at step {step}[/]; rollout batch "
        f"{INITIAL_ROLLOUT_BATCH} -> {run.rollout_batch}; checkpoints: {', '.join(run.checkpoints)}"
    )
    return 0 if run.stopped_by == "kl-guard" else 1


def _log_step(say: Console, run: SimulatedRun, ranks: list[EventLogger], step: int) -> None:
    rewards, kls = [], []
    for rank, logger in enumerate(ranks):
        rollout = run.rollout_metrics(step, rank)
        actor = run.actor_metrics(step, rank)
        rewards.append(rollout["reward_mean"])
        kls.append(actor["kl_divergence"])
        logger.log(rollout, step=step, stage="rollout")
        logger.log(actor, step=step, stage="actor")
        _log_text(logger, step, rank, rollout, actor)
    ranks[0].log_samples(run.rollout_samples(step), step, world_size=1)
    for logger in ranks:
        logger.flush(timeout_s=5.0)
    reward, kl = math.fsum(rewards) / WORLD_SIZE, math.fsum(kls) / WORLD_SIZE
    say.print(
        f"step {step:3d}  rollout batch {run.rollout_batch:3d}  reward {reward:6.2f}  KL {kl:.3f}",
        highlight=False,
    )


def _log_text(
    logger: EventLogger,
    step: int,
    rank: int,
    rollout: dict[str, float],
    actor: dict[str, float],
) -> None:
    """The text records a trainer writes: progress on rank 0, warnings and errors anywhere."""
    if rank == 0:
        logger.log_record(
            "INFO", 20, "demo.trainer", f"step {step} done", step=step, stage="trainer"
        )
    if UNSTABLE_FROM <= step <= UNSTABLE_UNTIL and rank % 4 == 1:
        logger.log_record(
            "WARNING",
            30,
            "demo.rollout",
            f"reward {rollout['reward_mean']:.2f} swings far from its recent mean",
            step=step,
            stage="rollout",
        )
    if actor["kl_divergence"] > KL_LIMIT and rank % 2 == 0:
        logger.log_record(
            "ERROR",
            40,
            "demo.actor",
            f"KL {actor['kl_divergence']:.3f} above {KL_LIMIT} on rank {rank}: the policy drifts "
            "from the reference model",
            step=step,
            stage="actor",
        )


def _apply_and_ack(
    say: Console, run: SimulatedRun, control: ControlClient, command: ControlCommand, step: int
) -> None:
    say.print(
        f"  [yellow]command[/] {command['rule_id']} (issued for step {command['step']}): "
        f"{command['reason']}",
        highlight=False,
    )
    status, detail = run.apply(command, step)
    control.ack(command, status, applied_at_step=step, detail=detail)
    shown = ", ".join(f"{k}={v}" for k, v in detail.items())
    say.print(f"  [green]ack[/] {status} at step {step}: {shown}", highlight=False)


def _show_gauges(say: Console, exporter: ExporterProcess, timeout_s: float = 15.0) -> None:
    """Print the exporter's reward and KL gauges of ranks 0 and 1, once it has the run's end."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            lines = exporter.scrape().splitlines()
        except OSError:
            lines = []
        ended = [line for line in lines if line.startswith("rlpulse_run_ended{")]
        if ended and all(line.endswith(" 1.0") for line in ended):
            break
        time.sleep(0.2)
    else:
        say.print(f"[yellow]The exporter at {exporter.url} did not show the run's end.[/]")
        return
    say.print(f"What Prometheus scrapes from {exporter.url} (ranks 0 and 1):", highlight=False)
    shown = [
        line
        for line in lines
        if line.startswith(SHOWN_GAUGES) and any(rank in line for rank in SHOWN_RANKS)
    ]
    for line in sorted(shown, key=lambda line: (SHOWN_GAUGES.index(line.split("{")[0]), line)):
        say.print(f"  {line}", highlight=False, soft_wrap=True)
    verdicts = sorted(line for line in lines if line.startswith(SHOWN_VERDICTS))
    if verdicts:
        say.print("Did the commands work? (verdicts of unstable-reward's expect)")
        for line in verdicts:
            say.print(f"  {line}", highlight=False, soft_wrap=True)


def _delete_topics(settings: Settings, topics: Topics) -> None:
    """Delete the demo's topics and its worker's internal topics (best effort)."""
    existing = new_admin(settings).list_topics(timeout=10).topics
    internal = [name for name in existing if name.startswith(f"{topics.prefix}-worker")]
    delete_topics(settings, [*topics.all(), *internal])
