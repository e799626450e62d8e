"""Codec: round trips, every kind of bad bytes, and data written with older schema versions."""

from __future__ import annotations

import io
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from fastavro import schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpulse.schemas import Codec, DecodeError, DecodeFailure, SchemaRegistry, default_codec
from rlpulse.schemas.codec import MAGIC, RECORD_NAMES, _packaged_schema_dir


def trainer_event(**overrides: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "kind": "metrics",
        "run_id": "run-1",
        "attempt": 0,
        "step": 12,
        "stage": "rollout",
        "rank": 3,
        "world_size": 8,
        "metrics": {"reward_mean": 2.41, "kl_divergence": 0.182},
        "level": None,
        "message": None,
        "tags": {"algo": "grpo"},
        "timestamp_ns": 1_700_000_000_000_000_000,
        "hostname": "node-7",
        "pid": 4242,
        "producer_id": "p-1",
        "seq": 99,
        "policy_version": None,
        "trace_id": None,
    }
    event.update(overrides)
    return event


SAMPLES: dict[str, dict[str, Any]] = {
    "TrainerEvent": trainer_event(),
    "StepSummary": {
        "summary_id": "s-1",
        "run_id": "run-1",
        "attempt": 0,
        "stage": "rollout",
        "step": 12,
        "revision": 1,
        "world_size": 2,
        "ranks_reported": [0, 1],
        "missing_ranks": [],
        "metrics": {
            "reward_mean": {
                "count": 2,
                "sum": 3.0,
                "mean": 1.5,
                "std": 0.5,
                "min": 1.0,
                "max": 2.0,
                "min_rank": 0,
                "max_rank": 1,
                "non_finite": 0,
            }
        },
        "tags": {},
        "last_rank": 1,
        "last_rank_lag_ns": 1500,
        "stragglers": [2],
        "closed_by": "complete",
        "first_event_ns": 1,
        "last_event_ns": 1501,
        "emitted_ns": 2000,
    },
    "ControlCommand": {
        "command_id": "c-1",
        "run_id": "run-1",
        "attempt": 0,
        "stage": "actor",
        "step": 40,
        "origin": "rule",
        "rule_id": "kl-guard",
        "rule_version": "abc",
        "dry_run": False,
        "actions": [
            {"type": "checkpoint", "params": {"tag": "kl_violation"}},
            {"type": "scale_rollout_batch", "params": {"factor": 2.0, "max": 256, "x": None}},
        ],
        "reason": "kl_divergence 0.41 > 0.3 for 3 consecutive steps",
        "evidence": {"value": 0.41},
        "issued_ns": 5,
        "signature": b"\x01" * 32,
    },
    "CommandAck": {
        "command_id": "c-1",
        "run_id": "run-1",
        "attempt": 0,
        "status": "applied",
        "applied_at_step": 41,
        "detail": {"checkpoint_path": "/ckpt/41"},
        "acked_ns": 6,
    },
    "LogRecord": {
        "run_id": "run-1",
        "attempt": 0,
        "step": 12,
        "stage": "rollout",
        "rank": 3,
        "level": "ERROR",
        "levelno": 40,
        "logger": "verl.workers.rollout",
        "message": "CUDA out of memory",
        "exception": "Traceback (most recent call last): ...",
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "fields": {"gpu": "3"},
        "sample_rate": 1.0,
        "sampled_out": {"INFO": 17},
        "tags": {"algo": "grpo"},
        "timestamp_ns": 1_700_000_000_000_000_000,
        "hostname": "node-7",
        "host_ip": "10.0.0.7",
        "pid": 4242,
        "producer_id": "p-1",
        "seq": 100,
    },
    "LogBatch": {
        "run_id": "run-1",
        "attempt": 0,
        "rank": 3,
        "tags": {"algo": "grpo"},
        "hostname": "node-7",
        "host_ip": "10.0.0.7",
        "pid": 4242,
        "producer_id": "p-1",
        "entries": [
            {
                "seq": seq,
                "timestamp_ns": 1_700_000_000_000_000_000 + seq,
                "step": 12,
                "stage": "rollout",
                "level": "ERROR",
                "levelno": 40,
                "logger": "verl.workers.rollout",
                "message": "CUDA out of memory",
                "exception": None,
                "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
                "fields": {"gpu": "3"},
                "sample_rate": 1.0,
                "sampled_out": {"INFO": 17},
            }
            for seq in (100, 101)
        ],
    },
    "AuditReport": {
        "run_id": "run-1",
        "audited_ns": 7,
        "ok": False,
        "producers": 2,
        "received": 98,
        "lost": 2,
        "duplicates": 0,
        "gaps": [
            {"producer_id": "p-1", "hostname": "node-7", "rank": 3, "first_seq": 5, "last_seq": 6}
        ],
        "steps_with_missing_ranks": 1,
        "dead_letters": 0,
        "clocks": [{"hostname": "node-7", "offset_ms": 1.5, "records": 98}],
        "summary": "2 records lost",
    },
    "SampleBatch": {
        "run_id": "run-1",
        "attempt": 0,
        "rank": 3,
        "tags": {"team": "rl"},
        "hostname": "node-7",
        "pid": 4242,
        "producer_id": "p-1.samples",
        "entries": [
            {
                "seq": 0,
                "timestamp_ns": 1_700_000_000_000_000_000,
                "step": 12,
                "split": "train",
                "first_index": 0,
                "reward": [1.0, 0.0],
                "prompt_length": [30, 31],
                "response_length": [200, 4096],
                "truncated": [False, True],
                "empty": [False, False],
                "repetition": [0.0, 0.9],
                "aborted": [],
                "num_turns": [1, 3],
                "advantage": [0.5, -0.5],
                "groups": ["uid-1"],
                "group": [0, 0],
                "data_sources": ["gsm8k"],
                "data_source": [0, -1],
                "scores": {"acc": [1.0, 0.0]},
                "dropped_scores": ["pred"],
            }
        ],
    },
    "SampleTextBatch": {
        "run_id": "run-1",
        "attempt": 0,
        "rank": 3,
        "tags": {},
        "hostname": "node-7",
        "pid": 4242,
        "producer_id": "p-1.samples",
        "entries": [
            {
                "seq": 1,
                "timestamp_ns": 1_700_000_000_000_000_000,
                "step": 12,
                "split": "train",
                "sample_index": 1,
                "group": "uid-1",
                "data_source": None,
                "reward": 0.0,
                "chosen": ["worst", "truncated"],
                "prompt": "What is 2 + 2?",
                "prompt_chars": 14,
                "response_head": "Let me think",
                "response_tail": "think think",
                "response_chars": 40000,
                "response_digest": "ab" * 16,
                "ground_truth": "4",
            }
        ],
    },
    "ActionVerdict": {
        "verdict_id": "v-1",
        "command_id": "c-1",
        "run_id": "run-1",
        "attempt": 0,
        "stage": "rollout",
        "rule_id": "unstable-reward",
        "rule_version": "0a1b2c3d4e5f",
        "verdict": "ineffective",
        "expectation": "var of reward_mean over 5 steps (mean over ranks) <= 0.5 within 10 steps",
        "issued_step": 21,
        "applied_at_step": 22,
        "decided_at_step": 32,
        "value": 0.73,
        "evidence": {"step_27": 0.9, "step_32": 0.73},
        "reason": "not met in steps 23..32",
        "emitted_ns": 7,
    },
}


