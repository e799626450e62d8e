"""Each data-parallel rank's metrics and log records, from inside verl 0.9.1's real workers.

Two gloo ranks, each a process running :mod:`tests.integration.verl_rank`: verl's
``ActorRolloutRefWorker(role="actor")`` and its critic (a value-model ``TrainingWorker``)
on a tiny randomly initialised Qwen2, updated twice through verl's
``RayPPOTrainer._update_critic`` and ``_update_actor``. verl loads rlpulse's plugin as it
loads any (``VERL_USE_EXTERNAL_MODULES``), after the CPU harness
(:mod:`tests.integration.verl_cpu`). A real rlpulse worker joins the ranks.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlpulse.archive.catalog import query_archive
from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers.integrations.verl_workers import reduce_rank
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import LogRecord, StepSummary, TrainerEvent
from rlpulse.schemas.topics import Topics
from tests.integration.topic_reader import read_many_until, read_until
from tests.integration.verl_rank import STEPS

pytestmark = pytest.mark.broker

REPO = Path(__file__).resolve().parents[2]
RANKS = 2
ROLES = ("actor", "critic")
RANK_TIMEOUT_S = 300
# Mean-type metrics: the driver's number is the mean of the ranks' (equal shares).
MEAN_METRICS = {
    "actor": ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_loss"),
    "critic": ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean"),
}
SPREAD = {"actor": "actor/ppo_kl", "critic": "critic/vpred_mean"}


def tiny_qwen2(directory: Path) -> Path:
    """A randomly initialised 2-layer Qwen2 (hidden 32, vocabulary 128), saved locally."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    Qwen2ForCausalLM(config).save_pretrained(directory)
    return directory


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def expected_rank_values(local: list[dict[str, Any]], role: str) -> dict[str, float]:
    """A rank's values of one step from what it handed to verl's all-gather (per mini-batch).

    A verl ``Metric`` is reduced by its own aggregation (sum or mean of its micro-batches),
    a list is kept; then the mini-batches are reduced as the driver's ``reduce_metrics``.
    """
    values: dict[str, list[float]] = {}
    for captured in local:
        for name, value in captured.items():
            if isinstance(value, dict):
                items = value["values"]
                total = sum(items)
                reduced_one = total if value["aggregation"] == "sum" else total / len(items)
                values.setdefault(name, []).append(reduced_one)
            else:
                values.setdefault(name, []).extend(float(v) for v in value)
    reduced = reduce_rank(values)
    prefix = f"{role}/"
    return {name if name.startswith(prefix) else prefix + name: v for name, v in reduced.items()}


def driver_value(value: float | list[float]) -> float:
    """The number verl's driver logs for a mean-type metric (``reduce_metrics``)."""
    return statistics.fmean(value) if isinstance(value, list) else value


