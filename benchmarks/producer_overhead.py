"""What ``log()`` costs the training loop: rlpulse against wandb offline, broker up and down.

Every scenario logs the same dict of ``--metrics`` float metrics ``--calls`` times in a
tight loop (the worst case for the background work both libraries do) and times each call
with ``perf_counter_ns``. The first call is reported on its own (rlpulse makes its
write-ahead log there and has the host's agent started) and left out of the percentiles.
The training process holds no Kafka client: ``log()`` appends to the write-ahead log and
wakes the host's agent, another process, when it sleeps. Scenarios:

- ``rlpulse`` with the broker up (``RLPULSE_BOOTSTRAP``, else a local broker this
  script starts and stops), the host's agent sending; the events are checked to be
  delivered;
- ``rlpulse`` with the broker down (an unreachable address): the agent cannot deliver,
  the events wait in the write-ahead log;
- ``rlpulse`` with no agent at all (``agent.start: never``): ``log()`` alone;
- ``wandb`` offline (``wandb.init(mode="offline")``, ``wandb.log(d, step=...)``);
- the every-50-ms pattern (``--paced-calls`` calls, one every 50 ms, as a training loop
  logs between steps, when caches and branch predictors are cold again): ``rlpulse``
  (broker up), a JSON line written and flushed to a file, and ``wandb`` offline;
- ``control_poll``: ``ControlClient.poll()`` while its start-up cannot reach the broker
  (what a training loop pays per step when Kafka is down), a ``poll(timeout_s=0.3)`` and
  the ``close()`` after it.

Prints one JSON object per line, then the ratios and the targets: in the tight loop rlpulse
p50 at most a 25th of wandb's (stretch: a 50th); every 50 ms, at most a flushed JSON line's;
and p99 under 1 ms with the broker down. Each scenario's agents are stopped at its end (one
that cannot deliver would otherwise keep trying).

``--baseline DIR`` first runs the benchmark of another source tree (an earlier commit
checked out in DIR: its own copy of this script against its own rlpulse) and prints its
lines with ``"code": "baseline"``, so that one run compares the two; ``--rounds N``
alternates the two N times, so that a machine that gets busier during the run shows as
noise in both rather than as a difference between them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from figures import percentile, printer

from rlpulse.local.broker import bootstrap_or_local_broker
from rlpulse.producers import ControlClient, EventLogger, Settings
from rlpulse.producers.delivery.agent_place import agent_alive, agents_under, read_json
from rlpulse.producers.delivery.spool_root import resolve_spool_root
from rlpulse.schemas.topics import Topics
from rlpulse.transport.topics import ensure_topics

UNREACHABLE = "127.0.0.1:1"
PACE_S = 0.05
"""The every-50-ms pattern: a training loop's log() between steps, the CPU cold by then."""


emit = printer("producer_overhead")


def timed_calls(
    call: Callable[[int], object], calls: int, every_s: float = 0.0
) -> dict[str, float]:
    """Time ``call(step)`` for ``calls`` steps; percentiles in microseconds.

    ``every_s`` > 0: one call every ``every_s`` seconds (sleeping between), as a training
    loop calls it, rather than back to back.
    """
    start = time.perf_counter_ns()
    call(0)
    first = time.perf_counter_ns() - start
    samples: list[int] = []
    for step in range(1, calls + 1):
        if every_s:
            time.sleep(every_s)
        start = time.perf_counter_ns()
        call(step)
        samples.append(time.perf_counter_ns() - start)
    samples.sort()
    return {
        "calls": calls,
        "first_call_us": first / 1e3,
        "p50_us": percentile(samples, 50) / 1e3,
        "p99_us": percentile(samples, 99) / 1e3,
        "p999_us": percentile(samples, 99.9) / 1e3,
        "max_us": samples[-1] / 1e3,
        "mean_us": statistics.fmean(samples) / 1e3,
    }


def running_broker() -> AbstractContextManager[str]:
    return bootstrap_or_local_broker(Settings(), Path(tempfile.mkdtemp(prefix="rlpulse-bench-")))


def bench_rlpulse(
    scenario: str, settings: Settings, metrics: dict[str, float], calls: int, every_s: float = 0.0
) -> dict[str, float]:
    logger = EventLogger(f"bench-{uuid.uuid4().hex[:8]}", settings=settings)
    if settings.agent.start == "auto":  # the agent runs before the calls are timed
        logger.log(metrics, -1, "trainer")
        deadline = time.monotonic() + 30
        while logger.agent is not None and not agent_alive(logger.agent.lock):
            assert time.monotonic() < deadline, "the host's agent did not start"
            time.sleep(0.05)
    figures = timed_calls(lambda step: logger.log(metrics, step, "trainer"), calls, every_s)
    if scenario.startswith("up"):
        logger.flush(60.0)
        figures["delivered"] = logger.delivered
    logger.close(timeout_s=30.0 if scenario.startswith("up") else 0.5)
    stop_agents(settings)
    emit("rlpulse", broker=scenario, **figures)
    return figures


def stop_agents(settings: Settings) -> None:
    """SIGTERM the agents of ``settings``' spool and wait for them (at most 30 s)."""
    root = resolve_spool_root(settings).path
    running = [d for d in agents_under(root) if agent_alive(d / "lock")]
    for directory in running:
        pid = (read_json(directory / "agent.json") or {}).get("pid")
        if isinstance(pid, int):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while any(agent_alive(d / "lock") for d in running) and time.monotonic() < deadline:
        time.sleep(0.1)


