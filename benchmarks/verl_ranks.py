"""What publishing its own metrics costs a verl worker rank, per update (verl_workers).

A rank's update runs ``--minibatches`` mini-batches of ``--micro`` micro-batches; rlpulse
reads each mini-batch's metrics before verl gathers them (:func:`rank_values`, the
rank's loss, :func:`add_ungathered` on verl's real output TensorDict) and, once per
update, reduces and renames them and logs one event (:class:`RankPublisher`). The
inputs are verl's own objects: ``Metric`` values as ``ppo_loss`` returns them (sum- and
mean-type), plain micro-batch lists, the micro-batch losses (floats: verl's engine
``.item()``s each). Each update is timed with
``perf_counter_ns`` (wall) and ``thread_time_ns`` (the CPU the training thread spent:
what the update costs it even when other processes hold the cores); the first update (it
builds the EventLogger and starts librdkafka) is reported on its own. The broker is an
unreachable address unless ``RLPULSE_BOOTSTRAP`` is set: ``log()`` only queues either way.
Prints one JSON line (with the 1-minute load average, since a shared machine's figures
need it); the target is a p50 under 50 us.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from figures import percentile, printer
from verl.utils import tensordict_utils as tu
from verl.utils.metric.utils import AggregationType, Metric

from rlpulse.producers.integrations.verl_workers import (
    RankPublisher,
    RunContext,
    add_ungathered,
    driver_names,
    rank_values,
    reduce_rank,
)

emit = printer("verl_ranks")
TARGET_US = 50.0


def minibatch(micro: int, seed: int) -> tuple[dict[str, Any], list[float], Any]:
    """One mini-batch as ``_postprocess_output`` sees it, and its output TensorDict."""
    generator = torch.Generator().manual_seed(seed)

    def draws(aggregation: AggregationType = AggregationType.MEAN) -> Metric:
        found = Metric(aggregation)
        found.extend(torch.rand(micro, generator=generator).tolist())
        return found

    metrics: dict[str, Any] = {
        "actor/pg_clipfrac": draws(),
        "actor/ppo_kl": draws(),
        "actor/pg_clipfrac_lower": draws(),
        "actor/pg_loss": draws(AggregationType.SUM),
        "actor/entropy_loss": draws(AggregationType.SUM),
        "kl_loss": draws(AggregationType.SUM),
        "kl_coef": [0.001] * micro,
        "grad_norm": 0.5,
        "lr": 1e-6,
    }
    losses = torch.rand(micro, generator=generator).tolist()  # verl's engine .item()s each
    final = {
        "loss": 0.3,
        "grad_norm": 0.5,
        "lr": 1e-6,
        "perf/max_memory_allocated_gb": 10.0,
        "perf/max_memory_reserved_gb": 12.0,
        "perf/cpu_memory_used_gb": 30.0,
        "mfu": 0.4,
        "actor/pg_loss": [0.1, 0.2],  # gathered: a list per rank, left out
    }
    result = tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": final})
    return metrics, losses, result


def update(
    publisher: RankPublisher,
    context: RunContext,
    batches: list[tuple[dict[str, Any], list[float], Any]],
) -> int:
    """rlpulse's part of one update of one rank (what the hooks do around verl's code).

    Returns the nanoseconds the mini-batches' part took (the rest is the publication).
    """
    start = time.perf_counter_ns()
    collected: dict[str, list[float]] = {}
    for metrics, losses, result in batches:
        names = frozenset(metrics).union(("loss",))
        rank_values(metrics, collected)
        collected.setdefault("loss", []).append(sum(losses))
        add_ungathered(collected, result, names)
    read = time.perf_counter_ns() - start
    publisher.publish(context, "actor", 0, 8, driver_names(reduce_rank(collected), "actor"))
    return read


def main() -> None:
    """Time ``--updates`` updates; print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--updates", type=int, default=2000)
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--micro", type=int, default=4)
    args = parser.parse_args()
    bootstrap = os.environ.get("RLPULSE_BOOTSTRAP") or "127.0.0.1:1"
    spool = Path(tempfile.mkdtemp(prefix="rlpulse-bench-spool-"))
    settings = {"bootstrap": bootstrap, "producer": {"spool_dir": str(spool)}}
    context = RunContext(f"bench-{uuid.uuid4().hex[:8]}", 0, 0, settings)
    batches = [minibatch(args.micro, seed) for seed in range(args.minibatches)]
    publisher = RankPublisher()
    samples: list[int] = []
    reading: list[int] = []
    cpu: list[int] = []
    start = time.perf_counter_ns()
    update(publisher, context, batches)
    first = time.perf_counter_ns() - start
    for step in range(1, args.updates + 1):
        context = RunContext(context.run_id, 0, step, settings)
        start, start_cpu = time.perf_counter_ns(), time.thread_time_ns()
        reading.append(update(publisher, context, batches))
        samples.append(time.perf_counter_ns() - start)
        cpu.append(time.thread_time_ns() - start_cpu)
    publisher.close()
    p50 = percentile(samples, 50) / 1e3
    emit(
        "rank_update",
        broker="up" if "RLPULSE_BOOTSTRAP" in os.environ else "unreachable",
        updates=args.updates,
        minibatches=args.minibatches,
        micro_batches=args.micro,
        first_update_us=first / 1e3,
        p50_us=p50,
        p99_us=percentile(samples, 99) / 1e3,
        minibatches_p50_us=percentile(reading, 50) / 1e3,
        thread_cpu_p50_us=percentile(cpu, 50) / 1e3,
        thread_cpu_mean_us=statistics.fmean(cpu) / 1e3,
        load_average_1m=os.getloadavg()[0],
        mean_us=statistics.fmean(samples) / 1e3,
        max_us=max(samples) / 1e3,
        target_us=TARGET_US,
        under_target=p50 < TARGET_US,
        cpu_under_target=percentile(cpu, 50) / 1e3 < TARGET_US,
    )


if __name__ == "__main__":
    main()
