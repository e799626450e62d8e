"""Where the command line finds Kafka."""

from __future__ import annotations

import os

from rlpulse.broker import LocalBroker

FALLBACK_BOOTSTRAP = "127.0.0.1:9092"


def resolve_bootstrap(explicit: str | None = None) -> str:
    """``--bootstrap``, else ``RLPULSE_BOOTSTRAP``, else the running local broker, else 9092."""
    if explicit:
        return explicit
    from_env = os.environ.get("RLPULSE_BOOTSTRAP")
    if from_env:
        return from_env
    info = LocalBroker().info()
    return info.bootstrap if info is not None else FALLBACK_BOOTSTRAP
