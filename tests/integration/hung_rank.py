"""A torch.distributed (gloo) rank of a small job in which rank ``STUCK`` hangs at step ``HANG``.

Run as ``python hung_rank.py BOOTSTRAP PREFIX SPOOL RUN_ID PORT STORE_PORT MODE`` with ``RANK`` and
``WORLD_SIZE`` in the environment. Each rank logs a step a second through a real
``EventLogger`` and joins an ``all_reduce`` per step; at step ``HANG`` rank ``STUCK`` waits
forever in :func:`wait_for_a_batch_that_never_comes` (a Python frame, as a dataloader that
hangs) and prints ``stuck``. It prints ``ready`` once it logged its first step.

- MODE ``hang``: the others wait in the step's ``all_reduce``, inside gloo, as in a real hang.
- MODE ``killed``: the test SIGKILLs rank ``STUCK`` once it is stuck. gloo raises at once in a
  peer whose connection closed, where NCCL waits for its timeout (10 minutes in verl), so
  here the others wait for it in :func:`wait_for_the_peers`, a ``TCPStore`` wait that a
  dead peer never ends (inside C, like NCCL's).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from rlpulse.producers import EventLogger, Settings
from rlpulse.settings import ProducerSettings

STUCK, HANG = 2, 4


def wait_for_a_batch_that_never_comes() -> None:
    """Rank STUCK's hang: it never returns."""
    threading.Event().wait()


def wait_for_the_peers(store: dist.TCPStore) -> None:
    """The others' wait in MODE ``killed``: for a key the dead rank never sets."""
    store.wait([f"step-{HANG}-done"], timedelta(hours=1))


def main() -> None:
    bootstrap, prefix, spool, run_id, port, store_port, mode = sys.argv[1:8]
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    store = dist.TCPStore("127.0.0.1", int(store_port), world_size, rank == 0)
    settings = Settings(
        bootstrap=bootstrap, prefix=prefix, producer=ProducerSettings(spool_dir=Path(spool))
    )
    logger = EventLogger(run_id, rank=rank, world_size=world_size, settings=settings)
    for step in range(10**6):
        if rank == STUCK and step == HANG:
            print("stuck", flush=True)
            wait_for_a_batch_that_never_comes()
        logger.log({"loss": 1.0 / (step + 1)}, step=step, stage="actor")
        if mode == "killed" and step == HANG:
            wait_for_the_peers(store)
        if step == 0:
            print("ready", flush=True)
        total = torch.ones(1)
        dist.all_reduce(total)
        time.sleep(1.0)


if __name__ == "__main__":
    main()
