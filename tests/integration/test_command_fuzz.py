"""Random ControlCommands through RunLink's application path on the real broker.

Hypothesis draws batches of commands with random actions and parameters; each batch is
written to the control topic, and a training loop polls them with ``RunLink``, applies
what it gets with ``apply_command`` and acks it. Nothing may raise into the loop, and
every command must end up applied (or noop), or acked ``rejected`` with a reason -- by
the control client when its contents are absurd, by the action handlers otherwise.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from confluent_kafka import Consumer, Producer
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rlpulse.producers import RunLink
from rlpulse.producers.integrations.commands import apply_command
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import CommandAck, ControlCommand
from rlpulse.schemas.topics import Topics
from rlpulse.transport.topics import ensure_topics
from tests.command_strategies import ToyTrainer, commands
from tests.kafka import settings_at

pytestmark = pytest.mark.broker

RUN_ID = "fuzzed-run"
codec = default_codec()


@dataclass
class Loop:
    """A training loop's RunLink, a producer standing in for the worker, and an acks reader."""

    link: RunLink
    producer: Producer
    acks: Consumer
    topics: Topics
    seen_acks: dict[str, CommandAck] = field(default_factory=dict)

    def acks_of(self, ids: set[str], timeout_s: float) -> dict[str, CommandAck]:
        deadline = time.monotonic() + timeout_s
        while not ids <= set(self.seen_acks) and time.monotonic() < deadline:
            for message in self.acks.consume(500, timeout=0.2):
                if message.error() is None:
                    ack = codec.decode_ack(message.value() or b"")
                    self.seen_acks[ack["command_id"]] = ack
        return {i: self.seen_acks[i] for i in ids if i in self.seen_acks}


@pytest.fixture(scope="module")
def loop(kafka_bootstrap: str) -> Iterator[Loop]:
    topics = Topics(prefix=f"fuzz-{uuid.uuid4().hex[:8]}")
    settings = settings_at(kafka_bootstrap, topics)
    ensure_topics(settings, topics, partitions=1)
    link = RunLink(RUN_ID, settings=settings)
    deadline = time.monotonic() + 60
    while link.control is not None and not link.control.started and time.monotonic() < deadline:
        assert link.poll_commands(timeout_s=0.5) == []
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    acks = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"fuzz-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
        }
    )
    acks.subscribe([topics.acks])
    try:
        yield Loop(link, producer, acks, topics)
    finally:
        acks.close()
        link.close()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(commands(RUN_ID), min_size=1, max_size=12))
def test_random_commands_are_applied_or_rejected_with_a_reason(
    loop: Loop, batch: list[ControlCommand]
) -> None:
    for command in batch:
        loop.producer.produce(
            loop.topics.control,
            key=RUN_ID.encode(),
            value=codec.encode("ControlCommand", command),
        )
    assert loop.producer.flush(30) == 0
    wanted = {c["command_id"] for c in batch}
    trainer = ToyTrainer()
    returned: dict[str, ControlCommand] = {}
    deadline = time.monotonic() + 60
    control = loop.link.control
    assert control is not None
    while time.monotonic() < deadline:
        for command in loop.link.poll_commands(timeout_s=0.2):  # the training loop's part
            outcome = apply_command(command, trainer.handlers())
            loop.link.ack(command, outcome.status, applied_at_step=1, detail=outcome.detail)
            returned[command["command_id"]] = command
        if wanted <= set(returned) | control.acked_command_ids:
            break
    acks = loop.acks_of(wanted, timeout_s=30)
    assert set(acks) == wanted, f"commands without an ack: {wanted - set(acks)}"
    for command_id, ack in acks.items():
        event(f"{ack['status']} by the {'loop' if command_id in returned else 'control client'}")
        assert ack["status"] != "failed", ack
        if ack["status"] == "rejected":
            assert any(k.endswith("reason") and v for k, v in ack["detail"].items()), ack
        if command_id not in returned:  # refused by the control client: never reached the loop
            assert (ack["status"], ack["detail"]["check"]) == ("rejected", "contents"), ack
