"""Writing one record and waiting until the broker has it: what operator actions need."""

from __future__ import annotations

from rlpulse.ops.exceptions import PublishError
from rlpulse.settings import Settings
from rlpulse.transport.bootstrap import bootstrap_servers
from rlpulse.transport.clients import new_producer

__all__ = ["publish_one"]


def publish_one(
    settings: Settings,
    topic: str,
    key: bytes,
    value: bytes,
    *,
    client: str,
    headers: list[tuple[str, str | bytes | None]] | None = None,
    timeout_s: float = 15.0,
) -> None:
    """Produce one record to ``topic`` and wait until it is confirmed (:class:`PublishError`)."""
    producer = new_producer(settings, client, {"enable.idempotence": True})
    failures: list[str] = []

    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    producer.produce(topic, key=key, value=value, headers=headers, on_delivery=delivered)
    if producer.flush(timeout_s) or failures:
        reason = failures[0] if failures else f"not confirmed within {timeout_s:.0f} s"
        raise PublishError(
            f"could not publish to {topic} at {bootstrap_servers(settings)}: {reason}"
        )
