"""A torchrun-style training loop on a :class:`~rlpulse.producers.RunLink`, as a user writes it.

Run as one process or under ``torchrun --nproc_per_node N`` (gloo, CPU). Every rank, every
step: log stage ``actor`` (``kl_divergence`` 0.1, or 0.5 from ``--kl-from`` on), poll the
commands (rank 0 polls, ``torch_broadcast`` hands them to every rank), ack the ones that are
not a stop, then ``exit_if_stopped(step)``. A run no command stops ends after ``--steps``
with ``link.close()``. With ``--pid-dir``, each rank writes its process id to
``rank<N>.pid`` there first (torchrun starts the ranks in sessions of their own).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch.distributed as dist

from rlpulse.producers import RunLink, Settings
from rlpulse.producers.integrations.torch_dist import torch_broadcast


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--kl-from", type=int, default=0, help="0: KL stays low")
    parser.add_argument("--attempt", type=int, default=0)
    parser.add_argument("--step-s", type=float, default=0.1)
    parser.add_argument("--pid-dir", type=Path)
    options = parser.parse_args()

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1:
        dist.init_process_group("gloo")
    rank = int(os.environ.get("RANK", "0"))
    if options.pid_dir is not None:
        (options.pid_dir / f"rank{rank}.pid").write_text(str(os.getpid()))
    link = RunLink(
        options.run_id,
        rank=rank,
        world_size=world_size,
        attempt=options.attempt,
        settings=Settings(bootstrap=options.bootstrap, prefix=options.prefix),
        broadcast=torch_broadcast,
    )
    if rank == 0:
        link.run_start(1)
    for step in range(1, options.steps + 1):
        high = options.kl_from and step >= options.kl_from
        link.log({"kl_divergence": 0.5 if high else 0.1, "loss": 1.0 / step}, step, "actor")
        for command in link.poll_commands():
            if command is not link.stop_command:
                link.ack(command, "applied", applied_at_step=step)
        link.exit_if_stopped(step)
        time.sleep(options.step_s)
    link.close()


if __name__ == "__main__":
    main()
