"""Rollout samples without a broker: the columns, the encoding, the statistics, the choice."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpulse.producers.caller.samples import (
    RawText,
    choose_texts,
    columns_from_mappings,
    cut,
    response_identity,
    step_statistics,
    text_entry,
    text_repetition,
    token_repetition,
)
from rlpulse.producers.encoding.events import zigzag
from rlpulse.producers.encoding.fields import RecordSource
from rlpulse.producers.encoding.logs import batch_body
from rlpulse.producers.encoding.samples import (
    SampleColumns,
    SampleEncoder,
    chunk_record,
    varints,
)
from rlpulse.schemas.codec import default_codec

SOURCE = RecordSource("run-s", 2, 3, {"team": "rl"}, "node-1", "", 4242, "p-1.samples")


def encoder() -> SampleEncoder:
    made = SampleEncoder(SOURCE, default_codec())
    assert made.fast
    return made


def columns_of(count: int, seed: int = 0, scores: int = 2) -> SampleColumns:
    rng = np.random.default_rng(seed)
    return SampleColumns(
        reward=rng.normal(size=count),
        prompt_length=rng.integers(1, 2000, count),
        response_length=rng.integers(0, 8000, count),
        truncated=rng.random(count) < 0.2,
        empty=rng.random(count) < 0.05,
        repetition=rng.random(count),
        advantage=rng.normal(size=count),
        groups=[f"uid-{g}" for g in range(count // 16 + 1)],
        group=np.arange(count, dtype=np.int64) // 16,
        data_sources=["gsm8k", "math"],
        data_source=(np.arange(count) % 2).astype(np.int64),
        scores={f"s{k}": rng.random(count) for k in range(scores)},
    )


@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=50))
def test_varints_are_avro_s_zigzag_varints(numbers: list[int]) -> None:
    assert varints(np.asarray(numbers, dtype=np.int64)) == b"".join(map(zigzag, numbers))


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=1, max_value=60),
    st.integers(min_value=0, max_value=2**31),
    st.integers(min_value=0, max_value=4),
    st.booleans(),
)
def test_a_chunk_is_what_the_codec_writes(
    count: int, seed: int, scores: int, optional: bool
) -> None:
    columns = columns_of(count, seed, scores)
    if optional:
        columns.advantage = columns.group = columns.data_source = None
        columns.aborted = np.ones(count, dtype=np.bool_)
        columns.num_turns = np.full(count, 3, dtype=np.int64)
        columns.dropped_scores = ["pred"]
    made = encoder()
    (chunk,) = made.chunks(columns, 9, "validation", 5, 1_700_000_000_123_456_789, 1 << 20)
    record = chunk_record(columns, 0, count, 9, "validation", 5, 1_700_000_000_123_456_789)
    shared = {
        "run_id": "run-s", "attempt": 2, "rank": 3, "tags": {"team": "rl"},
        "hostname": "node-1", "pid": 4242, "producer_id": "p-1.samples",
    }  # fmt: skip
    wanted = default_codec().encode("SampleBatch", {**shared, "entries": [record]})
    assert made.samples_head + batch_body([chunk]) == wanted


def test_a_step_of_16384_samples_is_split_into_chunks_under_the_batch_limit() -> None:
    columns = columns_of(16_384, scores=8)
    limit = 512 * 1024
    chunks = encoder().chunks(columns, 4, "train", 100, 1, limit)
    assert len(chunks) > 1
    assert all(len(chunk) <= limit // 4 for chunk in chunks)
    samples = default_codec().decode_samples(encoder().samples_head + batch_body(chunks))
    assert [s["sample_index"] for s in samples] == list(range(16_384))
    assert sorted({s["seq"] for s in samples}) == list(range(100, 100 + len(chunks)))
    assert samples[16_383]["group"] == "uid-1023"
    assert samples[16_383]["reward"] == columns.reward[16_383]
    assert samples[5]["data_source"] == "math" and samples[4]["data_source"] == "gsm8k"


def test_a_malformed_sample_is_left_out_with_its_index_and_key() -> None:
    good = {"prompt": "p", "response": "r", "reward": 1.0}
    samples = [
        good,
        {"prompt": "p", "reward": 1.0},
        {"prompt": "p", "response": "r", "reward": "high"},
        {**good, "scores": {"acc": 1.0, "pred": "B"}},
        {**good, "colour": "blue"},
        "not a mapping",
    ]
    columns, texts, _, problems = columns_from_mappings(samples)  # type: ignore[arg-type]
    assert len(columns) == len(texts) == 2
    assert [(p.index, p.key) for p in problems] == [
        (1, "response"),
        (2, "reward"),
        (4, "colour"),
        (5, ""),
    ]
    assert "'reward' must be a number, not 'high'" in str(problems[1])
    assert columns.dropped_scores == ["pred"] and "pred" not in columns.scores
    assert columns.response_length.tolist() == [1, 1]  # characters, where no tokens were given


def test_a_loop_in_the_tail_scores_high_and_ordinary_text_low() -> None:
    rng = np.random.default_rng(1)
    ordinary = rng.integers(0, 50_000, 64)
    loop = np.tile(np.arange(7), 10)[-64:]
    short = np.full(64, -1)
    short[-5:] = [1, 1, 1, 1, 1]  # too short to say
    tails = np.stack([ordinary, loop, short]).astype(np.int64)
    scores = token_repetition(tails, np.array([64, 64, 5]))
    assert scores[0] < 0.05 and scores[1] > 0.85 and scores[2] == 0.0
    text = text_repetition(
        ["The model reasons about the problem step by step and finds x = 4 in the end.",
         "I think " * 60, ""]
    )  # fmt: skip
    assert text[0] < 0.1 and text[1] > 0.9 and text[2] == 0.0


def test_the_step_statistics_over_its_samples() -> None:
    samples = []
    for group in range(4):
        for member in range(4):
            reward = 1.0 if group == 0 else float(member)  # group 0: one reward for all
            response = "same" if group == 1 else f"answer {member}"  # group 1: one response
            samples.append({
                "prompt": f"q{group}", "response": response, "reward": reward,
                "group": f"g{group}", "truncated": member == 3, "data_source": "math",
            })  # fmt: skip
    columns, _, identity, _ = columns_from_mappings(samples)
    stats = step_statistics(columns, identity, 0.5)
    assert stats["samples/count"] == 16
    assert stats["samples/truncated_ratio"] == 0.25
    assert stats["samples/groups"] == 4
    assert stats["samples/same_reward_group_ratio"] == 0.25
    assert stats["samples/distinct_responses_per_group"] == (1 + 4 + 4 + 4) / 4
    assert stats["samples/reward_p50"] == float(np.quantile(columns.reward, 0.5))
    assert stats["samples/math/count"] == 16


def test_texts_are_chosen_for_each_reason_and_each_data_source() -> None:
    columns = columns_of(256)
    columns.data_sources = ["gsm8k", "math", "rare"]
    columns.data_source = np.zeros(256, dtype=np.int64)
    columns.data_source[200] = 2
    columns.repetition = np.zeros(256)
    chosen = choose_texts(columns, 16, 16, 0.5, step=7)
    reasons = [reason for why in chosen.values() for reason in why]
    assert reasons.count("best") == reasons.count("worst") == 4
    assert reasons.count("truncated") == 4 and reasons.count("random") == 4
    assert int(np.argmax(columns.reward)) in chosen
    assert "data_source" in chosen.get(200, []) or 200 in chosen
    group = [i for i, why in chosen.items() if "group" in why]
    assert len(group) == 16 and len({int(columns.group[i]) for i in group}) == 1  # type: ignore[index]
    assert choose_texts(columns, 16, 16, 0.5, step=7) == chosen  # seeded by the step


def test_a_10_mb_response_is_sent_as_its_head_and_tail_with_its_length_and_digest() -> None:
    response = "A" * 5_000_000 + "B" * 5_000_000
    columns, texts, _, _ = columns_from_mappings(
        [{"prompt": "p" * 10_000, "response": response, "reward": 0.0}]
    )
    entry = text_entry(0, ["best"], texts[0], columns, True, 4000, 1000, str.upper)
    assert entry.response_head == "A" * 2000 and entry.response_tail == "B" * 2000
    assert entry.response_chars == 10_000_000
    assert (
        entry.prompt is not None and len(entry.prompt) < 1100 and "characters cut" in entry.prompt
    )
    assert entry.prompt.startswith("P")  # redacted before it is cut
    assert len(entry.response_digest) == 32
    assert cut("short", 4000) == ("short", "")


def test_equal_responses_share_an_identity() -> None:
    tails = np.array([[1, 2, 3], [1, 2, 3], [1, 2, 4]], dtype=np.int64)
    identity = response_identity(tails, tails, np.array([3, 3, 3]))
    assert identity[0] == identity[1] != identity[2]


def test_rewards_that_are_not_finite_are_left_out_of_the_reward_statistics() -> None:
    samples = [{"prompt": "p", "response": "r", "reward": value} for value in (1.0, math.nan, 3.0)]
    columns, texts, identity, _ = columns_from_mappings(samples)
    stats = step_statistics(columns, identity, 0.5)
    assert stats["samples/reward_mean"] == 2.0 and stats["samples/count"] == 3
    assert texts[1] == RawText("p", "r", None)


@pytest.mark.parametrize("count", [0, 1, 5])
def test_small_steps_choose_what_they_have(count: int) -> None:
    columns = columns_of(count) if count else columns_from_mappings([])[0]
    chosen = choose_texts(columns, 16, 16, 0.5, step=random.randrange(100))
    assert set(chosen) <= set(range(count))
