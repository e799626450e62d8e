"""Rollout samples from a hand-written loop to their topics: numbers, chosen texts, statistics.

``RunLink.log_samples`` on a real broker through the host's agent: every sample's numbers
arrive once on ``<prefix>.samples``, the chosen samples' texts on ``<prefix>.sample-texts``,
and the step's statistics as an event of stage ``samples``.
"""

from __future__ import annotations

import pytest

from rlpulse.producers import RunLink
from rlpulse.schemas import default_codec
from rlpulse.schemas.topics import Topics
from tests.integration.scripted_run import consume_all
from tests.kafka import settings_at

pytestmark = pytest.mark.broker


def a_step(count: int, step: int) -> list[dict[str, object]]:
    samples: list[dict[str, object]] = []
    for index in range(count):
        samples.append(
            {
                "prompt": f"question {index // 4}",
                "response": "answer " * (index % 7) + f"#{index}",
                "reward": (index % 10) / 10,
                "group": f"q{index // 4}",
                "data_source": "math" if index % 3 else "code",
                "scores": {"acc": float(index % 2), "format": 1.0},
                "truncated": index % 11 == 0,
            }
        )
    return samples


def test_a_step_s_samples_arrive_once_with_their_chosen_texts_and_statistics(
    kafka_bootstrap: str, topics: Topics
) -> None:
    link = RunLink("sampled", settings=settings_at(kafka_bootstrap, topics))
    link.log({"loss": 1.0}, 3)
    link.log_samples(a_step(1024, 3), step=3)
    assert link.close(60) == 0
    codec = default_codec()
    wanted = 1024

    def all_samples(values: list[bytes]) -> bool:
        return sum(len(codec.decode_samples(v)) for v in values) >= wanted

    raw = consume_all(kafka_bootstrap, topics.samples, all_samples, 60.0)
    samples = [s for value in raw for s in codec.decode_samples(value)]
    assert sorted(s["sample_index"] for s in samples) == list(range(wanted))
    assert {s["step"] for s in samples} == {3}
    by_index = {s["sample_index"]: s for s in samples}
    assert by_index[17]["reward"] == 0.7 and by_index[17]["group"] == "q4"
    assert by_index[17]["scores"] == {"acc": 1.0, "format": 1.0}
    assert by_index[11]["truncated"] and not by_index[12]["truncated"]
    texts = [
        t
        for value in consume_all(kafka_bootstrap, topics.sample_texts, lambda v: len(v) > 0, 30.0)
        for t in codec.decode_sample_texts(value)
    ]
    reasons = {reason for t in texts for reason in t["chosen"]}
    assert {"best", "worst", "truncated", "group"} <= reasons, reasons
    assert all(t["response_head"] for t in texts)
    events = [codec.decode_event(v) for v in consume_all(kafka_bootstrap, topics.events, lambda v: len(v) >= 3, 30.0)]
    (stats,) = [e for e in events if e["stage"] == "samples"]
    assert stats["step"] == 3 and stats["metrics"]["samples/count"] == 1024.0
    assert stats["metrics"]["samples/truncated_ratio"] == pytest.approx(94 / 1024)
