"""The fast LogEntry encoder, and the batches built from its entries, are what the codec writes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlpulse.producers.encoding.events import zigzag
from rlpulse.producers.encoding.fields import LogFields, RecordSource
from rlpulse.producers.encoding.logs import (
    LogEncoder,
    TimestampVarint,
    fit_text,
)
from rlpulse.schemas import default_codec
from tests.schema_change import codec_with_new_field

SHARED = frozenset(
    ("run_id", "attempt", "rank", "tags", "hostname", "host_ip", "pid", "producer_id")
)
texts = st.text(max_size=40)
names = st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3)


@given(
    step=st.integers(-(2**63), 2**63 - 1),
    stage=texts,
    level=st.sampled_from(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", "CUSTOM"]),
    levelno=st.integers(0, 100),
    message=st.text(max_size=300),
    exception=st.none() | texts,
    trace_id=st.none() | texts,
    fields=names,
    rate=st.floats(min_value=0.0001, max_value=1.0),
    sampled_out=st.dictionaries(st.text(max_size=8), st.integers(0, 2**40), max_size=3),
    tags=names,
)
def test_byte_identical_to_the_codec(
    step: int, stage: str, level: str, levelno: int, message: str, exception: str | None,
    trace_id: str | None, fields: dict[str, str], rate: float, sampled_out: dict[str, int],
    tags: dict[str, str],
) -> None:  # fmt: skip
    codec = default_codec()
    source = RecordSource("run-1", 2, 3, tags, "node-7", "10.0.0.7", 4242, "p-1")
    encoder = LogEncoder(source, codec, max_text_bytes=10_000)
    line = LogFields(
        step, stage, level, levelno, "trainer.x", message, exception, trace_id, fields, rate,
        sampled_out,
    )  # fmt: skip
    timestamp_ns, seq = 1_700_000_000_000_000_000, 9
    entries = [encoder.entry(line, timestamp_ns, seq), encoder.entry(line, timestamp_ns, seq)]
    record = encoder.record(line, timestamp_ns, seq)
    shared = {k: v for k, v in record.items() if k in SHARED}
    entry = {k: v for k, v in record.items() if k not in SHARED}
    batch = encoder.batch(entries)
    assert batch == codec.encode("LogBatch", {**shared, "entries": [entry, entry]})
    assert codec.decode_logs(batch) == [record, record]


def test_the_fast_layout_writes_the_shipped_schema() -> None:
    source = RecordSource("run-1", 0, 0, {}, "node-7", "10.0.0.7", 4242, "p-1")
    assert LogEncoder(source, default_codec(), max_text_bytes=10_000).fast


def test_a_changed_schema_is_written_by_fastavro_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    thread = {"name": "thread", "type": "string", "default": "main"}
    codec = codec_with_new_field(tmp_path / "avro", "LogBatch", thread, inside="entries")
    source = RecordSource("run-1", 0, 0, {"a": "b"}, "node-7", "10.0.0.7", 4242, "p-1")
    encoder = LogEncoder(source, codec, max_text_bytes=10_000)
    assert not encoder.fast
    assert "LogBatch v2" in caplog.text and "LogEncoder's layout does not write" in caplog.text
    line = LogFields(5, "trainer", "INFO", 20, "trainer", "still readable")
    (record,) = codec.decode_logs(encoder.batch([encoder.entry(line, 7, 1)]))
    assert (record["message"], record["step"], record["thread"], record["tags"]) == (  # type: ignore[typeddict-item]
        "still readable", 5, "main", {"a": "b"},
    )  # fmt: skip


def test_long_text_is_cut_with_a_note_not_refused() -> None:
    assert fit_text("short", 100) == "short"
    cut = fit_text("é" * 1000, 100)
    assert len(cut.encode()) <= 100 and cut.endswith("bytes cut]")


@given(st.lists(st.integers(0, 2**63 - 1), max_size=50), st.integers(1_700_000_000 * 10**9, 2**62))
def test_timestamp_varints_are_zigzag(numbers: list[int], base: int) -> None:
    varint = TimestampVarint()
    for number in [*numbers, base, base + 1, base + 2**21, base - 5, base]:
        assert varint(number) == zigzag(number)
