"""Signed ControlCommands: what the signature covers, and that it survives the wire."""

from __future__ import annotations

import copy
import hashlib
import hmac
import io
from typing import Any

import pytest
from fastavro import schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpulse.schemas.codec import MAGIC, default_codec
from rlpulse.schemas.records import ControlCommand
from rlpulse.schemas.signing import DOMAIN, canonical_bytes, sign, signature_problem
from tests.command_strategies import commands

KEY = b"k" * 32
codec = default_codec()


def command(**changes: Any) -> ControlCommand:
    base: ControlCommand = {
        "command_id": "c-1",
        "run_id": "run-1",
        "attempt": 0,
        "stage": "actor",
        "step": 52,
        "origin": "rule",
        "rule_id": "kl-guard",
        "rule_version": "abc",
        "dry_run": False,
        "actions": [
            {"type": "checkpoint", "params": {"tag": "kl"}},
            {"type": "scale_rollout_batch", "params": {"factor": 2.0, "max": 256}},
            {"type": "stop", "params": {}},
        ],
        "reason": "kl_divergence 0.5 > 0.3 for 3 consecutive steps",
        "evidence": {"value": 0.5, "threshold": 0.3},
        "issued_ns": 1_700_000_000_000_000_000,
    }
    return {**base, **changes}  # type: ignore[typeddict-item]


def over_the_wire(record: ControlCommand) -> ControlCommand:
    return codec.decode_command(codec.encode("ControlCommand", record))


def test_a_signed_command_verifies_after_the_wire() -> None:
    signed = over_the_wire(sign(command(), KEY))
    assert signed["signature"] is not None and len(signed["signature"]) == 32
    assert signature_problem(signed, KEY) is None


def test_unsigned_and_wrongly_signed_commands_are_told_apart() -> None:
    unsigned = over_the_wire(command())
    assert unsigned["signature"] is None
    assert "not signed" in str(signature_problem(unsigned, KEY))
    other = over_the_wire(sign(command(), b"o" * 32))
    assert "does not match" in str(signature_problem(other, KEY))


@pytest.mark.parametrize(
    "change",
    [
        {"run_id": "run-2"},
        {"attempt": 1},
        {"step": 53},
        {"command_id": "c-2"},
        {"dry_run": True},
        {"origin": "operator"},
        {"reason": "something else"},
        {"issued_ns": 1},
        {"evidence": {"value": 0.6, "threshold": 0.3}},
        {"actions": [{"type": "stop", "params": {}}]},
    ],
    ids=lambda change: next(iter(change)),
)
def test_every_field_is_covered(change: dict[str, Any]) -> None:
    signed = sign(command(), KEY)
    tampered: ControlCommand = {**signed, **change}  # type: ignore[typeddict-item]
    assert "does not match" in str(signature_problem(over_the_wire(tampered), KEY))


def test_a_changed_parameter_is_covered() -> None:
    signed = sign(command(), KEY)
    tampered = copy.deepcopy(signed)
    tampered["actions"][1]["params"]["max"] = 1 << 20
    assert "does not match" in str(signature_problem(tampered, KEY))
    tampered["actions"][1]["params"]["max"] = 256.0  # a double is not the long 256
    assert "does not match" in str(signature_problem(tampered, KEY))


def test_map_order_does_not_matter_action_order_does() -> None:
    signed = sign(command(), KEY)
    reordered = copy.deepcopy(signed)
    reordered["evidence"] = dict(reversed(list(signed["evidence"].items())))
    params = signed["actions"][1]["params"]
    reordered["actions"][1]["params"] = dict(reversed(list(params.items())))
    assert signature_problem(reordered, KEY) is None
    swapped = copy.deepcopy(signed)
    swapped["actions"] = list(reversed(signed["actions"]))
    assert "does not match" in str(signature_problem(swapped, KEY))


def test_the_canonical_form_is_as_documented() -> None:
    """Fingerprint of the newest schema + Avro body with signature null and sorted maps."""
    record = command(evidence={"z": 1.0, "a": 2.0})
    schema = codec.registry.latest("ControlCommand")
    body = io.BytesIO()
    expected = {**record, "evidence": {"a": 2.0, "z": 1.0}, "signature": None}
    expected["actions"] = [
        {"type": a["type"], "params": dict(sorted(a["params"].items()))} for a in record["actions"]
    ]
    schemaless_writer(body, schema.parsed, expected)
    assert canonical_bytes(record) == schema.fingerprint + body.getvalue()
    mac = hmac.new(KEY, DOMAIN + canonical_bytes(record), hashlib.sha256).digest()
    assert sign(record, KEY)["signature"] == mac
    encoded = codec.encode("ControlCommand", record)
    assert encoded[:10] == MAGIC + schema.fingerprint  # the header carries the same fingerprint


def test_a_v1_command_reads_back_unsigned() -> None:
    v1 = codec.registry.versions("ControlCommand")[0]
    body = io.BytesIO()
    schemaless_writer(body, v1.parsed, command())
    decoded = codec.decode_command(MAGIC + v1.fingerprint + body.getvalue())
    assert decoded["signature"] is None
    assert "not signed" in str(signature_problem(decoded, KEY))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_command_verifies_after_the_wire(data: st.DataObject) -> None:
    record = data.draw(commands("run-1"))
    signed = over_the_wire(sign(record, KEY))
    assert signature_problem(signed, KEY) is None
    assert signature_problem(signed, b"x" * 32) is not None
