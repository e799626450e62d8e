"""One step's rollout samples from the archive: the reward histogram and the chosen texts.

What ``rlpulse show RUN --step N --samples`` prints and the run page's step panel draws:
the step's samples (every rank, training and validation apart), the histogram of their
rewards over all of them, the shares the step's statistics name, and the chosen samples'
texts sorted by reward, each with its numbers (scores, length, truncated, repetition) and
why it was chosen. A sample present twice (an archived copy and a live one, or one sent
again) counts once: by its producer, seq and index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Final

import duckdb

from rlpulse.archive.catalog import run_sql
from rlpulse.archive.tables import run_partition

__all__ = ["BINS", "StepSamples", "step_samples"]

BINS: Final = 30
"""Bars of the reward histogram."""

_ONCE: Final = "QUALIFY row_number() OVER (PARTITION BY producer_id, seq, sample_index) = 1"


@dataclass
class StepSamples:
    """One split of one step's samples: the reward histogram, the shares, the chosen texts."""

    split: str
    count: int
    edges: list[float] = field(default_factory=list)
    """``BINS + 1`` bar edges of the histogram (empty without finite rewards)."""
    counts: list[int] = field(default_factory=list)
    shares: dict[str, float] = field(default_factory=dict)
    """The shares of the step's samples that were truncated, empty, aborted."""
    texts: list[dict[str, Any]] = field(default_factory=list)
    """The chosen samples, best reward first: their texts, numbers and why chosen."""


def step_samples(con: duckdb.DuckDBPyConnection, run_id: str, step: int) -> list[StepSamples]:
    """The samples of ``step`` of ``run_id``, one :class:`StepSamples` per split it has."""
    run = [run_partition(run_id), run_id, step]
    where = "run = ? AND run_id = ? AND step = ?"
    _, rows = run_sql(
        con,
        "SELECT split, reward, truncated, empty, aborted FROM ("
        f"SELECT * FROM samples WHERE {where} {_ONCE})",
        run,
    )
    by_split: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        by_split.setdefault(row[0], []).append(row)
    columns, text_rows = run_sql(
        con,
        "SELECT t.split, t.rank, t.sample_index, t.reward, t.chosen, t.group, t.data_source, "
        "t.prompt, t.prompt_chars, t.response_head, t.response_tail, t.response_chars, "
        "t.response_digest, t.ground_truth, s.scores, s.truncated, s.response_length, "
        "s.repetition, s.advantage FROM ("
        f"SELECT * FROM sample_texts WHERE {where} QUALIFY row_number() OVER "
        "(PARTITION BY producer_id, seq) = 1) t LEFT JOIN ("
        f"SELECT * FROM samples WHERE {where} {_ONCE}) s "
        "ON s.producer_id = t.producer_id AND s.split = t.split AND s.sample_index = "
        "t.sample_index ORDER BY t.reward DESC NULLS LAST, t.rank, t.sample_index",
        run * 2,
    )
    texts: dict[str, list[dict[str, Any]]] = {}
    for row in text_rows:
        text = dict(zip(columns, row, strict=True))
        texts.setdefault(text["split"], []).append(text)
    out = []
    for split in sorted(set(by_split) | set(texts), key=lambda s: (s != "train", s)):
        samples = by_split.get(split, [])
        part = StepSamples(split, len(samples), texts=texts.get(split, []))
        rewards = [r[1] for r in samples if r[1] is not None and math.isfinite(r[1])]
        part.edges, part.counts = histogram(rewards)
        if samples:
            part.shares = {
                name: sum(bool(r[index]) for r in samples) / len(samples)
                for index, name in ((2, "truncated"), (3, "empty"), (4, "aborted"))
            }
        out.append(part)
    return out


def histogram(values: list[float], bins: int = BINS) -> tuple[list[float], list[int]]:
    """Equal-width bars over ``values``' range (one bar when they are all equal)."""
    if not values:
        return [], []
    low, high = min(values), max(values)
    if high == low:
        return [low - 0.5, high + 0.5], [len(values)]
    width = (high - low) / bins
    counts = [0] * bins
    for value in values:
        counts[min(bins - 1, int((value - low) / width))] += 1
    return [low + width * index for index in range(bins + 1)], counts
