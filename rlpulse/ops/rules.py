"""``rlpulse rules publish``: validate a rules file and hand it to every worker."""

from __future__ import annotations

from pathlib import Path

from rlpulse.ops.exceptions import RulesTooLargeError
from rlpulse.ops.publish import publish_one
from rlpulse.rules.loader import load_rules
from rlpulse.rules.model import RuleSet
from rlpulse.schemas.topics import RULES_KEY, SOURCE_HEADER, Topics
from rlpulse.settings import Settings

__all__ = ["publish_rules"]


def publish_rules(path: Path, settings: Settings, timeout_s: float = 15.0) -> RuleSet:
    """Validate ``path`` (raising ``RulesFileError``) and write it to the compacted rules topic.

    A file larger than ``worker.rules_max_bytes`` is refused (:class:`RulesTooLargeError`):
    every worker would refuse it.

    Workers following the topic swap to it at their next summary; the broker keeps only
    the latest text under one key, so a worker started later reads the same rules.
    """
    ruleset = load_rules(path)
    size, limit = path.stat().st_size, settings.worker.rules_max_bytes
    if size > limit:
        raise RulesTooLargeError(
            f"{path}: {size} bytes, larger than the {limit} workers accept "
            "(worker.rules_max_bytes); not published"
        )
    publish_one(
        settings,
        Topics(settings.prefix).rules,
        RULES_KEY,
        path.read_bytes(),
        client="rules publish",
        headers=[(SOURCE_HEADER, str(path.resolve()).encode())],
        timeout_s=timeout_s,
    )
    return ruleset
