"""``rlpulse rules publish``: validate a rules file and hand it to every worker."""

from __future__ import annotations

from pathlib import Path

from rlpulse.producers.config import ProducerConfig, new_producer
from rlpulse.rules.loader import load_rules
from rlpulse.rules.model import RuleSet
from rlpulse.streams.rulebook import RULES_KEY


def publish_rules(path: Path, config: ProducerConfig, timeout_s: float = 15.0) -> RuleSet:
    """Validate ``path`` (raising ``RulesFileError``) and write it to the compacted rules topic.

    Workers following the topic swap to it at their next summary; the broker keeps only
    the latest text under one key, so a worker started later reads the same rules.
    """
    ruleset = load_rules(path)
    producer = new_producer(config, "rules-publish")
    failures: list[str] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    producer.produce(
        config.topics.rules,
        key=RULES_KEY,
        value=path.read_bytes(),
        headers=[("rlpulse-source", str(path.resolve()).encode())],
        on_delivery=delivered,
    )
    if producer.flush(timeout_s) or failures:
        reason = failures[0] if failures else f"not confirmed within {timeout_s:.0f} s"
        raise TimeoutError(f"could not publish to {config.topics.rules}: {reason}")
    return ruleset