@pytest.mark.parametrize("name", RECORD_NAMES)
def test_round_trip_each_record(name: str) -> None:
    codec = default_codec()
    data = codec.encode(name, SAMPLES[name])
    assert data[:2] == MAGIC
    assert data[2:10] == codec.registry.latest(name).fingerprint
    assert codec.decode(data, expect=name) == SAMPLES[name]


finite_or_not = st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=300, deadline=None)
@given(
    metrics=st.dictionaries(st.text(max_size=20), finite_or_not, max_size=8),
    step=st.integers(min_value=0, max_value=2**62),
    run_id=st.text(min_size=1, max_size=40),
)
def test_trainer_event_round_trip_any_values(
    metrics: dict[str, float], step: int, run_id: str
) -> None:
    codec = default_codec()
    event = trainer_event(metrics=metrics, step=step, run_id=run_id)
    decoded = codec.decode_event(codec.encode("TrainerEvent", event))
    assert decoded["step"] == step and decoded["run_id"] == run_id
    assert decoded["metrics"].keys() == metrics.keys()
    for key, value in metrics.items():
        got = decoded["metrics"][key]
        assert (math.isnan(got) and math.isnan(value)) or got == value


def encoded_event() -> bytes:
    return default_codec().encode("TrainerEvent", trainer_event())


