"""Settings for tests that talk to the session's broker."""

from __future__ import annotations

from typing import Any

from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings


def settings_at(bootstrap: str, topics: Topics | None = None, **sections: Any) -> Settings:
    """Settings pointing at ``bootstrap`` (and ``topics``' prefix), with ``sections`` over them."""
    fields: dict[str, Any] = {"bootstrap": bootstrap, **sections}
    if topics is not None:
        fields["prefix"] = topics.prefix
    return Settings(**fields)
