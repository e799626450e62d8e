"""TRL: a real ``GRPOTrainer`` / ``RLOOTrainer`` on 2 gloo ranks (CPU) with ``RlpulseCallback``.

Three optimizer steps of a tiny random Qwen2 (:mod:`tests.integration.hf_scripts.trl_per_rank`).
Each rank publishes, per step, the values it computed before TRL reduced them (stage
``trl_rank``): the reward and completion lengths equal what that rank's reward function
saw, and the per-rank ``kl`` and ``loss`` combine into the reduced values rank 0 logged
(stage ``trainer``) the way TRL combines them. The log records of every rank (transformers'
from each rank, TRL's from rank 0, the only one TRL logs on) reach the logs topic with the
rank, pid, host and step. trl comes from the ``integrations`` extra.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from rlpulse.archive.catalog import query_archive
from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import LogRecord, TrainerEvent
from rlpulse.schemas.topics import Topics
from tests.integration.topic_reader import read_many_until, read_until
from tests.waiting import wait_for

pytestmark = pytest.mark.broker

SCRIPT = Path(__file__).parent / "hf_scripts" / "trl_per_rank.py"
RANKS = 2
STEPS = 3
RUN_TIMEOUT_S = 240
AFTER_TRAINING = "a warning after train(), when the link is closed"


def train(trainer: str, bootstrap: str, topics: Topics, run_id: str, output: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(RANKS),
        str(SCRIPT),
        *("--bootstrap", bootstrap, "--prefix", topics.prefix, "--run-id", run_id),
        *("--output-dir", str(output), "--trainer", trainer, "--max-steps", str(STEPS)),
        *("--after-training", AFTER_TRAINING),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]


def reward_calls(output: Path, rank: int) -> list[dict[str, Any]]:
    lines = (output / f"rewards-rank{rank}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.parametrize("trainer", ["grpo", "rloo"])
def test_each_rank_publishes_its_own_trl_metrics_and_logs(
    trainer: str, kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    run_id = f"trl-{trainer}-{uuid.uuid4().hex[:8]}"
    train(trainer, kafka_bootstrap, topics, run_id, tmp_path)
    archive = tmp_path / "archive"
    archiver = ArchiverProcess(
        kafka_bootstrap, topics.prefix, archive, tmp_path / "archiver.log",
        {"archive.roll_s": 1, "archive.audit": "false"},
    ).start()  # fmt: skip
    try:
        wait_for(
            lambda: _archived_samples(archive, topics, run_id) == RANKS * STEPS * 4,
            "every rank's samples in the archive",
            timeout_s=120.0,
            every_s=0.5,
        )
    finally:
        archiver.stop()
    audit = subprocess.run(
        [sys.executable, "-m", "rlpulse", "audit", "--run", run_id, "--archive", str(archive),
         "--prefix", topics.prefix],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert " 0 lost, 0 duplicates" in " ".join(audit.stdout.split()), audit.stdout
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(RANKS)]
    assert all(report["hooked"] for report in reports)
    assert [report["handlers_left"] for report in reports] == [[]] * RANKS
    pids = {report["rank"]: report["pid"] for report in reports}

    codec = default_codec()
    events = read_until(
        kafka_bootstrap,
        topics.events,
        codec.decode_event,
        lambda found: any(e["kind"] == "run_end" for e in found),
        keep=lambda event: event["run_id"] == run_id,
    )
    own: dict[tuple[int, int], TrainerEvent] = {}
    for event in events:
        if event["stage"] == "trl_rank":
            assert (event["rank"], event["step"]) not in own, event
            own[(event["rank"], event["step"])] = event
    assert sorted(own) == [(r, s) for r in range(RANKS) for s in range(1, STEPS + 1)]
    assert {e["world_size"] for e in own.values()} == {RANKS}
    assert all(e["tags"] == {"framework": "trl"} for e in own.values())
    reduced = {
        e["step"]: e["metrics"]
        for e in events
        if e["stage"] == "trainer" and e["kind"] == "metrics" and "reward" in e["metrics"]
    }
    assert sorted(reduced) == list(range(1, STEPS + 1))

    # One reward call per rank per step: what the rank computed, recorded by the test's own
    # reward function, is what the rank published.
    calls = {r: {call["step"]: call for call in reward_calls(tmp_path, r)} for r in range(RANKS)}
    for step in range(1, STEPS + 1):
        for rank in range(RANKS):
            call, metrics = calls[rank][step], own[(rank, step)]["metrics"]
            assert call["pid"] == pids[rank]
            scored = [value for value in call["rewards"] if value is not None]
            assert metrics["reward"] == pytest.approx(mean(scored), rel=1e-6)
            assert metrics["rewards/reward/mean"] == pytest.approx(mean(scored), rel=1e-6)
            lengths = call["lengths"]
            assert metrics["completions/mean_length"] == pytest.approx(mean(lengths))
            assert metrics["completions/min_length"] == min(lengths)
            assert metrics["completions/max_length"] == max(lengths)
            assert math.isfinite(metrics["kl"]) and math.isfinite(metrics["loss"])
            # the seed's names beside TRL's, in this rank's stage (canonical.TRL_NAMES)
            assert (metrics["reward_mean"], metrics["kl_divergence"]) == (
                metrics["reward"],
                metrics["kl"],
            )
            assert math.isfinite(metrics["entropy"])
        rewards = [own[(rank, step)]["metrics"]["reward"] for rank in range(RANKS)]
        assert len(set(rewards)) == RANKS, rewards

        # The reduced values rank 0 logged are TRL's combinations of the per-rank ones:
        # the reward a mean over every scored completion (as many per rank), loss the mean
        # of the ranks' losses, kl and entropy token-weighted means (the completion tokens).
        ranks = [own[(rank, step)]["metrics"] for rank in range(RANKS)]
        tokens = [sum(calls[rank][step]["lengths"]) for rank in range(RANKS)]
        logged = reduced[step]
        assert logged["reward"] == pytest.approx(mean([m["reward"] for m in ranks]), rel=1e-6)
        assert logged["loss"] == pytest.approx(mean([m["loss"] for m in ranks]), abs=1e-6)
        for name in ("kl", "entropy"):
            weighted = sum(m[name] * t for m, t in zip(ranks, tokens, strict=True)) / sum(tokens)
            assert logged[name] == pytest.approx(weighted, rel=1e-5, abs=1e-9), name
    last = [own[(rank, STEPS)]["metrics"] for rank in range(RANKS)]
    assert last[0]["kl"] != last[1]["kl"]

    # Each rank's rollout samples: its reward function's values and completion lengths, one
    # sample a completion, its advantage, the step's statistics as an event of stage samples.
    samples = read_many_until(
        kafka_bootstrap,
        topics.samples,
        codec.decode_samples,
        lambda found: len(found) >= RANKS * STEPS * 4,
        keep=lambda sample: sample["run_id"] == run_id,
    )
    for step in range(1, STEPS + 1):
        for rank in range(RANKS):
            ranks_samples = sorted(
                (s for s in samples if (s["rank"], s["step"]) == (rank, step)),
                key=lambda s: s["sample_index"],
            )
            call = calls[rank][step]
            assert [s["response_length"] for s in ranks_samples] == call["lengths"]
            wanted = [math.nan if value is None else value for value in call["rewards"]]
            assert [s["reward"] for s in ranks_samples] == pytest.approx(wanted, nan_ok=True)
            assert [s["scores"]["reward"] for s in ranks_samples] == pytest.approx(
                wanted, nan_ok=True
            )
            assert all(s["advantage"] is not None and s["split"] == "train" for s in ranks_samples)
            # 4 completions of one prompt a rank: one group, the prompt's data source
            assert len({s["group"] for s in ranks_samples}) == 1
            assert len({s["data_source"] for s in ranks_samples} & {"arith", "words"}) == 1
    statistics = [e for e in events if e["stage"] == "samples"]
    assert sorted((e["rank"], e["step"]) for e in statistics) == sorted(own)
    assert all(e["metrics"]["samples/count"] == 4 for e in statistics)
    texts = read_many_until(
        kafka_bootstrap,
        topics.sample_texts,
        codec.decode_sample_texts,
        lambda found: {(t["rank"], t["step"]) for t in found} >= set(own),
        keep=lambda text: text["run_id"] == run_id,
    )
    assert all(t["response_head"] or t["response_chars"] == 0 for t in texts)
    assert {t["prompt"] is not None for t in texts} == {True, False}  # once per group

    records = read_many_until(
        kafka_bootstrap,
        topics.logs,
        codec.decode_logs,
        lambda found: all(_logged_all(found, rank) for rank in range(RANKS)),
        keep=lambda record: record["run_id"] == run_id,
    )
    host = socket.gethostname()
    for rank in range(RANKS):
        mine = [r for r in records if r["rank"] == rank]
        assert {r["pid"] for r in mine} == {pids[rank]}
        assert {r["hostname"] for r in mine} == {host}
        # TRL logs through accelerate's adapter, which keeps only the main process's records.
        unscored = [r for r in mine if _unscored(r)]
        expected = STEPS if rank == 0 else 0
        assert [r["logger"] for r in unscored] == [f"trl.trainer.{trainer}_trainer"] * expected
        assert [r["level"] for r in unscored] == ["WARNING"] * expected
        assert [r["step"] for r in unscored] == list(range(1, expected + 1))
        assert not [r for r in mine if AFTER_TRAINING in r["message"]]
        (completed,) = [r for r in mine if _completed(r)]
        assert (completed["logger"], completed["level"]) == ("transformers.trainer", "INFO")
        assert completed["step"] == STEPS


def _unscored(record: LogRecord) -> bool:
    return "All reward functions returned None" in record["message"]


def _completed(record: LogRecord) -> bool:
    return "Training completed" in record["message"]


def _logged_all(records: list[LogRecord], rank: int) -> bool:
    """Transformers' end-of-training line from ``rank``; on rank 0 TRL's warning of every step."""
    mine = [r for r in records if r["rank"] == rank]
    unscored = STEPS if rank == 0 else 0
    return sum(map(_unscored, mine)) >= unscored and any(map(_completed, mine))


def _archived_samples(root: Path, topics: Topics, run_id: str) -> int:
    if not root.exists():
        return -1
    _, rows = query_archive(
        str(root), topics, "SELECT count(*) FROM samples WHERE run_id = ?", [run_id]
    )
    return int(rows[0][0])