@pytest.mark.parametrize(
    ("data", "failure"),
    [
        (b"", DecodeFailure.TRUNCATED),
        (b"\xc3", DecodeFailure.TRUNCATED),
        (b'{"json": true}', DecodeFailure.GARBAGE),
        (b"hello", DecodeFailure.GARBAGE),
        (MAGIC + b"\x00" * 8 + b"\x02", DecodeFailure.UNKNOWN_FINGERPRINT),
    ],
    ids=["empty", "one-byte", "json", "short-garbage", "unknown-fingerprint"],
)
def test_bad_bytes_raise_one_typed_error(data: bytes, failure: DecodeFailure) -> None:
    with pytest.raises(DecodeError) as info:
        default_codec().decode(data)
    assert info.value.failure is failure
    assert failure.value in str(info.value)


def test_truncated_header_and_body() -> None:
    data = encoded_event()
    for cut in (5, 9, 10, len(data) - 1, len(data) // 2):
        with pytest.raises(DecodeError) as info:
            default_codec().decode(data[:cut])
        assert info.value.failure is DecodeFailure.TRUNCATED, cut


def test_trailing_bytes_are_garbage() -> None:
    with pytest.raises(DecodeError) as info:
        default_codec().decode(encoded_event() + b"\x00\x01")
    assert info.value.failure is DecodeFailure.GARBAGE


def test_wrong_record_type_is_refused() -> None:
    with pytest.raises(DecodeError) as info:
        default_codec().decode_summary(encoded_event())
    assert info.value.failure is DecodeFailure.WRONG_RECORD


def test_fingerprint_matches_the_avro_specification() -> None:
    """CRC-64-AVRO as the Avro spec defines it, little-endian in the header."""
    from fastavro.schema import to_parsing_canonical_form

    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    for name in RECORD_NAMES:
        schema = default_codec().registry.latest(name)
        fp = empty
        for byte in to_parsing_canonical_form(schema.parsed).encode():
            fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
        assert schema.fingerprint == fp.to_bytes(8, "little")


def write_with(schema: Any, record: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    schemaless_writer(buffer, schema.parsed, record)
    return bytes(MAGIC + schema.fingerprint + buffer.getvalue())


def fields_of(schema: Any) -> list[str]:
    return [f["name"] for f in schema.parsed["fields"]]


@pytest.mark.parametrize("name", RECORD_NAMES)
def test_every_released_version_decodes_with_the_newest(name: str) -> None:
    """Data written with each version kept in schemas/avro reads back with the newest reader."""
    codec = default_codec()
    versions = codec.registry.versions(name)
    assert versions, f"no released version of {name}"
    for version in versions:
        record = {k: v for k, v in SAMPLES[name].items() if k in fields_of(version)}
        decoded = codec.decode(write_with(version, record), expect=name)
        for key, value in record.items():
            assert decoded[key] == value, (version.path, key)
        assert set(decoded) == set(fields_of(codec.registry.latest(name)))


def test_an_added_field_resolves_to_its_default(tmp_path: Path) -> None:
    """Schema evolution: v1 data read by a v2 reader gets v2's default for the new field."""
    for source in _packaged_schema_dir().glob("*.avsc"):
        shutil.copy(source, tmp_path / source.name)
    v1 = json.loads((tmp_path / "TrainerEvent.v1.avsc").read_text())
    v2 = {**v1, "fields": [*v1["fields"], {"name": "gpu", "type": "string", "default": "?"}]}
    (tmp_path / "TrainerEvent.v2.avsc").write_text(json.dumps(v2))
    codec = Codec(SchemaRegistry(tmp_path))
    old = codec.registry.versions("TrainerEvent")[0]
    decoded = codec.decode_event(write_with(old, trainer_event()))
    assert decoded["gpu"] == "?"  # type: ignore[typeddict-item]
    assert decoded["metrics"] == trainer_event()["metrics"]
    assert (
        codec.decode_event(codec.encode("TrainerEvent", {**trainer_event(), "gpu": "a100"}))[
            "gpu"  # type: ignore[typeddict-item]
        ]
        == "a100"
    )


def test_a_log_batch_reads_as_its_records_and_a_single_record_as_one() -> None:
    codec = default_codec()
    batch = SAMPLES["LogBatch"]
    records = codec.decode_logs(codec.encode("LogBatch", batch))
    assert [r["seq"] for r in records] == [100, 101]
    for record, entry in zip(records, batch["entries"], strict=True):
        assert record == {**{k: v for k, v in batch.items() if k != "entries"}, **entry}
    assert codec.decode_logs(codec.encode("LogRecord", SAMPLES["LogRecord"])) == [
        SAMPLES["LogRecord"]
    ]
    with pytest.raises(DecodeError) as info:
        codec.decode_logs(encoded_event())
    assert info.value.failure is DecodeFailure.WRONG_RECORD