def run_ranks(model: Path, tmp_path: Path, run: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the two rank processes to the end; what each one recorded, by rank."""
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps(run))
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "VERL_USE_EXTERNAL_MODULES": (
            "tests.integration.verl_cpu,rlpulse.producers.integrations.verl_plugin"
        ),
        "VERL_PLATFORM": "cpu",  # the harness's platform
        "VERL_ENGINE_DEVICE": "cuda",  # verl registers its FSDP engine for cuda and npu only
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(RANKS),
        "LOCAL_RANK": "0",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    processes = []
    for rank in range(RANKS):
        log = (tmp_path / f"rank{rank}.log").open("w")
        command = [
            sys.executable,
            "-m",
            "tests.integration.verl_rank",
            str(model),
            str(tmp_path / f"rank{rank}.json"),
            str(run_file),
        ]
        processes.append(
            subprocess.Popen(
                command, cwd=REPO, env={**env, "RANK": str(rank)}, stdout=log, stderr=log
            )
        )
    try:
        codes = [process.wait(timeout=RANK_TIMEOUT_S) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    logs = "\n".join((tmp_path / f"rank{r}.log").read_text()[-4000:] for r in range(RANKS))
    assert codes == [0] * RANKS, logs
    return [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(RANKS)]


def archived_records(
    archiver: ArchiverProcess, topics: Topics, run_id: str
) -> list[tuple[int, int, str]]:
    """(rank, pid, message) of the run's text log records in the archive, once both ranks'."""
    sql = "SELECT rank, pid, message FROM logs WHERE run_id = ? AND message LIKE '%finished step%'"
    deadline = time.monotonic() + 90
    while True:
        rows = query_archive(archiver.root, topics, sql, [run_id])[1]
        if {row[0] for row in rows} >= set(range(RANKS)):
            return [(int(r), int(p), str(m)) for r, p, m in rows]
        assert archiver.alive(), archiver.log_text()
        assert time.monotonic() < deadline, f"not archived: {rows}\n{archiver.log_text()}"
        time.sleep(0.5)


def test_each_rank_publishes_its_own_metrics_and_logs(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    model = tiny_qwen2(tmp_path / "qwen2")
    run_id = f"verl-ranks-{uuid.uuid4().hex[:8]}"
    log_dir = tmp_path / "logs"
    settings = {
        "bootstrap": kafka_bootstrap,
        "prefix": topics.prefix,
        "producer": {"spool_dir": str(tmp_path / "spool")},
        "logging": {"log_dir": str(log_dir)},
    }
    worker = WorkerProcess(
        kafka_bootstrap, topics.prefix, tmp_path / "worker.log", partitions=3, grace_s=5.0
    )
    archiver = ArchiverProcess(
        kafka_bootstrap,
        topics.prefix,
        tmp_path / "archive",
        tmp_path / "archiver.log",
        {"archive.roll_s": 0.5},
    )
    worker.start()
    archiver.start()
    try:
        worker.wait_consuming(timeout_s=90.0)
        ranks = run_ranks(model, tmp_path, {"run_id": run_id, "settings": settings})
        codec = default_codec()
        events: list[TrainerEvent] = read_until(
            kafka_bootstrap,
            topics.events,
            codec.decode_event,
            lambda found: len(found) >= len(ROLES) * RANKS * STEPS,
            keep=lambda event: event["run_id"] == run_id and event["kind"] == "metrics",
        )
        summaries: list[StepSummary] = read_until(
            kafka_bootstrap,
            topics.steps,
            codec.decode_summary,
            lambda found: len({(s["stage"], s["step"]) for s in found}) >= len(ROLES) * STEPS,
            keep=lambda summary: summary["run_id"] == run_id,
            timeout_s=90.0,
        )
        records: list[LogRecord] = read_many_until(
            kafka_bootstrap,
            topics.logs,
            codec.decode_logs,
            lambda found: (
                {(r["rank"], r["message"]) for r in found}
                >= {(r, f"rank {r} finished step {s}") for r in range(RANKS) for s in (1, 2)}
            ),
            keep=lambda record: record["run_id"] == run_id,
        )
        archived = archived_records(archiver, topics, run_id)
    finally:
        worker.stop()
        archiver.stop()

    assert all(rank["failures"] == {} for rank in ranks), [rank["failures"] for rank in ranks]
    pids = {rank["rank"]: rank["pid"] for rank in ranks}
    assert len(set(pids.values())) == RANKS

    # One event per role, rank and step, from that rank's process, in the driver's step.
    assert sorted((e["stage"], e["step"], e["rank"]) for e in events) == [
        (f"{role}_dp", step, rank)
        for role in ROLES
        for step in range(1, STEPS + 1)
        for rank in range(RANKS)
    ]
    for event in events:
        role = event["stage"].removesuffix("_dp")
        assert event["world_size"] == RANKS
        assert event["tags"] == {"role": role, "framework": "verl"}
        assert event["pid"] == pids[event["rank"]]
        assert event["hostname"] == socket.gethostname()

    by_key = {(e["stage"], e["step"], e["rank"]): e["metrics"] for e in events}
    for role in ROLES:
        for rank in ranks:
            for step in rank["steps"]:
                published = by_key[(f"{role}_dp", step["step"], rank["rank"])]
                seen = step[role]
                # Every name the rank handed to the all-gather, with the rank's own value.
                for name, value in expected_rank_values(seen["local"], role).items():
                    assert published[name] == pytest.approx(value, rel=1e-6, abs=1e-9), name
                # Names as the driver shows them, and the ones verl never gathers.
                assert set(published) >= {
                    f"{role}/loss",
                    f"{role}/grad_norm",
                    f"{role}/perf/max_memory_allocated_gb",
                    f"{role}/perf/cpu_memory_used_gb",
                    f"perf/mfu/{role}",
                }
                driver_norm = driver_value(seen["driver"][f"{role}/grad_norm"])
                assert published[f"{role}/grad_norm"] == pytest.approx(driver_norm)
        for step in range(1, STEPS + 1):
            values = [by_key[(f"{role}_dp", step, rank)] for rank in range(RANKS)]
            driver = ranks[0]["steps"][step - 1][role]["driver"]
            spread = SPREAD[role]
            assert values[0][spread] != values[1][spread]  # each rank its own
            for name in MEAN_METRICS[role]:
                reduced = driver_value(driver[name])
                assert statistics.fmean(v[name] for v in values) == pytest.approx(reduced, rel=1e-6)

    # The worker joined the two ranks: the spread across ranks, and which rank is where.
    final = {(s["stage"], s["step"]): s for s in summaries}
    assert set(final) >= {(f"{r}_dp", step) for r in ROLES for step in range(1, STEPS + 1)}
    for (stage, step), summary in final.items():
        assert summary["ranks_reported"] == [0, 1]
        assert summary["world_size"] == RANKS
        spread = SPREAD[stage.removesuffix("_dp")]
        stats = summary["metrics"][spread]
        found = [by_key[(stage, step, rank)][spread] for rank in range(RANKS)]
        assert stats["std"] == pytest.approx(statistics.pstdev(found), rel=1e-9)
        assert (stats["min_rank"], stats["max_rank"]) == (
            found.index(min(found)),
            found.index(max(found)),
        )
        assert stats["min_rank"] != stats["max_rank"]

    # verl's logger's records, from both processes, with rank, role, host and pid.
    finished = [r for r in records if "finished step" in r["message"]]
    assert {(r["rank"], r["pid"]) for r in finished} == set(pids.items())
    for record in finished:
        assert record["logger"].endswith("verl/workers/engine_workers.py")
        assert record["level"] == "WARNING"
        assert record["tags"] == {"role": "critic", "framework": "verl"}  # its first update
        assert record["hostname"] == socket.gethostname()
        assert record["stage"] == "critic_dp"
    # ... in the archive (rlpulse query / show read them there) ...
    assert {(rank, pid) for rank, pid, message in archived if "finished step" in message} == set(
        pids.items()
    )
    # ... and in each rank's local file, named after the role.
    assert sorted(path.name for path in log_dir.glob("*.jsonl")) == [
        f"verl_{role}_rank{rank}.jsonl" for role in sorted(ROLES) for rank in range(RANKS)
    ]