def bench_json_line(
    metrics: dict[str, float], calls: int, path: Path, every_s: float
) -> dict[str, float]:
    """A JSON line per call, written and flushed to a file: the least a logger can do."""
    with path.open("w") as handle:

        def write(step: int) -> None:
            handle.write(json.dumps({"step": step, **metrics}) + "\n")
            handle.flush()

        return timed_calls(write, calls, every_s)


def bench_wandb(
    metrics: dict[str, float], calls: int, directory: Path, every_s: float = 0.0
) -> dict[str, Any] | None:
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        import wandb
    except ImportError as exc:
        emit("wandb_offline", error=f"wandb is not installed ({exc}); pip install wandb")
        return None
    run = wandb.init(mode="offline", dir=str(directory), project="rlpulse-overhead")
    try:
        figures = timed_calls(lambda step: wandb.log(metrics, step=step), calls, every_s)
    finally:
        run.finish()
    return {"version": wandb.__version__, **figures}


def run_baseline(tree: Path, calls: int, metric_count: int) -> None:
    """Run ``tree``'s copy of this benchmark against ``tree``'s rlpulse; re-print its lines."""
    script = tree / "benchmarks" / "producer_overhead.py"
    command = [sys.executable, str(script), "--calls", str(calls), "--metrics", str(metric_count)]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        command, cwd=tree, env=env, capture_output=True, text=True, timeout=1800, check=False
    )
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            print(json.dumps({**json.loads(line), "code": "baseline"}), flush=True)
    if done.returncode != 0:
        emit("baseline", error=done.stderr.strip().splitlines()[-1:], code=str(tree))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--metrics", type=int, default=20)
    parser.add_argument(
        "--paced-calls", type=int, default=400, help="calls of the every-50-ms pattern"
    )
    parser.add_argument("--baseline", type=Path, default=None, help="an earlier source tree")
    parser.add_argument(
        "--rounds", type=int, default=1, help="alternate baseline and this tree this many times"
    )
    args = parser.parse_args()
    for round_index in range(args.rounds):
        if args.baseline is not None:
            run_baseline(args.baseline, args.calls, args.metrics)
        emit("round", index=round_index)
        measure(args.calls, args.metrics, args.paced_calls)


def bench_poll_broker_down(calls: int) -> None:
    """How long ``ControlClient.poll()`` takes while its start-up cannot reach the broker."""
    client = ControlClient(
        f"bench-{uuid.uuid4().hex[:8]}", settings=Settings(bootstrap=UNREACHABLE)
    )
    figures = timed_calls(lambda _step: client.poll(), calls)
    start = time.perf_counter()
    client.poll(timeout_s=0.3)
    waited = time.perf_counter() - start
    start = time.perf_counter()
    client.close()
    emit(
        "control_poll",
        broker="down",
        **figures,
        poll_timeout_0_3_s_took_s=round(waited, 3),
        close_s=round(time.perf_counter() - start, 3),
    )


def measure(calls: int, metric_count: int, paced_calls: int) -> None:
    """One round of every scenario of this tree."""
    metrics = {f"metric_{i:02d}": 0.5 + i for i in range(metric_count)}
    bench_poll_broker_down(min(calls, 2_000))
    work = Path(tempfile.mkdtemp(prefix="rlpulse-overhead-"))
    spool = work / "spool"
    results: dict[str, dict[str, float]] = {}
    with running_broker() as bootstrap:
        topics = Topics(prefix=f"bench-{uuid.uuid4().hex[:8]}")
        ensure_topics(Settings(bootstrap=bootstrap), topics, partitions=3)
        up = Settings(bootstrap=bootstrap, prefix=topics.prefix).updated(
            {"producer.spool_dir": spool}
        )
        results["up"] = bench_rlpulse("up", up, metrics, calls)
        paced = bench_rlpulse("up_every_50ms", up, metrics, paced_calls, PACE_S)
    down = Settings(bootstrap=UNREACHABLE).updated({"producer.spool_dir": spool})
    results["down"] = bench_rlpulse("down", down, metrics, calls)
    alone = down.updated({"agent.start": "never"})
    results["no_agent"] = bench_rlpulse("no_agent", alone, metrics, calls)
    wandb_figures = bench_wandb(metrics, calls, work / "wandb")
    if wandb_figures is not None:
        emit("wandb_offline", **wandb_figures)
        for scenario, figures in results.items():
            ratio = wandb_figures["p50_us"] / figures["p50_us"]
            emit(
                "ratio",
                broker=scenario,
                wandb_over_rlpulse_p50=round(ratio, 1),
                wandb_over_rlpulse_p99=round(wandb_figures["p99_us"] / figures["p99_us"], 1),
                target="rlpulse p50 <= wandb p50 / 25 (stretch / 50)",
                met=ratio >= 25,
                stretch_met=ratio >= 50,
            )
    line = bench_json_line(metrics, paced_calls, work / "lines.jsonl", PACE_S)
    emit("json_line_every_50ms", **line)
    paced_wandb = bench_wandb(metrics, paced_calls, work / "wandb-paced", PACE_S)
    if paced_wandb is not None:
        emit("wandb_offline_every_50ms", **paced_wandb)
    emit(
        "ratio_every_50ms",
        rlpulse_p50_us=paced["p50_us"],
        json_line_p50_us=line["p50_us"],
        wandb_p50_us=None if paced_wandb is None else paced_wandb["p50_us"],
        rlpulse_over_json_line_p50=round(paced["p50_us"] / line["p50_us"], 2),
        target="rlpulse p50 <= a flushed JSON line's p50",
        met=paced["p50_us"] <= line["p50_us"],
    )
    for scenario in ("down", "no_agent"):
        p99 = results[scenario]["p99_us"]
        emit("target_p99_broker_down", broker=scenario, p99_us=p99, target_us=1000, met=p99 < 1000)


if __name__ == "__main__":
    main()
