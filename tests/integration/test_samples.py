"""Rollout samples from a hand-written loop to their topics: numbers, chosen texts, statistics.

``RunLink.log_samples`` on a real broker through the host's agent: every sample's numbers
arrive once on ``<prefix>.samples``, the chosen samples' texts on ``<prefix>.sample-texts``,
and the step's statistics as an event of stage ``samples``.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from rlpulse.archive.catalog import query_archive
from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers import RunLink
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.settings import ProducerSettings
from tests.integration.scripted_run import consume_all
from tests.kafka import settings_at
from tests.waiting import wait_for

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]


def a_step(count: int, step: int) -> list[dict[str, object]]:
    samples: list[dict[str, object]] = []
    for index in range(count):
        samples.append(
            {
                "prompt": f"question {index // 4}",
                "response": "answer " * (index % 7) + f"#{index}",
                "reward": (index % 10) / 10,
                "group": f"q{index // 4}",
                "data_source": "math" if index % 3 else "code",
                "scores": {"acc": float(index % 2), "format": 1.0},
                "truncated": index % 11 == 0,
            }
        )
    return samples


def test_a_step_s_samples_arrive_once_with_their_chosen_texts_and_statistics(
    kafka_bootstrap: str, topics: Topics
) -> None:
    link = RunLink("sampled", settings=settings_at(kafka_bootstrap, topics))
    link.log({"loss": 1.0}, 3)
    link.log_samples(a_step(1024, 3), step=3)
    assert link.close(60) == 0
    codec = default_codec()
    wanted = 1024

    def all_samples(values: list[bytes]) -> bool:
        return sum(len(codec.decode_samples(v)) for v in values) >= wanted

    raw = consume_all(kafka_bootstrap, topics.samples, all_samples, 60.0)
    samples = [s for value in raw for s in codec.decode_samples(value)]
    assert sorted(s["sample_index"] for s in samples) == list(range(wanted))
    assert {s["step"] for s in samples} == {3}
    by_index = {s["sample_index"]: s for s in samples}
    assert by_index[17]["reward"] == 0.7 and by_index[17]["group"] == "q4"
    assert by_index[17]["scores"] == {"acc": 1.0, "format": 1.0}
    assert by_index[11]["truncated"] and not by_index[12]["truncated"]
    texts = [
        t
        for value in consume_all(kafka_bootstrap, topics.sample_texts, lambda v: len(v) > 0, 30.0)
        for t in codec.decode_sample_texts(value)
    ]
    reasons = {reason for t in texts for reason in t["chosen"]}
    assert {"best", "worst", "truncated", "group"} <= reasons, reasons
    assert all(t["response_head"] for t in texts)
    events = [
        codec.decode_event(v)
        for v in consume_all(kafka_bootstrap, topics.events, lambda v: len(v) >= 3, 30.0)
    ]
    (stats,) = [e for e in events if e["stage"] == "samples"]
    assert stats["step"] == 3 and stats["metrics"]["samples/count"] == 1024.0
    assert stats["metrics"]["samples/truncated_ratio"] == pytest.approx(94 / 1024)


OLDER_RELEASE = "2f3a149e46dce2e4ce5598e30fb8d66f3bc274fb"
"""The last commit of main before rollout samples: its agent knows protocol 3 only."""


def older_release(tmp_path: Path) -> Path:
    """The package of :data:`OLDER_RELEASE`, unpacked from this repository's history."""
    target = tmp_path / "older"
    target.mkdir()
    archive = subprocess.run(
        ["git", "archive", OLDER_RELEASE, "rlpulse"], cwd=ROOT, capture_output=True, check=True
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as unpacked:
        unpacked.extractall(target, filter="data")
    return target


def test_an_older_agent_on_the_host_still_sends_events_and_logs_and_leaves_samples_for_a_newer(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """During an upgrade a host may still run the agent of the release before samples."""
    spool = tmp_path / "spool"
    older = older_release(tmp_path)
    agent_log = (tmp_path / "older-agent.log").open("w")
    old_agent = subprocess.Popen(
        [sys.executable, "-m", "rlpulse", "agent", "--bootstrap", kafka_bootstrap, "--prefix",
         topics.prefix, "--spool-dir", str(spool), "--idle-exit-s", "0"],
        env={**os.environ, "PYTHONPATH": str(older)}, cwd=older, stdout=agent_log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for(
            lambda: "protocol 3" in (tmp_path / "older-agent.log").read_text(),
            "the older agent to serve the spool",
            timeout_s=60.0,
        )
        settings = settings_at(kafka_bootstrap, topics, producer=ProducerSettings(spool_dir=spool))
        link = RunLink("upgrading", settings=settings)
        for step in range(5):
            link.log({"loss": 1.0 / (step + 1)}, step)
            link.log_record("INFO", 20, "trainer", f"step {step}", step=step)
            link.log_samples(a_step(64, step), step=step)
        codec = default_codec()
        events = consume_all(kafka_bootstrap, topics.events, lambda values: len(values) >= 10, 60.0)
        stages = sorted(codec.decode_event(value)["stage"] for value in events)
        assert stages == ["samples"] * 5 + ["trainer"] * 5  # the step's statistics are events
        logs = consume_all(
            kafka_bootstrap,
            topics.logs,
            lambda values: sum(len(codec.decode_logs(v)) for v in values) >= 5,
            60.0,
        )
        assert sum(len(codec.decode_logs(value)) for value in logs) == 5
        assert consume_all(kafka_bootstrap, topics.samples, lambda values: False, 3.0) == []
        assert "newer than this agent's 3" in (tmp_path / "older-agent.log").read_text()
    finally:
        old_agent.terminate()
        old_agent.wait(30)
        agent_log.close()
    # The rank's own watch starts this release's agent once the older one is gone.
    samples = consume_all(
        kafka_bootstrap,
        topics.samples,
        lambda values: sum(len(codec.decode_samples(v)) for v in values) >= 5 * 64,
        120.0,
    )
    assert sorted(
        (s["step"], s["sample_index"]) for value in samples for s in codec.decode_samples(value)
    ) == [(step, index) for step in range(5) for index in range(64)]
    assert link.close(60) == 0


def test_the_archive_holds_every_sample_once_and_answers_the_seed_s_question(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """The share of samples with reward < 0.1 in the last hour, from what was logged and by SQL."""
    root = tmp_path / "archive"
    link = RunLink("archived", settings=settings_at(kafka_bootstrap, topics))
    logged: list[float] = []
    for step in range(3):
        samples = a_step(512 + step, step)
        logged += [float(s["reward"]) for s in samples]  # type: ignore[arg-type]
        link.log({"loss": 1.0}, step)
        link.log_samples(samples, step=step)
    link.run_end(2)
    assert link.close(60) == 0
    archiver = ArchiverProcess(
        kafka_bootstrap, topics.prefix, root, tmp_path / "archiver.log", {"archive.roll_s": 1}
    ).start()
    try:
        wait_for(
            lambda: _count(root, topics, "SELECT count(*) FROM samples") == len(logged),
            "every sample in the archive",
            timeout_s=120.0,
            every_s=0.5,
        )
        wait_for(
            lambda: (
                _count(root, topics, "SELECT count(*) FROM audits WHERE run_id = 'archived'") > 0
            ),
            "the run's audit",
            timeout_s=120.0,
            every_s=0.5,
        )
    finally:
        archiver.stop()
    wanted = sum(reward < 0.1 for reward in logged) / len(logged)
    question = (
        "SELECT count(*) FILTER (WHERE reward < 0.1) / count(*) FROM samples "
        "WHERE run_id = 'archived' AND time > now() - INTERVAL 1 HOUR"
    )
    done = subprocess.run(
        [sys.executable, "-m", "rlpulse", "query", question, "--archive", str(root), "--prefix",
         topics.prefix, "--format", "csv"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.strip().splitlines()[-1]) == pytest.approx(wanted, rel=1e-5)
    assert _count(root, topics, "SELECT count(DISTINCT (step, sample_index)) FROM samples") == len(
        logged
    )
    assert _count(root, topics, "SELECT count(*) FROM sample_texts") > 0
    audit = subprocess.run(
        [sys.executable, "-m", "rlpulse", "audit", "--run", "archived", "--archive", str(root),
         "--prefix", topics.prefix],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert " 0 lost, 0 duplicates" in " ".join(audit.stdout.split()), audit.stdout


def _count(root: Path, topics: Topics, sql: str) -> int:
    if not root.exists():
        return -1
    _, rows = query_archive(str(root), topics, sql)
    return int(rows[0][0])


TRUNCATION_RULE = """version: 1
rules:
  - id: truncated-responses
    metric: samples/truncated_ratio
    when: "> 0.3"
    for_steps: 3
    once: true
    actions: [{alert: {message: "samples cut at the limit"}}]
"""


def test_a_rule_on_a_sample_statistic_fires_live_and_in_the_backtest_alike(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(TRUNCATION_RULE)
    logs = tmp_path / "logs"
    worker = WorkerProcess(
        kafka_bootstrap,
        topics.prefix,
        tmp_path / "worker.log",
        rules=str(rules),
        partitions=3,  # the topics fixture's
        grace_s=2.0,
    )
    codec = default_codec()
    with worker:
        worker.wait_consuming(timeout_s=90)
        settings = settings_at(kafka_bootstrap, topics, logging={"log_dir": logs})
        link = RunLink("cut-short", settings=settings)
        for step in range(6):
            samples = a_step(64, step)
            for index, sample in enumerate(samples):  # from step 2 on, half are cut
                sample["truncated"] = step >= 2 and index % 2 == 0
            link.log({"loss": 1.0}, step)
            link.log_samples(samples, step=step)
        assert link.close(60) == 0
        live = [
            codec.decode_command(value)
            for value in consume_all(kafka_bootstrap, topics.control, lambda v: len(v) >= 1, 60.0)
        ]
    (command,) = [c for c in live if c["run_id"] == "cut-short"]
    assert (command["rule_id"], command["stage"], command["step"]) == (
        "truncated-responses", "samples", 4
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "rlpulse", "rules", "backtest", "--rules", str(rules), "--events",
         str(logs), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (replayed,) = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert (replayed["command_id"], replayed["reason"]) == (
        command["command_id"],
        command["reason"],
    )


def test_bad_samples_are_left_out_and_a_huge_step_goes_through_whole(
    kafka_bootstrap: str, topics: Topics
) -> None:
    """A sample without response, a reward that is a string, a 10 MB response, 16,384 at once."""
    link = RunLink("bad-input", settings=settings_at(kafka_bootstrap, topics))
    huge = a_step(16_384, 1)
    huge[5] = {"prompt": "p", "reward": 1.0}  # no response
    huge[6] = {**huge[6], "reward": "high"}
    huge[7] = {**huge[7], "response": "x" * 10_000_000, "reward": 99.0}  # the best: its text goes
    link.log_samples(huge, step=1)
    assert link.events.samples.refused == {"response": 1, "reward": 1}
    assert link.close(120) == 0
    codec = default_codec()
    raw = consume_all(
        kafka_bootstrap,
        topics.samples,
        lambda values: sum(len(codec.decode_samples(v)) for v in values) >= 16_382,
        120.0,
    )
    assert all(len(value) < 1_000_000 for value in raw)  # split under the broker's limit
    samples = [s for value in raw for s in codec.decode_samples(value)]
    assert len(samples) == 16_382 and len({s["sample_index"] for s in samples}) == 16_382
    assert max(s["response_length"] for s in samples) == 10_000_000
    texts = [
        t
        for value in consume_all(kafka_bootstrap, topics.sample_texts, lambda v: len(v) > 0, 30.0)
        for t in codec.decode_sample_texts(value)
    ]
    (cut,) = [t for t in texts if t["response_chars"] == 10_000_000]
    assert len(cut["response_head"]) + len(cut["response_tail"]) == 4000  # a recorded cut
    assert "best" in cut["chosen"]
