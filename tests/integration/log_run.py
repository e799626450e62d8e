"""One rank of a scripted run that logs records at every level: run as a process.

``python -m tests.integration.log_run --run R --rank N --world-size W --steps A:B ...``
logs, for each step of ``A..B-1``, the metrics of :func:`metrics` (stage ``rollout``) and
the text records of :func:`planned`, through :class:`~rlpulse.producers.EventHandler` on a
logger at DEBUG; and on a second logger, ``chatty``, with a ``SamplingFilter(0.1)``:
:data:`CHATTY_PER_STEP` INFO records per step without a trace id, one per trace of
:func:`chatty_traces` with it, and a WARNING per step. Every message carries its id
(``id=<rank>/<step>/<n>``) so a test can compare exactly what arrived. Rank 0 sends
``run_start`` at step 0 and ``run_end`` at step ``--last-step``. The host name comes from
``RLPULSE_PRODUCER__HOSTNAME``, the local files from ``RLPULSE_LOGGING__LOG_DIR``.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rlpulse.producers import EventHandler, EventLogger, SamplingFilter, Settings
from rlpulse.producers.caller.sampling import keeps_trace

REPO = Path(__file__).resolve().parents[2]
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
RANKS = 4
HOSTS = {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}
"""Where each of the :data:`RANKS` ranks says it runs."""
CHATTY_PER_STEP = 20
TRACES = 8
SPIKE_STEP = 13
"""reward_mean jumps to 6 here: the seed rule unstable-reward fires (once) at this step."""
_ID = re.compile(r"id=(\d+/\d+/\d+)")


def reward(step: int) -> float:
    """0.05 on every fourth step (from 0), 6.0 at the spike, else 1.0; the same on all ranks."""
    if step == SPIKE_STEP:
        return 6.0
    return 0.05 if step % 4 == 0 else 1.0


def metrics(step: int, rank: int) -> dict[str, float]:
    """What rank ``rank`` logs at ``step``."""
    return {"reward_mean": reward(step), "rank_time_s": 1.0 + rank / 10}


def step_trace(step: int) -> str:
    """The trace id the records of every third step carry (on every rank)."""
    return f"trace-step-{step}"


@dataclass(frozen=True)
class Planned:
    """One text record of the plan."""

    id: str
    level: str
    message: str
    trace_id: str | None
    exception: bool


def planned(rank: int, step: int) -> list[Planned]:
    """The text records ``rank`` logs at ``step``: one per level, more on some steps."""
    records = []
    for number, level in enumerate(LEVELS):
        if level == "CRITICAL" and step % 5 != 0:
            continue
        record_id = f"{rank}/{step}/{number}"
        trace = step_trace(step) if step % 3 == 0 else None
        text = f"step {step} {level.lower()} on rank {rank} id={record_id}"
        records.append(Planned(record_id, level, text, trace, level == "ERROR" and step % 2 == 0))
    return records


def chatty_traces() -> list[str]:
    """The trace ids of the chatty logger's traced records (each on every rank, every step).

    Three that sampling at 0.1 keeps and five it drops, so that both cases occur.
    """
    kept = [name for name in _candidates() if keeps_trace(name, 0.1)][:3]
    dropped = [name for name in _candidates() if not keeps_trace(name, 0.1)][: TRACES - 3]
    return kept + dropped


def _candidates() -> list[str]:
    return [f"chatty-trace-{number}" for number in range(200)]


def record_id(message: str) -> str | None:
    """The id a planned message carries."""
    found = _ID.search(message)
    return found[1] if found else None


def start_ranks(
    run_id: str,
    steps: tuple[int, int],
    last_step: int,
    bootstrap: str,
    prefix: str,
    work: Path,
    trace_context: str | None = None,
) -> list[subprocess.Popen[bytes]]:
    """Start one process per rank logging ``steps`` (A, B: A..B-1) of the plan.

    Write-ahead logs go under ``work/spool``, the local files to ``work/logs``; with
    ``trace_context`` set the ranks inherit it from the environment, as from a launcher.
    """
    processes = []
    for rank in range(RANKS):
        env = {
            **os.environ,
            "RLPULSE_PRODUCER__HOSTNAME": HOSTS[rank],
            "RLPULSE_PRODUCER__SPOOL_DIR": str(work / "spool"),
            "RLPULSE_LOGGING__LEVEL": "DEBUG",
            "RLPULSE_LOGGING__LOG_DIR": str(work / "logs"),
        }
        env.pop("RLPULSE_TRACE_CONTEXT", None)
        if trace_context is not None:
            env["RLPULSE_TRACE_CONTEXT"] = trace_context
        command = [
            sys.executable, "-m", "tests.integration.log_run",
            "--run", run_id, "--rank", str(rank), "--world-size", str(RANKS),
            "--steps", f"{steps[0]}:{steps[1]}", "--last-step", str(last_step),
            "--bootstrap", bootstrap, "--prefix", prefix,
        ]  # fmt: skip
        processes.append(subprocess.Popen(command, cwd=REPO, env=env))
    return processes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--steps", required=True, help="A:B, the steps A..B-1")
    parser.add_argument("--last-step", type=int, required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--prefix", required=True)
    args = parser.parse_args()
    first, end = (int(part) for part in args.steps.split(":"))
    settings = Settings(bootstrap=args.bootstrap, prefix=args.prefix)
    events = EventLogger(args.run, rank=args.rank, world_size=args.world_size, settings=settings)
    handler = EventHandler(events, stage="rollout")
    trainer = logging.getLogger("trainer")
    chatty = logging.getLogger("trainer.chatty")
    trainer.setLevel(logging.DEBUG)
    trainer.propagate = False
    trainer.addHandler(handler)
    chatty.addFilter(SamplingFilter(0.1, seed=args.rank * 1000 + first))
    if args.rank == 0 and first == 0:
        events.run_start(0)
    for step in range(first, end):
        events.log(metrics(step, args.rank), step, "rollout")
        for record in planned(args.rank, step):
            level = logging.getLevelName(record.level)
            extra = {"trace_id": record.trace_id} if record.trace_id else {}
            if record.exception:
                try:
                    raise MemoryError(f"CUDA out of memory on rank {args.rank}")
                except MemoryError:
                    trainer.log(level, record.message, exc_info=True, extra=extra)
            else:
                trainer.log(level, record.message, extra=extra)
        for number in range(CHATTY_PER_STEP):
            chatty.info(
                "chatty %d at step %d id=%d/%d/%d", number, step, args.rank, step, 100 + number
            )
        for number, trace in enumerate(chatty_traces()):
            chatty.info(
                "traced %s id=%d/%d/%d", trace, args.rank, step, 200 + number,
                extra={"trace_id": trace},
            )  # fmt: skip
        chatty.warning("chatty warning id=%d/%d/%d", args.rank, step, 300)
    if args.rank == 0 and end > args.last_step:
        events.run_end(args.last_step)
    left = events.close(timeout_s=30)
    sys.exit(1 if left else 0)


if __name__ == "__main__":
    main()
