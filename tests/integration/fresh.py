"""The environment of a command run as on a fresh machine: only RLPULSE_HOME set."""

from __future__ import annotations

import os
from pathlib import Path


def environment(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without any RLPULSE_*, with ``home`` and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLPULSE_")}
    return {**env, "RLPULSE_HOME": str(home), "PYTHONUNBUFFERED": "1", **extra}
