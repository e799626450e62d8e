"""``rlpulse rules publish``: validate a rules file (or preset) and hand it to every worker."""

from __future__ import annotations

import os
from pathlib import Path

from rlpulse.ops.exceptions import RulesTooLargeError
from rlpulse.ops.publish import publish_one
from rlpulse.rules.loader import read_rules_source
from rlpulse.rules.model import RuleSet
from rlpulse.schemas.topics import RULES_KEY, SOURCE_HEADER, Topics
from rlpulse.settings import Settings

__all__ = ["publish_rules"]


def publish_rules(source: str | os.PathLike[str], settings: Settings) -> RuleSet:
    """Validate ``source`` and write its text to the compacted rules topic.

    ``source`` is a rules file, or a preset name where no file of that name exists. Raises
    ``RulesFileError`` or ``PresetNotFoundError``; a text larger than
    ``worker.rules_max_bytes`` is refused (:class:`RulesTooLargeError`): every worker would
    refuse it.

    Workers following the topic swap to it at their next summary; the broker keeps only
    the latest text under one key, so a worker started later reads the same rules.
    """
    raw, ruleset = read_rules_source(source)
    size, limit = len(raw), settings.worker.rules_max_bytes
    if size > limit:
        raise RulesTooLargeError(
            f"{source}: {size} bytes, larger than the {limit} workers accept "
            "(worker.rules_max_bytes); not published"
        )
    path = Path(source)
    origin = str(path.resolve()) if path.exists() else f"preset {source}"
    publish_one(
        settings,
        Topics(settings.prefix).rules,
        RULES_KEY,
        raw,
        client="rules publish",
        headers=[(SOURCE_HEADER, origin.encode())],
    )
    return ruleset
