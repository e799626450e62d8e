"""SamplingFilter and trace context: pure logic, no broker."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from rlpulse.producers import SamplingFilter, current_trace_id, new_trace_id, trace
from rlpulse.producers.caller.sampling import RATE_ATTR, SAMPLED_OUT_ATTR, keeps_trace
from rlpulse.producers.caller.trace import TRACE_ENV, parse_trace_context


def record(level: int, msg: object = "m %s", trace_id: str | None = None) -> logging.LogRecord:
    made = logging.LogRecord(
        "trainer", level, __file__, 1, msg, (1,) if msg == "m %s" else None, None
    )
    if trace_id is not None:
        made.trace_id = trace_id
    return made


def test_warning_and_above_always_pass_and_a_tenth_of_info_does() -> None:
    sampler = SamplingFilter(0.1, seed=3)
    for level in (logging.WARNING, logging.ERROR, logging.CRITICAL):
        assert all(sampler.filter(record(level)) for _ in range(500))
    kept = sum(sampler.filter(record(logging.INFO)) for _ in range(20_000))
    assert 1700 <= kept <= 2300  # 2000 expected, sd 42
    assert sampler.dropped == {"INFO": 20_000 - kept}


def test_a_trace_is_kept_or_dropped_whole_by_every_filter() -> None:
    traces = [new_trace_id() for _ in range(400)]
    first, second = SamplingFilter(0.1, seed=1), SamplingFilter(0.1, seed=2)  # two "hosts"
    for trace_id in traces:
        decisions = {f.filter(record(lvl, trace_id=trace_id)) for f in (first, second)
                     for lvl in (logging.DEBUG, logging.INFO) for _ in range(5)}  # fmt: skip
        assert decisions == {keeps_trace(trace_id, 0.1)}
    assert 15 <= sum(keeps_trace(t, 0.1) for t in traces) <= 70
    assert all(keeps_trace(t, 0.5) for t in traces if keeps_trace(t, 0.1))  # nested rates


def test_the_current_trace_context_counts_as_the_record_s() -> None:
    sampler = SamplingFilter(0.1)
    with trace("some-trace") as trace_id:
        kept = {sampler.filter(record(logging.INFO)) for _ in range(50)}
    assert kept == {keeps_trace(trace_id, 0.1)}


def test_kept_records_carry_the_rate_and_the_counts_so_far() -> None:
    sampler = SamplingFilter(0.5, seed=0)
    records = [record(logging.INFO) for _ in range(200)] + [record(logging.WARNING)]
    passed = [r for r in records if sampler.filter(r)]
    last = passed[-1]
    assert getattr(last, RATE_ATTR) == 1.0
    assert getattr(last, SAMPLED_OUT_ATTR) == {"INFO": 201 - len(passed)}
    assert {getattr(r, RATE_ATTR) for r in passed[:-1]} == {0.5}


def test_dict_records_are_metrics_and_never_sampled() -> None:
    sampler = SamplingFilter(0.01, seed=0)
    assert all(sampler.filter(record(logging.INFO, {"loss": 1.0})) for _ in range(100))


@pytest.mark.parametrize("rate", [0, -0.1, 1.5, True, "0.1"])
def test_a_bad_rate_is_refused(rate: object) -> None:
    with pytest.raises(ValueError, match="rate must be a number in"):
        SamplingFilter(rate)  # type: ignore[arg-type]


def test_trace_context_parsing() -> None:
    assert parse_trace_context("  ") is None
    assert parse_trace_context("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01") == (
        "4bf92f3577b34da6a3ce929d0e0e4736"
    )
    assert parse_trace_context("job-42") == "job-42"
    with pytest.raises(ValueError, match="not a trace id"):
        parse_trace_context("two words")


PRINT_TRACE = "from rlpulse.producers import current_trace_id as c; print(c())"


def child_trace(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PRINT_TRACE], capture_output=True, text=True, check=True, env=env
    )
    return done.stdout.strip()


def test_a_launcher_s_trace_context_reaches_every_process() -> None:
    env = {k: v for k, v in os.environ.items() if k != TRACE_ENV}
    assert child_trace(env) == "None"
    assert child_trace({**env, TRACE_ENV: "from-launcher"}) == "from-launcher"
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert child_trace({**env, TRACE_ENV: traceparent}) == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_trace_nests_and_exports_to_children() -> None:
    before = current_trace_id()
    with trace("outer"):
        with trace("inner", export=True):
            assert current_trace_id() == "inner"
            assert child_trace(dict(os.environ)) == "inner"
        assert current_trace_id() == "outer"
        assert os.environ.get(TRACE_ENV) != "inner"
    assert current_trace_id() == before


def test_rlpulse_trace_new_prints_a_fresh_id() -> None:
    ids = {
        subprocess.run(
            [sys.executable, "-m", "rlpulse", "trace", "new"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for _ in range(2)
    }
    assert len(ids) == 2 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
