"""Stacks from outside: a real gloo job of 4 processes whose rank 2 hangs; the silence rule
fires, the host agent signals each rank process and ships every rank's stacks.

The ranks are real processes with real ``EventLogger`` s (so the host's agent starts by
itself) and a real ``torch.distributed`` collective: at step 4 rank 2 waits forever in a
Python function while ranks 0, 1 and 3 wait for it inside gloo's ``all_reduce``. A real
worker runs a silence rule (6 s) whose actions are an alert and ``capture_stacks``, a real
archiver writes what arrives. Then: every rank's stacks are on the logs topic and in the
archive, grouped with rank 2's group first; ``rlpulse control stacks`` takes them again by
hand (and says in one line that no agent answers for an unknown run); the run page, in
Chromium, shows the run silent and the groups.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright

from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.local.broker import tail
from rlpulse.local.child_process import free_port
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.schemas import default_codec
from rlpulse.schemas.records import LogBatch
from rlpulse.schemas.stacks import LOOP_MARK, STACKS_LOGGER, parse_dump
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.ui.data import run_data
from rlpulse.ui.server import UiServer
from tests.kafka import read_all, read_to_end, settings_at
from tests.waiting import wait_for

pytestmark = [pytest.mark.broker, pytest.mark.browser]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

CODEC = default_codec()
HUNG_RANK = Path(__file__).with_name("hung_rank.py")
HANG_LINE = next(  # where hung_rank.py's rank 2 waits forever
    number
    for number, line in enumerate(HUNG_RANK.read_text().splitlines(), start=1)
    if "threading.Event().wait()" in line
)
WORLD = 4
RULES = """
version: 1
rules:
  - id: run-silent
    silent: {factor: 3, floor_s: 6}
    actions: [{alert: {message: the run hangs}}, {capture_stacks: {wait_s: 5}}]
"""


def start_ranks(
    bootstrap: str, prefix: str, spool: Path, run_id: str, mode: str = "hang"
) -> list[subprocess.Popen[str]]:
    port = free_port()
    ports = [str(port), str(free_port(avoid=(port,)))]
    ranks = []
    for rank in range(WORLD):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(WORLD)}
        ranks.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(HUNG_RANK),
                    bootstrap,
                    prefix,
                    str(spool),
                    run_id,
                    *ports,
                    mode,
                ],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    for process in ranks:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"
    return ranks


def stack_batches(bootstrap: str, topics: Topics, run_id: str, count: int) -> list[LogBatch]:
    def of_run(message: Any) -> LogBatch | None:
        batch = CODEC.decode_log_batch(message.value())
        entries = batch["entries"]
        if batch["run_id"] == run_id and entries and entries[0]["logger"] == STACKS_LOGGER:
            return batch
        return None

    def enough(messages: list[Any]) -> bool:
        return sum(of_run(message) is not None for message in messages) >= count

    messages = read_all(bootstrap, topics.logs, enough, timeout_s=90.0)
    return [batch for message in messages if (batch := of_run(message)) is not None]


def test_a_hung_rank_is_named_by_the_stacks_the_agent_takes(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    archive = tmp_path / "archive"
    settings = settings_at(kafka_bootstrap, topics, archive={"root": str(archive)})
    worker = WorkerProcess(
        kafka_bootstrap, topics.prefix, tmp_path / "worker.log", str(rules), 3, grace_s=2.0
    )
    archiver = ArchiverProcess(
        kafka_bootstrap, topics.prefix, archive, tmp_path / "archiver.log", {"archive.roll_s": 0.5}
    )
    run_id = f"hung-{uuid.uuid4().hex[:8]}"
    ranks: list[subprocess.Popen[str]] = []
    with worker, archiver:
        try:
            worker.wait_consuming(timeout_s=90.0)
            ranks = start_ranks(kafka_bootstrap, topics.prefix, tmp_path / "spool", run_id)
            batches = stack_batches(kafka_bootstrap, topics, run_id, WORLD)
            commands = [
                CODEC.decode_command(message.value())
                for message in read_to_end(kafka_bootstrap, topics.control)
            ]
            by_hand = rlpulse(
                kafka_bootstrap, topics, "control", "stacks", run_id, "--rank-wait", "5"
            )
            unknown = rlpulse(
                kafka_bootstrap, topics, "control", "stacks", "no-such-run", "--wait", "3",
                "--rank-wait", "1",
            )  # fmt: skip
            shown = wait_for_archive(run_id, archive, topics)
            page = run_page_text(settings, run_id)
        finally:
            for process in ranks:
                process.send_signal(signal.SIGKILL)
                process.wait(30)
    silent = [c for c in commands if c["run_id"] == run_id and c["rule_id"] == "run-silent"]
    assert len(silent) == 1, tail(worker.log_file, 40)
    by_rank = {batch["rank"]: batch["entries"][0] for batch in batches}
    assert sorted(by_rank) == list(range(WORLD))
    assert {rank: entry["fields"]["outcome"] for rank, entry in by_rank.items()} == dict.fromkeys(
        range(WORLD), "stacks"
    )
    assert {entry["fields"]["command_id"] for entry in by_rank.values()} == {
        silent[0]["command_id"]
    }
    pids = {process.pid for process in ranks}
    assert {int(entry["fields"]["pid"]) for entry in by_rank.values()} == pids
    for rank, entry in by_rank.items():
        loop = parse_dump(entry["message"])[0]  # the training loop's thread comes first
        assert entry["message"].splitlines()[0].endswith(LOOP_MARK)
        if rank == 2:
            assert any("in wait_for_a_batch_that_never_comes" in f for f in loop.frames), entry
            assert entry["step"] == 3  # its last step logged
        else:
            assert any("in all_reduce" in frame for frame in loop.frames), entry
            assert entry["step"] == 4
    assert by_hand.returncode == 0, by_hand.stderr
    assert by_hand.stdout.splitlines()[1:3] == shown.splitlines()[1:3], by_hand.stdout
    said = unknown.stderr.strip().splitlines()  # a progress line, then the error's one line
    assert (unknown.returncode, len(said)) == (2, 2), unknown
    assert said[1].startswith("error: no agent answered for run no-such-run within"), said
    first, second = shown.splitlines()[1:3]
    assert first.startswith("  1 rank in wait threading.py:") and first.endswith(
        f"from wait_for_a_batch_that_never_comes hung_rank.py:{HANG_LINE} (2)"
    ), shown
    assert second.startswith("  3 ranks in ") and second.endswith("(0, 1, 3)"), shown
    assert "Silent: no step since" in page and "(step 4; one every" in page, page
    assert first.strip() in page and second.strip() in page, page


def rlpulse(bootstrap: str, topics: Topics, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the rlpulse command line against the session's broker and these topics."""
    command = [sys.executable, "-m", "rlpulse", *args]
    command += ["--bootstrap", bootstrap, "--prefix", topics.prefix]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)


