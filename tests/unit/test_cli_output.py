"""What the command line prints at 80 columns, and that its help agrees with itself."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import rlpulse
from rlpulse.cli import app
from rlpulse.settings import Settings, masked

NARROW = {"COLUMNS": "80"}
WIDE = {"COLUMNS": "200"}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("RLPULSE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("RLPULSE_HOME", str(tmp_path / "home"))


def commands() -> Iterator[list[str]]:
    """Every command and group, as the words that name it."""

    def walk(command: Any, words: list[str]) -> Iterator[list[str]]:
        yield words
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*words, name])

    yield from walk(typer.main.get_command(app), [])


def test_config_show_at_80_columns_cuts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLPULSE_PRODUCER__SYSTEM_METRICS_INTERVAL_S", "5")
    monkeypatch.setenv("RLPULSE_HOME", "/a/rather/long/path/to/the/home/of/rlpulse/on/this/box")
    shown = CliRunner().invoke(app, ["config", "show"], env=NARROW)
    assert shown.exit_code == 0, shown.output
    assert "…" not in shown.stdout
    first_words = {line.split()[0] for line in shown.stdout.splitlines() if line.strip()}
    assert set(masked(Settings())) <= first_words  # each name whole, at the start of a line


def test_config_show_names_the_bootstrap_actually_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLPULSE_BROKER__PORT", "29092")
    shown = CliRunner().invoke(app, ["config", "show", "--json"])
    rows = {row["name"]: row for row in map(json.loads, shown.stdout.splitlines())}
    assert rows["bootstrap"]["value"] == "127.0.0.1:29092"
    assert rows["bootstrap"]["source"] == "default (no local broker running: 127.0.0.1:broker.port)"
    table = CliRunner().invoke(app, ["config", "show"], env=NARROW)
    assert "null" not in next(line for line in table.stdout.splitlines() if "bootstrap" in line)


@pytest.mark.parametrize("words", list(commands()), ids=" ".join)
def test_help_at_80_columns_cuts_nothing_and_writes_defaults_one_way(words: list[str]) -> None:
    shown = CliRunner().invoke(app, [*words, "--help"], env=NARROW)
    assert shown.exit_code == 0, shown.output
    cut = re.findall(r"\S*…", shown.stdout)
    assert all("/" in word for word in cut), cut  # only a long path (a default) may be cut
    assert "(default" not in shown.stdout and "default)" not in shown.stdout, shown.stdout
    for old in RENAMED:  # hidden: shown only under the new spelling
        assert not re.search(rf"{old}(?![-\w])", shown.stdout), (old, shown.stdout)


# Flags renamed after their settings (worker.grace_s -> --grace-s, like backtest's); the old
# spellings still work, hidden.
RENAMED = {
    "--grace": "--grace-s",
    "--late-window": "--late-window-s",
    "--lookback": "--lookback-s",
    "--expire-ended": "--expire-ended-s",
    "--expire-silent": "--expire-silent-s",
    "--startup-timeout": "--startup-timeout-s",
}


def test_duration_flags_end_in_s_like_their_settings() -> None:
    helps = {
        name: " ".join(CliRunner().invoke(app, [name, "--help"], env=WIDE).stdout.split())
        for name in ("worker", "exporter", "archive")
    }
    assert {"--grace-s", "--late-window-s", "--startup-timeout-s"} <= set(helps["worker"].split())
    assert {"--lookback-s", "--expire-ended-s", "--expire-silent-s"} <= set(
        helps["exporter"].split()
    )
    assert "--startup-timeout-s" in helps["archive"].split()


@pytest.mark.parametrize(
    ("command", "old", "setting"),
    [
        ("worker", "--grace", "worker.grace_s"),
        ("worker", "--late-window", "worker.late_window_s"),
        ("worker", "--startup-timeout", "worker.startup_timeout_s"),
        ("exporter", "--lookback", "exporter.lookback_s"),
        ("exporter", "--expire-ended", "exporter.expire_ended_s"),
        ("exporter", "--expire-silent", "exporter.expire_silent_s"),
        ("exporter", "--startup-timeout", "exporter.startup_timeout_s"),
        ("archive", "--startup-timeout", "archive.startup_timeout_s"),
    ],
)
def test_old_flag_spellings_still_set_their_setting(command: str, old: str, setting: str) -> None:
    """-1 is out of range: the refusal names the setting the old spelling set."""
    env = WIDE | {"RLPULSE_BOOTSTRAP": "127.0.0.1:1"}  # never reached: refused before
    done = CliRunner().invoke(app, [command, old, "-1"], env=env)
    assert done.exit_code == 1, done.output
    assert f"setting {setting} (from flag)" in done.stderr


def test_help_shows_the_default_in_force(tmp_path: Path) -> None:
    env = os.environ | {
        "COLUMNS": "200",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),  # this checkout's rlpulse
        "RLPULSE_WORKER__GRACE_S": "12",
        "RLPULSE_BROKER__PORT": "29092",
        "RLPULSE_HOME": str(tmp_path),
    }

    def shown(*words: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "rlpulse", *words, "--help"],
            capture_output=True, text=True, env=env, check=True,
        )  # fmt: skip
        return " ".join(done.stdout.replace("│", " ").split())

    worker = shown("worker")
    assert (
        "Seconds a step waits for missing ranks (wall clock). [default: 12.0, from env "
        "RLPULSE_WORKER__GRACE_S]" in worker
    )
    assert "Partitions of the run-keyed topics. [default: 6]" in worker
    assert "[default: 127.0.0.1:29092]" in worker  # bootstrap: no broker runs in this home
    broker = shown("broker", "up")
    assert "[default: 29092, from env RLPULSE_BROKER__PORT]" in broker
    assert f"[default: {tmp_path / 'broker'}, from env RLPULSE_HOME]" in broker


def test_broker_status_and_down_find_a_stopped_local_cluster(tmp_path: Path) -> None:
    (tmp_path / "home" / "broker" / "node-1").mkdir(parents=True)  # a cluster's first node
    status = CliRunner().invoke(app, ["broker", "status"])
    assert (status.exit_code, status.stdout) == (1, "node 1: down\n")
    down = CliRunner().invoke(app, ["broker", "down"])
    assert (down.exit_code, down.stdout) == (0, "Kafka was not running\n")


def test_version() -> None:
    done = CliRunner().invoke(app, ["--version"])
    assert (done.exit_code, done.stdout) == (0, f"rlpulse {rlpulse.__version__}\n")
