"""Every run ends with one ``run_end`` from rank 0, and the archiver audits every run.

Real broker, real worker (seed rules) and archiver processes, real trainers in child
processes: a torchrun loop on :class:`~rlpulse.producers.RunLink` that kl-guard stops, a
``transformers.Trainer`` that runs to its last step, a verl run (verl's ``Tracking`` in the
stand-in trainer's loop) whose ``fit()`` returned, and a torchrun loop SIGKILLed mid-run,
which the archiver audits once it has been silent for ``archive.audit_silent_after_s``.
The verl backend's one ``run_end`` from verl's own trainers is checked in
``test_verl_trainer.py``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from confluent_kafka import Consumer, TopicPartition

from rlpulse.archive.catalog import query_archive
from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.producers import EXIT_STOPPED_BY_RULE
from rlpulse.schemas import default_codec
from rlpulse.schemas.records import TrainerEvent
from rlpulse.schemas.topics import Topics
from tests.integration.test_pipeline import start_worker
from tests.integration.topic_reader import read_until

pytestmark = pytest.mark.broker

T = TypeVar("T")
HERE = Path(__file__).parent
LOOP = HERE / "link_scripts" / "train_loop.py"
HF_SCRIPT = HERE / "hf_scripts" / "train_until_stopped.py"
RUN_TIMEOUT_S = 240.0
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def torchrun(processes: int, script: Path, *args: str) -> list[str]:
    return [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *("--nproc_per_node", str(processes), str(script), *args),
    ]


def loop_args(bootstrap: str, topics: Topics, run_id: str, *more: str) -> list[str]:
    return ["--bootstrap", bootstrap, "--prefix", topics.prefix, "--run-id", run_id, *more]


def start(command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the launcher and its ranks are one process group
    )


def kill_group(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextmanager
def archiver_at(
    bootstrap: str, topics: Topics, tmp_path: Path, **settings: object
) -> Iterator[ArchiverProcess]:
    archiver = ArchiverProcess(
        bootstrap,
        topics.prefix,
        tmp_path / "archive",
        tmp_path / "archiver.log",
        {"archive.roll_s": 0.5, "archive.audit_delay_s": 1, **settings},
    )
    with archiver:
        yield archiver


def everything(
    bootstrap: str, topic: str, decode: Callable[[bytes], T], keep: Callable[[T], bool]
) -> list[T]:
    """Every record on ``topic`` now (up to each partition's end offset) that ``keep`` keeps."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}"})
    try:
        partitions = consumer.list_topics(topic=topic, timeout=30).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p))[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[T] = []
        position = dict.fromkeys(partitions, 0)
        deadline = time.monotonic() + 60
        while any(position[p] < ends[p] for p in partitions):
            assert time.monotonic() < deadline, f"{topic}: not read to its end offsets {ends}"
            for msg in consumer.consume(500, timeout=0.2):
                assert msg.error() is None, msg.error()
                partition, offset = msg.partition(), msg.offset()
                assert partition is not None and offset is not None
                position[partition] = offset + 1
                record = decode(msg.value() or b"")
                if keep(record):
                    records.append(record)
        return records
    finally:
        consumer.close()


def run_ends(bootstrap: str, topics: Topics, run_id: str) -> list[tuple[int, int, str | None]]:
    """(attempt, rank, message) of every ``run_end`` of ``run_id`` on the events topic."""
    events: list[TrainerEvent] = everything(
        bootstrap,
        topics.events,
        default_codec().decode_event,
        lambda e: e["run_id"] == run_id and e["kind"] == "run_end",
    )
    return [(e["attempt"], e["rank"], e["message"]) for e in events]


def audits_of(
    archiver: ArchiverProcess, topics: Topics, run_id: str, want: int = 1
) -> list[dict[str, Any]]:
    """The archiver's audit reports of ``run_id`` (from the archive), once ``want`` are in."""
    sql = (
        "SELECT ok, producers, received, lost, duplicates, summary FROM audits "
        "WHERE run_id = ? ORDER BY audited_ns"
    )
    columns = ("ok", "producers", "received", "lost", "duplicates", "summary")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        rows = query_archive(archiver.root, topics, sql, [run_id])[1]
        if len(rows) >= want:
            return [dict(zip(columns, row, strict=True)) for row in rows]
        assert archiver.alive(), archiver.log_text()
        assert time.monotonic() < deadline, f"no audit of {run_id}:\n{archiver.log_text()}"
        time.sleep(0.5)


def wait_for_step(bootstrap: str, topics: Topics, run_id: str, step: int, ranks: int) -> None:
    """Until every one of ``ranks`` ranks has an event of ``step`` or later on the topic."""
    read_until(
        bootstrap,
        topics.events,
        default_codec().decode_event,
        lambda found: len({e["rank"] for e in found if e["step"] >= step}) == ranks,
        keep=lambda e: e["run_id"] == run_id and e["kind"] == "metrics",
        timeout_s=RUN_TIMEOUT_S,
    )


@pytest.mark.slow
def test_a_rule_stopped_torchrun_loop_ends_once_from_rank_0_and_is_audited(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    run_id = f"loop-{uuid.uuid4().hex[:8]}"
    worker = start_worker(kafka_bootstrap, topics, tmp_path / "worker.log")
    try:
        with archiver_at(kafka_bootstrap, topics, tmp_path) as archiver:
            trainer = start(
                torchrun(2, LOOP, *loop_args(kafka_bootstrap, topics, run_id, "--kl-from", "5"))
            )
            try:
                log, _ = trainer.communicate(timeout=RUN_TIMEOUT_S)
            finally:
                kill_group(trainer)
            assert trainer.returncode == EXIT_STOPPED_BY_RULE, log[-5000:]
            (audit,) = audits_of(archiver, topics, run_id)
    finally:
        worker.stop()
    commands = query_archive(
        archiver.root, topics, "SELECT command_id, rule_id FROM commands WHERE run_id = ?", [run_id]
    )[1]
    assert [rule for _, rule in commands] == ["kl-guard"]
    ((command_id, _),) = commands
    assert run_ends(kafka_bootstrap, topics, run_id) == [
        (0, 0, f"stopped by command {command_id} (kl-guard)")
    ]
    assert (audit["ok"], audit["producers"], audit["lost"]) == (True, 2, 0), audit
    assert "0 lost" in audit["summary"] and "no run_end" not in audit["summary"]


def test_a_trainer_run_to_its_last_step_ends_once_and_is_audited(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    run_id = f"hf-end-{uuid.uuid4().hex[:8]}"
    output = tmp_path / "out"
    command = [
        *(sys.executable, str(HF_SCRIPT), "--bootstrap", kafka_bootstrap),
        *("--prefix", topics.prefix, "--run-id", run_id),
        *("--output-dir", str(output), "--max-steps", "6"),
    ]
    with archiver_at(kafka_bootstrap, topics, tmp_path) as archiver:
        result = subprocess.run(
            command, env=ENV, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
        )
        assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
        (audit,) = audits_of(archiver, topics, run_id)
    assert run_ends(kafka_bootstrap, topics, run_id) == [(0, 0, "training finished")]
    assert (audit["ok"], audit["producers"], audit["lost"]) == (True, 1, 0), audit
    assert "no run_end" not in audit["summary"]


@pytest.mark.slow
def test_a_killed_run_is_audited_after_its_silence_and_again_when_resumed(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    run_id = f"killed-{uuid.uuid4().hex[:8]}"
    silent_s = 4
    with archiver_at(
        kafka_bootstrap, topics, tmp_path, **{"archive.audit_silent_after_s": silent_s}
    ) as archiver:
        pids = tmp_path / "pids"
        pids.mkdir()
        args = loop_args(kafka_bootstrap, topics, run_id, "--pid-dir", str(pids))
        trainer = start(torchrun(2, LOOP, *args))
        try:
            # Both ranks' events on the topic first: a SIGKILL loses what librdkafka held.
            wait_for_step(kafka_bootstrap, topics, run_id, 5, ranks=2)
            for rank in (0, 1):
                os.kill(int((pids / f"rank{rank}.pid").read_text()), signal.SIGKILL)
            log, _ = trainer.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            kill_group(trainer)
        assert trainer.returncode != 0, log[-5000:]  # torchrun: its ranks died
        (silent,) = audits_of(archiver, topics, run_id)
        assert run_ends(kafka_bootstrap, topics, run_id) == []
        assert silent["producers"] == 2 and silent["received"] >= 2 * 5, silent
        # How long the archiver had heard nothing of the run when it audited it (its own clock,
        # from the last event it read): the setting at least.
        quiet = re.search(r"The run sent no run_end: audited after (\d+) s", silent["summary"])
        assert quiet is not None and int(quiet[1]) >= silent_s, silent
        assert f"audit: run {run_id}:" in archiver.log_text()
        print(silent["summary"])

        # The run resumes (attempt 1) and ends: audited again, a run that ended this time.
        more = ("--attempt", "1", "--steps", "3")
        resumed = subprocess.run(
            [sys.executable, str(LOOP), *loop_args(kafka_bootstrap, topics, run_id, *more)],
            env=ENV,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-5000:]
        first, again = audits_of(archiver, topics, run_id, want=2)
    assert first == silent
    assert run_ends(kafka_bootstrap, topics, run_id) == [(1, 0, "closed")]
    assert again["producers"] == 3 and "no run_end" not in again["summary"], again


def test_a_verl_run_whose_fit_returned_ends_once_and_is_audited(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    from rlpulse.producers.integrations import verl as integration
    from tests.integration.test_verl import StandInTrainer, rlpulse_block, verl_config

    integration.install()
    run_id = f"verl-end-{uuid.uuid4().hex[:8]}"
    with archiver_at(kafka_bootstrap, topics, tmp_path) as archiver:
        trainer = StandInTrainer(verl_config(str(tmp_path / "ckpt")), total_training_steps=5)
        trainer.fit("rlpulse-tests", "exp", rlpulse_block(run_id, kafka_bootstrap, topics))
        trainer.logger.finish()  # a second finish (verl's fit and its caller both may) adds none
        (audit,) = audits_of(archiver, topics, run_id)
    assert run_ends(kafka_bootstrap, topics, run_id) == [(0, 0, "training finished")]
    assert (audit["ok"], audit["producers"], audit["lost"]) == (True, 1, 0), audit
    assert "no run_end" not in audit["summary"]
