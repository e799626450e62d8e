"""Unit tests never touch the machine's rlpulse home: each gets its own; and start no agent."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def rlpulse_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``RLPULSE_HOME`` (spools, state) is the test's own directory."""
    home = tmp_path / "rlpulse-home"
    monkeypatch.setenv("RLPULSE_HOME", str(home))
    monkeypatch.delenv("RLPULSE_BROKER__JVM_OPTIONS", raising=False)  # tests/conftest.py's
    return home


@pytest.fixture(autouse=True)
def no_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    """No broker runs for a unit test: its loggers' records wait in their write-ahead logs,
    and no host agent is started (one that cannot deliver would keep trying)."""
    monkeypatch.setenv("RLPULSE_AGENT__START", "never")
