"""rlpulse's own warnings reach stderr even when the root logger's only handler is rlpulse's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import rlpulse

ROOT = Path(rlpulse.__file__).resolve().parent.parent

TRAINER = """
import logging
from rlpulse.producers import EventHandler, EventLogger, Settings

events = EventLogger("run-a", settings=Settings(bootstrap="127.0.0.1:1", prefix="unit"))
{setup}
logging.getLogger("trainer").warning("a trainer's own warning")
events.log({{"loss": 1.0}}, step=-1)  # refused: rlpulse warns about it
print("logged", events.logged, "refused", events.refused)
events.close(timeout_s=0)
"""


def run_trainer(setup: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "RLPULSE_HOME": str(home),
    }
    code = textwrap.dedent(TRAINER.format(setup=setup))
    return subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_warnings_reach_stderr_with_the_event_handler_on_the_root_logger(tmp_path: Path) -> None:
    result = run_trainer("logging.getLogger().addHandler(EventHandler(events))", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "refused {'negative_step': 1}" in result.stdout
    refusals = [line for line in result.stderr.splitlines() if "was not sent" in line]
    assert len(refusals) == 1, result.stderr
    assert refusals[0].startswith("WARNING rlpulse.producers.caller.logger: run run-a rank 0")
    assert "a trainer's own warning" not in result.stderr  # the user's records: the handler's


def test_a_console_handler_of_the_program_prints_them_once(tmp_path: Path) -> None:
    result = run_trainer("logging.basicConfig(format='console: %(message)s')", tmp_path)
    assert result.returncode == 0, result.stderr
    refusals = [line for line in result.stderr.splitlines() if "was not sent" in line]
    assert len(refusals) == 1, result.stderr
    assert refusals[0].startswith("console: run run-a rank 0")


def test_importing_rlpulse_leaves_the_programs_logging_alone() -> None:
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "import logging, rlpulse, rlpulse.producers, rlpulse.cli; "
            "print(logging.getLogger().handlers, logging.getLogger('rlpulse').handlers)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    assert shown.stdout.strip() == "[] []"
