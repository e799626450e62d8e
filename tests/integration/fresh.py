"""The environment of a command run as on a fresh machine: only RLPULSE_HOME set."""

from __future__ import annotations

import os
from pathlib import Path

KEPT = frozenset({"RLPULSE_AGENT__IDLE_EXIT_S"})
"""Kept from the suite's environment: its host agents exit a second after their last writer
(``tests/conftest.py``), where a user's wait ten minutes."""


def environment(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without RLPULSE_* (but :data:`KEPT`), with ``home`` and
    ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLPULSE_") or k in KEPT}
    return {**env, "RLPULSE_HOME": str(home), "PYTHONUNBUFFERED": "1", **extra}