def wait_for_archive(run_id: str, archive: Path, topics: Topics) -> str:
    """``rlpulse show RUN --stacks`` once the archive holds the capture's every rank."""
    said: list[str] = []

    def archived() -> bool:
        shown = subprocess.run(
            [sys.executable, "-m", "rlpulse", "show", run_id, "--stacks", "--archive",
             str(archive), "--prefix", topics.prefix],
            check=False, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        said[:] = [shown.stdout + shown.stderr]
        return shown.returncode == 0 and f"{WORLD} rank(s)" in shown.stdout

    wait_for(archived, "the capture in the archive", 60.0, 1.0, lambda: said[0] if said else "")
    return said[0]


def run_page_text(settings: Settings, run_id: str) -> str:
    """What the run page's silence card says, in a real Chromium."""
    server = UiServer(run_data(settings), port=0)
    server.start()
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = chromium.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{server.url}run?id={run_id}")
            page.wait_for_function("window.rlpulseReady === true", timeout=60_000)
            text = (
                page.locator("#quiet").inner_text() if page.locator("#quiet").is_visible() else ""
            )
            chromium.close()
            return text
    finally:
        server.stop()


KILLED_RULES = RULES.replace("floor_s: 6", "floor_s: 8")


def test_a_killed_rank_is_reported_gone_and_the_others_stacks_arrive(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    """Rank 2 is SIGKILLed where it would hang; the others wait for it (hung_rank.py's
    ``killed`` mode says why in a store, not in gloo). Its log is sent whole and deleted
    before the silence fires: the agent still reports its process gone."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(KILLED_RULES)
    worker = WorkerProcess(
        kafka_bootstrap, topics.prefix, tmp_path / "worker.log", str(rules), 3, grace_s=2.0
    )
    run_id = f"killed-{uuid.uuid4().hex[:8]}"
    ranks: list[subprocess.Popen[str]] = []
    with worker:
        try:
            worker.wait_consuming(timeout_s=90.0)
            ranks = start_ranks(
                kafka_bootstrap, topics.prefix, tmp_path / "spool", run_id, "killed"
            )
            stdout = ranks[2].stdout
            assert stdout is not None and stdout.readline().strip() == "stuck"
            ranks[2].send_signal(signal.SIGKILL)
            batches = stack_batches(kafka_bootstrap, topics, run_id, WORLD)
        finally:
            for process in ranks:
                process.send_signal(signal.SIGKILL)
                process.wait(30)
    by_rank = {batch["rank"]: batch["entries"][0] for batch in batches}
    outcomes = {rank: entry["fields"]["outcome"] for rank, entry in by_rank.items()}
    assert outcomes == {0: "stacks", 1: "stacks", 2: "gone", 3: "stacks"}, tail(worker.log_file, 40)
    assert by_rank[2]["level"] == "ERROR" and "its process is gone" in by_rank[2]["message"]
    for rank in (0, 1, 3):
        loop = parse_dump(by_rank[rank]["message"])[0]
        assert any("in wait_for_the_peers" in frame for frame in loop.frames), by_rank[rank]
