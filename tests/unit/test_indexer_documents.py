"""The indexer's pure parts: documents, their ids and daily indices, reading _bulk answers."""

from __future__ import annotations

import datetime
import json
from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st

from rlpulse.schemas.codec import default_codec, log_records
from rlpulse.schemas.records import LogBatch, LogRecord, StepSummary
from rlpulse.streams.indexer.bulk import read_bulk_response
from rlpulse.streams.indexer.documents import IndexNames, log_batch_documents, summary_document
from rlpulse.streams.indexer.template import templates

NAMES = IndexNames("rlp")
MIDNIGHT_NS = int(datetime.datetime(2026, 12, 3, tzinfo=datetime.UTC).timestamp()) * 10**9


def record(**changes: Any) -> LogRecord:
    fields: dict[str, Any] = {
        "run_id": "run-1", "attempt": 0, "step": 7, "stage": "train", "rank": 3,
        "level": "ERROR", "levelno": 40, "logger": "trainer", "message": "CUDA out of memory",
        "exception": "Traceback ...", "trace_id": "t-1", "fields": {"request": "r9"},
        "sample_rate": 1.0, "sampled_out": {}, "tags": {"team": "rl"},
        "timestamp_ns": MIDNIGHT_NS - 1, "hostname": "node-a", "host_ip": "10.0.0.1",
        "pid": 4242, "producer_id": "p-1", "seq": 12,
    }  # fmt: skip
    fields.update(changes)
    return cast(LogRecord, fields)


SHARED = ("run_id", "attempt", "rank", "tags", "hostname", "host_ip", "pid", "producer_id")


def batch_of(*records: LogRecord) -> LogBatch:
    """The LogBatch a trainer sends for ``records`` (one producer's: shared fields alike)."""
    first: dict[str, Any] = dict(records[0])
    entries = [{k: v for k, v in r.items() if k not in SHARED} for r in records]
    return cast(LogBatch, {**{k: first[k] for k in SHARED}, "entries": entries})


def test_a_log_record_is_a_document_named_by_its_producer_and_seq_in_its_own_day() -> None:
    late, early = record(seq=12), record(seq=13, timestamp_ns=MIDNIGHT_NS)
    first, second = log_batch_documents(NAMES, batch_of(late, early))
    assert (first.id, first.run_id) == ("p-1:12", "run-1")
    assert first.index == "rlp-logs-2026.12.02"  # the record's day, not today's
    assert second.index == "rlp-logs-2026.12.03"
    body = json.loads(first.body)
    assert body == {**late, "@timestamp": (MIDNIGHT_NS - 1) // 10**6}
    action, source, end = first.bulk_lines().split(b"\n")
    assert json.loads(action) == {"index": {"_index": "rlp-logs-2026.12.02", "_id": "p-1:12"}}
    assert json.loads(source) == body and end == b""


def test_an_earlier_release_s_single_record_message_makes_the_same_document() -> None:
    codec = default_codec()
    single = codec.decode_log_batch(codec.encode("LogRecord", record()))
    assert log_records(single) == [record()]
    assert log_batch_documents(NAMES, single) == log_batch_documents(NAMES, batch_of(record()))


@given(st.text(), st.text(), st.integers(min_value=0, max_value=2**62))
def test_any_text_makes_valid_json_and_the_same_record_the_same_document(
    message: str, producer: str, seq: int
) -> None:
    made = record(message=message, producer_id=producer, seq=seq)
    (first,) = log_batch_documents(IndexNames("rlp"), batch_of(made))
    (again,) = log_batch_documents(IndexNames("rlp"), batch_of(made))
    assert first == again
    assert json.loads(first.body)["message"] == message
    action = json.loads(first.bulk_lines().split(b"\n")[0])
    assert action["index"]["_id"] == f"{producer}:{seq}"


def test_a_summary_lists_its_metrics_and_indexes_non_finite_statistics_as_absent() -> None:
    stats = {
        "count": 4, "sum": float("nan"), "mean": float("inf"), "std": 0.0, "min": 1.0,
        "max": 2.0, "min_rank": 0, "max_rank": 3, "non_finite": 1,
    }  # fmt: skip
    summary = cast(
        StepSummary,
        {
            "summary_id": "s-1", "run_id": "run-1", "step": 5, "revision": 1,
            "emitted_ns": MIDNIGHT_NS, "metrics": {"reward_mean": stats},
        },
    )  # fmt: skip
    document = summary_document(NAMES, summary)
    assert (document.id, document.index) == ("s-1", "rlp-steps-2026.12.03")
    body = json.loads(document.body)
    assert body["metrics"] == [{**stats, "name": "reward_mean", "sum": None, "mean": None}]


def test_a_bulk_answer_sorts_documents_into_landed_retried_and_refused() -> None:
    response = {
        "errors": True,
        "items": [
            {"index": {"status": 201, "result": "created"}},
            {"index": {"status": 200, "result": "updated"}},
            {"index": {"status": 429, "error": {"type": "es_rejected_execution_exception"}}},
            {
                "index": {
                    "status": 400,
                    "error": {
                        "type": "mapper_parsing_exception",
                        "reason": "failed to parse field [step]",
                        "caused_by": {"type": "number_format_exception", "reason": "x"},
                    },
                }
            },
            {"index": {"status": 503, "error": {"type": "unavailable_shards_exception"}}},
        ],
    }
    outcome = read_bulk_response(response, [10, 11, 12, 13, 14, 15])
    assert (outcome.created, outcome.updated) == (1, 1)
    assert outcome.retry == [12, 14, 15]  # 15: no answer for it, so it is sent again
    assert outcome.rejected == [
        (
            13,
            "400 mapper_parsing_exception: failed to parse field [step] "
            "(caused by number_format_exception: x)",
        )
    ]


def test_templates_cover_the_daily_indices_with_keywords_for_filters() -> None:
    bodies = templates(NAMES, shards=2, replicas=None)
    logs, steps = bodies["rlp-logs"], bodies["rlp-steps"]
    assert logs["index_patterns"] == ["rlp-logs-*"] and steps["index_patterns"] == ["rlp-steps-*"]
    properties = logs["template"]["mappings"]["properties"]
    assert {properties[name]["type"] for name in ("run_id", "level", "hostname", "trace_id")} == {
        "keyword"
    }
    assert properties["step"]["type"] == "long" and properties["message"]["type"] == "text"
    assert logs["template"]["settings"] == {"number_of_shards": 2}
    assert templates(NAMES, 1, 0)["rlp-logs"]["template"]["settings"]["number_of_replicas"] == 0
    assert set(properties) - {"@timestamp"} == set(LogRecord.__annotations__)
    step_fields = steps["template"]["mappings"]["properties"]
    assert set(step_fields) - {"@timestamp"} == set(StepSummary.__annotations__)
