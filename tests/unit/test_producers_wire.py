"""The hot-path TrainerEvent encoder writes exactly what the codec writes (no broker)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpulse.producers import InvalidFieldError
from rlpulse.producers.encoding.events import EventEncoder, metric_value, zigzag
from rlpulse.producers.encoding.fields import EventFields, RecordSource
from rlpulse.producers.integrations.metrics import numeric_metrics
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.jsonl import RankLogWriter
from rlpulse.schemas.records import EventKind
from rlpulse.schemas.validation import metric_number
from rlpulse.settings import EventLimits
from tests.schema_change import codec_with_new_field

LONGS = st.integers(-(2**63), 2**63 - 1)
INTS = st.integers(-(2**31), 2**31 - 1)
TEXT = st.text(max_size=20)
KINDS: st.SearchStrategy[EventKind] = st.sampled_from(["metrics", "log", "run_start", "run_end"])


def source(**overrides: object) -> RecordSource:
    fields: dict[str, object] = {
        "run_id": "run-a",
        "attempt": 0,
        "rank": 0,
        "tags": {},
        "hostname": "host",
        "host_ip": "10.0.0.1",
        "pid": 42,
        "producer_id": "p" * 32,
    }
    fields.update(overrides)
    return RecordSource(**fields)  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    src=st.builds(
        RecordSource,
        run_id=TEXT.filter(bool),
        attempt=st.integers(0, 2**31 - 1),
        rank=st.integers(0, 2**31 - 1),
        tags=st.dictionaries(TEXT, TEXT, max_size=3),
        hostname=TEXT,
        host_ip=TEXT,
        pid=INTS,
        producer_id=TEXT,
    ),
    kind=KINDS,
    step=LONGS,
    stage=TEXT.filter(bool),
    world_size=st.integers(1, 2**31 - 1),
    metrics=st.dictionaries(
        TEXT, st.floats(allow_nan=False) | st.integers(-(2**53), 2**53), max_size=25
    ),
    timestamp_ns=LONGS,
    seq=LONGS,
    level=st.none() | TEXT,
    message=st.none() | TEXT,
    policy_version=st.none() | LONGS,
    trace_id=st.none() | TEXT,
)
def test_encoder_matches_the_codec_byte_for_byte(
    src: RecordSource,
    kind: EventKind,
    step: int,
    stage: str,
    world_size: int,
    metrics: dict[str, float],
    timestamp_ns: int,
    seq: int,
    level: str | None,
    message: str | None,
    policy_version: int | None,
    trace_id: str | None,
) -> None:
    codec = default_codec()
    encoder = EventEncoder(src, codec, EventLimits())
    assert encoder.fast
    event = EventFields(
        kind, step, stage, world_size, metrics, level, message, policy_version, trace_id
    )
    encoded = encoder.encode(event, timestamp_ns, seq)
    expected = codec.encode("TrainerEvent", encoder.record(event, timestamp_ns, seq))
    assert encoded == expected
    assert codec.decode_event(encoded)["metrics"] == {k: float(v) for k, v in metrics.items()}


def test_non_finite_values_survive() -> None:
    codec = default_codec()
    encoded = EventEncoder(source(), codec, EventLimits()).encode(
        EventFields("metrics", 1, "rollout", 1, {"nan": math.nan, "inf": -math.inf}), 0, 0
    )
    metrics = codec.decode_event(encoded)["metrics"]
    assert math.isnan(metrics["nan"]) and metrics["inf"] == -math.inf


def test_a_changed_schema_falls_back_to_the_codec_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gpu = {"name": "gpu", "type": ["null", "string"], "default": None}
    codec = codec_with_new_field(tmp_path / "avro", "TrainerEvent", gpu)
    encoder = EventEncoder(source(tags={"a": "b"}), codec, EventLimits())
    assert not encoder.fast
    assert (
        "TrainerEvent v2" in caplog.text and "EventEncoder's layout does not write" in caplog.text
    )
    encoded = encoder.encode(EventFields("log", 3, "actor", 2, {"x": 1}, "INFO", "m"), 5, 6)
    event = codec.decode_event(encoded)
    assert (event["kind"], event["step"], event["metrics"], event["tags"]) == (
        "log",
        3,
        {"x": 1.0},
        {"a": "b"},
    )


class _Scalar:
    """A one-number object, like a numpy scalar or a one-element tensor."""

    def __float__(self) -> float:
        return 2.5


@settings(max_examples=50, deadline=None)
@given(
    names=st.lists(st.lists(TEXT, min_size=1, max_size=6, unique=True), min_size=1, max_size=4),
    picks=st.lists(st.tuples(st.integers(0, 3), st.floats() | st.integers(-(2**53), 2**53))),
)
def test_one_encoder_matches_the_codec_as_metric_names_repeat_and_change(
    names: list[list[str]], picks: list[tuple[int, float]]
) -> None:
    codec = default_codec()
    encoder = EventEncoder(source(), codec, EventLimits())
    for seq, (which, value) in enumerate(picks):
        metrics = {name: value for name in names[which % len(names)]}
        event = EventFields("metrics", seq, "trainer", 8, metrics)
        timestamp_ns = 1_700_000_000_000_000_000 + seq
        expected = codec.encode("TrainerEvent", encoder.record(event, timestamp_ns, seq))
        assert encoder.encode(event, timestamp_ns, seq) == expected


def test_known_metric_names_still_check_each_value() -> None:
    codec = default_codec()
    encoder = EventEncoder(source(), codec, EventLimits())
    encoder.encode(EventFields("metrics", 1, "s", 1, {"ok": 1.0, "bad": 2.0}), 0, 0)
    encoded = encoder.encode(EventFields("metrics", 2, "s", 1, {"ok": 1, "bad": _Scalar()}), 0, 1)  # type: ignore[dict-item]
    assert codec.decode_event(encoded)["metrics"] == {"ok": 1.0, "bad": 2.5}
    with pytest.raises(InvalidFieldError, match=r"metrics\['bad'\]"):
        encoder.encode(EventFields("metrics", 3, "s", 1, {"ok": 1.0, "bad": "2.0"}), 0, 2)  # type: ignore[dict-item]


def test_more_sets_of_names_than_the_encoder_remembers_encode_the_same() -> None:
    codec = default_codec()
    encoder = EventEncoder(source(), codec, EventLimits())
    for seq in range(200):
        event = EventFields("metrics", seq, f"stage{seq}", 1, {f"m{seq}": 0.5, "loss": seq})
        expected = codec.encode("TrainerEvent", encoder.record(event, seq, seq))
        assert encoder.encode(event, seq, seq) == expected


@pytest.mark.parametrize("value", ["1.0", b"1", None, [1.0], object()])
def test_bad_metric_value_names_its_key(value: object) -> None:
    encoder = EventEncoder(source(), default_codec(), EventLimits())
    with pytest.raises(InvalidFieldError, match=r"metrics\['bad'\]"):
        encoder.encode(EventFields("metrics", 1, "s", 1, {"ok": 1.0, "bad": value}), 0, 0)  # type: ignore[dict-item]


def test_bad_metric_key_and_mapping_are_refused() -> None:
    encoder = EventEncoder(source(), default_codec(), EventLimits())
    with pytest.raises(InvalidFieldError, match="str metric names"):
        encoder.encode(EventFields("metrics", 1, "s", 1, {3: 1.0}), 0, 0)  # type: ignore[dict-item]
    with pytest.raises(InvalidFieldError, match="mapping"):
        encoder.encode(EventFields("metrics", 1, "s", 1, [("a", 1.0)]), 0, 0)  # type: ignore[arg-type]


@pytest.mark.parametrize("number", [0, 1, -1, 63, -64, 64, -65, 2**31, -(2**63), 2**63 - 1])
def test_zigzag_matches_avro(number: int) -> None:
    zz = (number << 1) ^ (number >> 63)
    expected = bytearray()
    while True:
        byte = zz & 0x7F
        zz >>= 7
        if zz:
            expected.append(byte | 0x80)
        else:
            expected.append(byte)
            break
    assert zigzag(number) == bytes(expected)


NUMBERS_AND_NOT = [
    (1, 1.0),
    (2.5, 2.5),
    (True, 1.0),
    (numpy.float32(0.5), 0.5),
    (numpy.int64(7), 7.0),
    (numpy.array(3.0), 3.0),
    (math.inf, math.inf),
    ("1.5", None),
    (b"1", None),
    (bytearray(b"1"), None),
    (None, None),
    ([1.0], None),
    (numpy.array([1.0, 2.0]), None),
    (object(), None),
]


@pytest.mark.parametrize(("value", "number"), NUMBERS_AND_NOT)
def test_every_metrics_writer_takes_the_same_numbers(
    value: object, number: float | None, tmp_path: Path
) -> None:
    """``log()``, the logging handler, the integrations and the per-rank file: one rule."""
    assert metric_number(value) == number
    if number is None:
        with pytest.raises(InvalidFieldError):
            metric_value("m", value)
        with RankLogWriter(tmp_path, "c", 0) as writer, pytest.raises(ValueError, match="'m'"):
            writer.write(1, "s", {"m": value})  # type: ignore[dict-item]
    else:
        assert metric_value("m", value) == number
    assert numeric_metrics({"m": value}) == ({} if number is None else {"m": number})
