"""Settings for tests that talk to the session's broker."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rlpulse.schemas.topics import Topics
from rlpulse.settings import ProducerSettings, Settings


def settings_at(bootstrap: str, topics: Topics | None = None, **sections: Any) -> Settings:
    """Settings pointing at ``bootstrap`` (and ``topics``' prefix), with ``sections`` over them.

    Unless ``producer`` is given, spools go to a fresh temporary directory: a test never
    adopts (or leaves) spool files in the machine's rlpulse home.
    """
    if "producer" not in sections:
        spool = Path(tempfile.mkdtemp(prefix="rlpulse-test-spool-"))
        sections["producer"] = ProducerSettings(spool_dir=spool)
    fields: dict[str, Any] = {"bootstrap": bootstrap, **sections}
    if topics is not None:
        fields["prefix"] = topics.prefix
    return Settings(**fields)
