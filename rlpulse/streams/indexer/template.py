"""The index templates ``rlpulse index`` installs: the mappings of the daily indices.

Identifiers (run, stage, level, host, trace, producer) are ``keyword`` so that a filter on
them is exact; numbers are numbers so that ``step:13`` and ranges work; ``message`` and
``exception`` are ``text`` for full-text search, and so are a chosen sample's prompt,
response head and tail and ground truth. Other string fields (a record's ``extra=``
fields, tags) become ``keyword`` as they appear. Composable templates (``_index_template``):
OpenSearch 1.0+ and Elasticsearch 7.8+; Fluent Bit's output (compose/fluent-bit/) writes the
same indices and so gets the same mappings.
"""

from __future__ import annotations

from typing import Any, Final

from rlpulse.streams.indexer.documents import LOGS, SAMPLE_TEXTS, STEPS, IndexNames

__all__ = ["TEMPLATE_VERSION", "templates"]

TEMPLATE_VERSION: Final = 2
"""Bumped when a mapping changes; a cluster holding an older version gets the new one
(2: the sample texts' template)."""

_KEYWORD: Final = {"type": "keyword", "ignore_above": 1024}
_STRINGS_AS_KEYWORDS: Final = [
    {"strings": {"match_mapping_type": "string", "mapping": _KEYWORD}},
]
_LOG_FIELDS: Final[dict[str, Any]] = {
    "@timestamp": {"type": "date", "format": "strict_date_optional_time||epoch_millis"},
    "timestamp_ns": {"type": "long"},
    "run_id": _KEYWORD,
    "attempt": {"type": "integer"},
    "step": {"type": "long"},
    "stage": _KEYWORD,
    "rank": {"type": "integer"},
    "level": _KEYWORD,
    "levelno": {"type": "integer"},
    "logger": _KEYWORD,
    "message": {"type": "text"},
    "exception": {"type": "text"},
    "trace_id": _KEYWORD,
    "fields": {"type": "object", "dynamic": True},
    "sample_rate": {"type": "double"},
    "sampled_out": {"type": "object", "dynamic": True},
    "tags": {"type": "object", "dynamic": True},
    "hostname": _KEYWORD,
    "host_ip": _KEYWORD,
    "pid": {"type": "integer"},
    "producer_id": _KEYWORD,
    "seq": {"type": "long"},
}
_STATISTIC: Final = {"type": "double"}
_STEP_FIELDS: Final[dict[str, Any]] = {
    "@timestamp": {"type": "date", "format": "strict_date_optional_time||epoch_millis"},
    "summary_id": _KEYWORD,
    "run_id": _KEYWORD,
    "attempt": {"type": "integer"},
    "stage": _KEYWORD,
    "step": {"type": "long"},
    "revision": {"type": "integer"},
    "world_size": {"type": "integer"},
    "ranks_reported": {"type": "integer"},
    "missing_ranks": {"type": "integer"},
    "metrics": {
        "type": "nested",
        "properties": {
            "name": _KEYWORD,
            "count": {"type": "integer"},
            **{name: _STATISTIC for name in ("sum", "mean", "std", "min", "max")},
            "min_rank": {"type": "integer"},
            "max_rank": {"type": "integer"},
            "non_finite": {"type": "integer"},
        },
    },
    "tags": {"type": "object", "dynamic": True},
    "last_rank": {"type": "integer"},
    "last_rank_lag_ns": {"type": "long"},
    "stragglers": {"type": "integer"},
    "closed_by": _KEYWORD,
    "first_event_ns": {"type": "long"},
    "last_event_ns": {"type": "long"},
    "emitted_ns": {"type": "long"},
}


_SAMPLE_TEXT_FIELDS: Final[dict[str, Any]] = {
    "@timestamp": {"type": "date", "format": "strict_date_optional_time||epoch_millis"},
    "timestamp_ns": {"type": "long"},
    "run_id": _KEYWORD,
    "attempt": {"type": "integer"},
    "rank": {"type": "integer"},
    "tags": {"type": "object", "dynamic": True},
    "hostname": _KEYWORD,
    "pid": {"type": "integer"},
    "producer_id": _KEYWORD,
    "seq": {"type": "long"},
    "step": {"type": "long"},
    "split": _KEYWORD,
    "sample_index": {"type": "long"},
    "group": _KEYWORD,
    "data_source": _KEYWORD,
    "reward": {"type": "double"},
    "chosen": _KEYWORD,
    "prompt": {"type": "text"},
    "prompt_chars": {"type": "long"},
    "response_head": {"type": "text"},
    "response_tail": {"type": "text"},
    "response_chars": {"type": "long"},
    "response_digest": _KEYWORD,
    "ground_truth": {"type": "text"},
}


def templates(names: IndexNames, shards: int, replicas: int | None) -> dict[str, dict[str, Any]]:
    """Each template's name and body (``PUT _index_template/<name>``)."""
    settings: dict[str, Any] = {"number_of_shards": shards}
    if replicas is not None:
        settings["number_of_replicas"] = replicas
    bodies = {}
    kinds = ((LOGS, _LOG_FIELDS), (STEPS, _STEP_FIELDS), (SAMPLE_TEXTS, _SAMPLE_TEXT_FIELDS))
    for kind, fields in kinds:
        bodies[f"{names.prefix}-{kind}"] = {
            "index_patterns": [names.pattern(kind)],
            "version": TEMPLATE_VERSION,
            "priority": 100,
            "template": {
                "settings": settings,
                "mappings": {
                    "dynamic_templates": _STRINGS_AS_KEYWORDS,
                    "properties": fields,
                },
            },
            "_meta": {"written_by": "rlpulse index"},
        }
    return bodies
