"""What the command line prints at 80 columns, and that its help agrees with itself."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from rlpulse.cli import app
from rlpulse.settings import Settings, masked

NARROW = {"COLUMNS": "80"}


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
def test_help_at_80_columns_cuts_nothing(words: list[str]) -> None:
    shown = CliRunner().invoke(app, [*words, "--help"], env=NARROW)
    assert shown.exit_code == 0, shown.output
    assert "…" not in shown.stdout, shown.stdout
