"""Unit tests of the pure step joiner (no broker)."""

from __future__ import annotations

import itertools
import json
import math
import struct
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpulse.schemas.records import StepSummary, TrainerEvent
from rlpulse.settings import JoinerSettings
from rlpulse.streams.joiner import (
    SUMMARY_NAMESPACE,
    JoinOutcome,
    StepJoiner,
    summary_id,
)
from rlpulse.streams.joiner import _stats as joiner_stats
from rlpulse.streams.joiner import _stats_by_arith as stats_by_arith

S = 1_000_000_000
T0 = 1_700_000_000 * S
GRACE = 30 * S
LATE = 600 * S
LINGER = 2 * S  # revision_linger_s by default
NAN = float("nan")
INF = float("inf")

_seq = itertools.count()


def ev(
    rank: int = 0,
    step: int = 1,
    metrics: dict[str, float] | None = None,
    *,
    world_size: int = 2,
    stage: str = "rollout",
    run_id: str = "run",
    attempt: int = 0,
    kind: str = "metrics",
    seq: int | None = None,
    producer_id: str | None = None,
    timestamp_ns: int = T0,
    tags: dict[str, str] | None = None,
) -> TrainerEvent:
    """A TrainerEvent with sensible defaults; a fresh seq unless one is given."""
    event: dict[str, Any] = {
        "kind": kind,
        "run_id": run_id,
        "attempt": attempt,
        "step": step,
        "stage": stage,
        "rank": rank,
        "world_size": world_size,
        "metrics": metrics if metrics is not None else {},
        "level": None,
        "message": None,
        "tags": tags or {},
        "timestamp_ns": timestamp_ns,
        "hostname": "host",
        "pid": 1,
        "producer_id": producer_id if producer_id is not None else f"p{rank}",
        "seq": next(_seq) if seq is None else seq,
        "policy_version": None,
        "trace_id": None,
    }
    return event  # type: ignore[return-value]


def make(groups: Any = None, stages: Any = None, runs: Any = None) -> StepJoiner:
    return StepJoiner(
        groups if groups is not None else {},
        stages if stages is not None else {},
        runs if runs is not None else {},
        JoinerSettings(grace_s=30, late_window_s=600),
    )


def only(outcome: JoinOutcome) -> StepSummary:
    assert outcome.rejected is None
    assert not outcome.duplicate
    assert len(outcome.summaries) == 1
    return outcome.summaries[0]


def steps_of(summaries: list[StepSummary]) -> list[int]:
    return [s["step"] for s in summaries]


def open_stage_keys(stages: Mapping[str, Any]) -> list[str]:
    """The keys of the stages in the joiner's ``stages`` table with an unreleased group."""
    return sorted(key for key, stage in stages.items() if stage["groups"])


def test_complete_group_exact_stats() -> None:
    joiner = make()
    values = [3.0, 1.0, 1.0, 3.0]
    rewards = {0: 0.1, 2: 0.2, 3: 0.4}
    ts = {0: T0 + 50, 1: T0 + 10, 2: T0 + 30, 3: T0 + 20}
    order = [1, 3, 2, 0]  # rank 0 arrives last
    for i, rank in enumerate(order):
        metrics = {"loss": values[rank]}
        if rank in rewards:
            metrics["reward"] = rewards[rank]
        out = joiner.add(
            ev(rank, 7, metrics, world_size=4, timestamp_ns=ts[rank], tags={f"t{rank}": "x"}),
            now_ns=T0 + 100 + i,
        )
        if i < 3:
            assert out == JoinOutcome([])
    summary = only(out)
    assert summary["closed_by"] == "complete"
    assert (summary["run_id"], summary["attempt"], summary["stage"]) == ("run", 0, "rollout")
    assert (summary["step"], summary["revision"], summary["world_size"]) == (7, 1, 4)
    assert summary["summary_id"] == summary_id("run", 0, "rollout", 7, 1)
    assert summary["ranks_reported"] == [0, 1, 2, 3]
    assert summary["missing_ranks"] == []
    assert summary["metrics"]["loss"] == {
        "count": 4,
        "sum": 8.0,
        "mean": 2.0,  # (3 + 1 + 1 + 3) / 4
        "std": 1.0,  # sqrt((1 + 1 + 1 + 1) / 4)
        "min": 1.0,
        "max": 3.0,
        "min_rank": 1,  # ranks 1 and 2 tie: lowest wins
        "max_rank": 0,  # ranks 0 and 3 tie
        "non_finite": 0,
    }
    reward = summary["metrics"]["reward"]
    assert reward["count"] == 3
    assert reward["mean"] == math.fsum([0.1, 0.2, 0.4]) / 3
    assert reward["mean"] == pytest.approx(0.7 / 3, rel=1e-15)
    mean = reward["mean"]
    expected_std = math.sqrt(math.fsum((v - mean) ** 2 for v in (0.1, 0.2, 0.4)) / 3)
    assert reward["std"] == expected_std
    assert reward["std"] == pytest.approx(math.sqrt(14) / 30, rel=1e-12)  # hand-computed
    assert (reward["min"], reward["min_rank"], reward["max"], reward["max_rank"]) == (
        0.1,
        0,
        0.4,
        3,
    )
    assert summary["tags"] == {"t0": "x", "t1": "x", "t2": "x", "t3": "x"}
    assert summary["last_rank"] == 0
    assert summary["last_rank_lag_ns"] == 40  # rank 0's timestamp - the earliest (rank 1)
    assert (summary["first_event_ns"], summary["last_event_ns"]) == (T0 + 10, T0 + 50)
    assert summary["emitted_ns"] == T0 + 103


def test_grace_closes_after_grace_with_missing_ranks() -> None:
    stages: dict[str, Any] = {}
    joiner = make(stages=stages)
    # grace runs from arrival (now_ns), not from the event's own timestamp
    assert joiner.add(ev(0, 1, {"x": 1.0}, world_size=3, timestamp_ns=0), T0).summaries == []
    assert joiner.add(ev(2, 1, {"x": 2.0}, world_size=3, timestamp_ns=5), T0 + S).summaries == []
    assert open_stage_keys(stages) == ["run|0|rollout"]
    assert joiner.expire(T0 + GRACE - 1) == []
    assert joiner.expire(T0 + GRACE, ["other|0|rollout"]) == []
    [summary] = joiner.expire(T0 + GRACE, ["run|0|rollout"])
    assert summary["closed_by"] == "grace"
    assert summary["ranks_reported"] == [0, 2]
    assert summary["missing_ranks"] == [1]
    assert summary["metrics"]["x"]["count"] == 2
    assert summary["last_rank"] == 2
    assert summary["last_rank_lag_ns"] == 5
    assert summary["emitted_ns"] == T0 + GRACE
    assert open_stage_keys(stages) == []
    assert joiner.expire(T0 + 2 * GRACE) == []


def test_steps_are_emitted_in_ascending_order() -> None:
    joiner = make()
    assert joiner.add(ev(0, 1), T0).summaries == []
    assert joiner.add(ev(0, 2), T0).summaries == []
    assert joiner.add(ev(1, 2), T0).summaries == []  # step 2 complete, waits for step 1
    assert joiner.add(ev(0, 3), T0).summaries == []
    out = joiner.add(ev(1, 1), T0 + 1)
    assert steps_of(out.summaries) == [1, 2]  # step 3 is still open
    assert [s["closed_by"] for s in out.summaries] == ["complete", "complete"]


def test_grace_close_releases_waiting_later_steps_in_order() -> None:
    joiner = make()
    joiner.add(ev(0, 1), T0)
    joiner.add(ev(0, 2), T0 + 1)
    joiner.add(ev(1, 2), T0 + 2)
    joiner.add(ev(0, 3), T0 + 3)
    joiner.add(ev(1, 3), T0 + 4)
    summaries = joiner.expire(T0 + GRACE)
    assert steps_of(summaries) == [1, 2, 3]
    assert [s["closed_by"] for s in summaries] == ["grace", "complete", "complete"]


def test_stages_are_ordered_independently() -> None:
    joiner = make()
    joiner.add(ev(0, 1, stage="actor"), T0)
    out = joiner.add(ev(0, 2, stage="critic", world_size=1), T0)
    assert steps_of(out.summaries) == [2]  # actor's open step 1 does not block critic


def test_events_of_one_rank_merge() -> None:
    joiner = make()
    assert joiner.add(ev(0, 1, {"a": 1.0, "b": 2.0}, seq=5), T0).summaries == []
    assert joiner.add(ev(0, 1, {"a": 10.0}, seq=3), T0).summaries == []  # lower seq loses
    assert joiner.add(ev(0, 1, {"b": 7.0, "c": 4.0}, seq=9), T0).summaries == []  # rank once
    summary = only(joiner.add(ev(1, 1, {"a": 3.0}, kind="log"), T0))
    assert summary["ranks_reported"] == [0, 1]
    assert summary["metrics"]["a"]["sum"] == 4.0
    assert summary["metrics"]["b"]["sum"] == 7.0
    assert summary["metrics"]["c"]["count"] == 1
    assert summary["last_rank"] == 1


def test_log_event_without_metrics_counts_the_rank() -> None:
    joiner = make()
    joiner.add(ev(0, 1, {"a": 1.0}), T0)
    summary = only(joiner.add(ev(1, 1, kind="log"), T0))
    assert summary["ranks_reported"] == [0, 1]
    assert summary["metrics"]["a"]["count"] == 1


def test_duplicates_are_dropped() -> None:
    joiner = make()
    assert joiner.add(ev(0, 1, {"a": 1.0}, seq=1), T0) == JoinOutcome([])
    assert joiner.add(ev(0, 1, {"a": 99.0}, seq=1), T0) == JoinOutcome([], duplicate=True)
    # same seq from another producer is not a duplicate
    assert not joiner.add(ev(0, 1, {"b": 1.0}, seq=1, producer_id="other"), T0).duplicate
    summary = only(joiner.add(ev(1, 1, {"a": 3.0}, seq=2), T0))
    assert summary["metrics"]["a"]["sum"] == 4.0
    # a duplicate of an emitted group (within the late window) is no revision
    assert joiner.add(ev(1, 1, {"a": 3.0}, seq=2), T0 + S) == JoinOutcome([], duplicate=True)


def test_late_event_within_window_emits_a_revision() -> None:
    """A late rank that completes the step: a revision at once; one more event for the
    complete step: a revision once the linger ran out."""
    joiner = make()
    joiner.add(ev(0, 1, {"a": 1.0}), T0)
    [first] = joiner.expire(T0 + GRACE)
    joiner.add(ev(0, 2, {"a": 1.0}), T0 + GRACE)  # step 2 open: does not hold back revisions
    late = only(joiner.add(ev(1, 1, {"a": 3.0}, timestamp_ns=T0 + 7), T0 + GRACE + 5 * S))
    assert late["revision"] == 2
    assert late["summary_id"] == summary_id("run", 0, "rollout", 1, 2) != first["summary_id"]
    assert late["closed_by"] == "grace"
    assert late["ranks_reported"] == [0, 1]
    assert late["missing_ranks"] == []
    assert late["metrics"]["a"]["mean"] == 2.0
    assert late["metrics"]["a"]["std"] == 1.0
    assert late["last_event_ns"] == T0 + 7
    assert late["emitted_ns"] == T0 + GRACE + 5 * S
    assert joiner.add(ev(1, 1, {"b": 1.0}), T0 + GRACE + 6 * S) == JoinOutcome([])
    [third] = joiner.expire(T0 + GRACE + 6 * S + LINGER)
    assert third["revision"] == 3


def test_event_for_a_closed_waiting_group_merges_without_revision() -> None:
    joiner = make()
    joiner.add(ev(0, 1), T0)
    joiner.add(ev(0, 2, {"a": 1.0}), T0)
    joiner.add(ev(1, 2, {"a": 1.0}), T0)  # step 2 complete, waiting for step 1
    assert joiner.add(ev(1, 2, {"a": 5.0}), T0).summaries == []
    summaries = joiner.add(ev(1, 1), T0).summaries
    assert [(s["step"], s["revision"]) for s in summaries] == [(1, 1), (2, 1)]
    assert summaries[1]["metrics"]["a"]["max"] == 5.0


def test_too_late_after_the_late_window() -> None:
    groups: dict[str, Any] = {}
    joiner = make(groups=groups)
    joiner.add(ev(0, 1, {"a": 1.0}), T0)
    joiner.add(ev(1, 1, {"a": 1.0}), T0)  # released at T0
    joiner.add(ev(0, 3), T0 + 1)
    # past the window but before expire() ran: still too late
    out = joiner.add(ev(1, 1, {"a": 2.0}), T0 + LATE)
    assert out.summaries == []
    assert out.rejected is not None
    assert out.rejected.startswith("too_late:")
    assert steps_of(joiner.expire(T0 + LATE)) == [3]  # step 3 by grace
    assert "run|0|rollout|1" not in groups
    # after expire() deleted the group, the stage frontier still refuses it
    out = joiner.add(ev(1, 1, {"a": 2.0}), T0 + LATE + 1)
    assert out.rejected is not None
    assert out.rejected.startswith("too_late:")


def test_new_step_below_the_frontier_is_too_late() -> None:
    joiner = make()
    joiner.add(ev(0, 5, world_size=1), T0)  # emitted: frontier 5
    out = joiner.add(ev(0, 4, world_size=1), T0)
    assert out.rejected is not None
    assert out.rejected.startswith("too_late:")
    assert only(joiner.add(ev(0, 6, world_size=1), T0))["step"] == 6


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"step": -1}, "invalid: negative step -1"),
        ({"rank": -1}, "invalid: rank -1 outside [0, 2)"),
        ({"rank": 2}, "invalid: rank 2 outside [0, 2)"),
        ({"world_size": 0, "rank": 0}, "invalid: world_size 0 < 1"),
        ({"run_id": ""}, "invalid: run_id '' is not a non-empty string"),
        ({"stage": ""}, "invalid: stage '' is not a non-empty string"),
        ({"stage": "a|b"}, "invalid: stage 'a|b' contains '|'"),
        ({"kind": "bogus"}, "invalid: unknown kind 'bogus'"),
        ({"step": "3", "seq": 1.5}, "invalid: step, seq must be integers"),
        ({"metrics": {"a": 1.0, "b": "x"}}, "invalid: metrics ['b'] are not numbers"),
        ({"metrics": None}, "invalid: malformed event"),
        ({"tags": None}, "invalid: tags must be a map"),
        ({"world_size": 2**31 - 1}, "too_large: world_size 2147483647 > 65536"),
        ({"metrics": {f"m{i}": 0.0 for i in range(5000)}}, "too_large: 5000 metrics"),
        ({"run_id": "r" * 10_000}, "too_large: run_id of 10000 chars > 256"),
    ],
)
def test_invalid_events_are_rejected(overrides: dict[str, Any], reason: str) -> None:
    groups: dict[str, Any] = {}
    joiner = make(groups=groups)
    event: dict[str, Any] = dict(ev())
    event.update(overrides)
    out = joiner.add(event, T0)  # type: ignore[arg-type]
    assert out.summaries == []
    assert out.rejected is not None
    assert out.rejected.startswith(reason), out.rejected
    assert groups == {}


def test_missing_field_and_world_size_mismatch_are_rejected() -> None:
    joiner = make()
    event: dict[str, Any] = dict(ev())
    del event["seq"]
    out = joiner.add(event, T0)  # type: ignore[arg-type]
    assert out.rejected == "invalid: missing field 'seq'"
    out = joiner.add({"kind": "run_end", "run_id": "run"}, T0)  # type: ignore[typeddict-item]
    assert out.rejected == "invalid: missing field 'attempt'"
    joiner.add(ev(0, 1, world_size=2), T0)
    out = joiner.add(ev(1, 1, world_size=3), T0)
    assert out.rejected == "invalid: world_size 3 differs from the 2 of run|0|rollout|1"


def test_run_end_closes_open_groups_of_its_attempt() -> None:
    stages: dict[str, Any] = {}
    joiner = make(stages=stages)
    assert joiner.add(ev(0, 0, kind="run_start"), T0) == JoinOutcome([])
    joiner.add(ev(0, 2, stage="actor"), T0)
    joiner.add(ev(0, 1, stage="actor"), T0)
    joiner.add(ev(0, 3, stage="actor", world_size=1), T0)  # complete, waits for 1 and 2
    joiner.add(ev(1, 5, stage="critic"), T0)
    joiner.add(ev(0, 1, stage="actor", attempt=1), T0)  # another attempt stays open
    summaries = joiner.add(ev(0, 0, kind="run_end"), T0 + S).summaries
    assert [(s["stage"], s["step"], s["closed_by"]) for s in summaries] == [
        ("actor", 1, "run_end"),
        ("actor", 2, "run_end"),
        ("actor", 3, "complete"),
        ("critic", 5, "run_end"),
    ]
    assert summaries[3]["missing_ranks"] == [0]
    assert open_stage_keys(stages) == ["run|1|actor"]
    assert joiner.add(ev(0, 0, kind="run_end"), T0 + 2 * S) == JoinOutcome([])


def test_new_attempt_gets_fresh_groups() -> None:
    joiner = make()
    joiner.add(ev(0, 5, {"a": 1.0}, world_size=1), T0)
    joiner.add(ev(0, 6, {"a": 1.0}, world_size=1), T0)
    # resumed from the checkpoint of step 4: steps 5 and 6 again, as new groups
    for step in (5, 6):
        summary = only(joiner.add(ev(0, step, {"a": 2.0}, world_size=1, attempt=1), T0 + S))
        assert (summary["attempt"], summary["step"], summary["revision"]) == (1, step, 1)
        assert summary["metrics"]["a"]["sum"] == 2.0
        assert summary["summary_id"] == summary_id("run", 1, "rollout", step, 1)
    assert joiner.add(ev(0, 4, world_size=1, attempt=0), T0).rejected is not None


def test_nan_and_inf_statistics() -> None:
    joiner = make()
    for rank, value in enumerate([1.0, NAN, INF, NAN]):
        out = joiner.add(
            ev(rank, 1, {"x": value, "y": [2.0, INF, -1.0, 0.5][rank]}, world_size=4), T0
        )
    summary = only(out)
    x = summary["metrics"]["x"]
    assert all(math.isnan(x[k]) for k in ("sum", "mean", "std", "min", "max"))
    assert (x["count"], x["min_rank"], x["max_rank"], x["non_finite"]) == (4, 1, 1, 3)
    y = summary["metrics"]["y"]
    assert (y["sum"], y["mean"], y["min"], y["max"]) == (INF, INF, -1.0, INF)
    assert math.isnan(y["std"])
    assert (y["min_rank"], y["max_rank"], y["non_finite"]) == (2, 1, 1)


class JsonRoundTrip(dict[str, Any]):
    """A table stand-in: values are stored as JSON text, every read decodes a fresh copy.

    In-place changes to a value read from it are lost unless written back, as with faust.
    """

    def __setitem__(self, key: str, value: Any) -> None:
        assert isinstance(key, str)
        super().__setitem__(key, json.dumps(value))

    def __getitem__(self, key: str) -> Any:
        return json.loads(super().__getitem__(key))

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def decoded(self) -> dict[str, Any]:
        return {key: self[key] for key in self}


def scenario(joiner: StepJoiner) -> Iterator[object]:
    """A run through every path; yields every outcome (expired summaries as outcomes too)."""
    seqs = itertools.count()
    yield joiner.add(ev(0, 0, kind="run_start", seq=next(seqs)), T0)
    yield joiner.add(ev(0, 1, {"a": 1.0}, tags={"k": "v"}, seq=next(seqs)), T0)
    yield joiner.add(ev(0, 2, {"a": 2.0}, seq=100), T0 + 1)
    yield joiner.add(ev(0, 2, {"a": 5.0}, seq=100), T0 + 2)  # duplicate
    yield joiner.add(ev(0, 2, {"a": 3.0}, seq=101), T0 + 3)
    yield joiner.add(ev(1, 2, {"a": 4.0}, seq=next(seqs)), T0 + 4)  # complete, waits for step 1
    yield joiner.add(ev(0, 1, stage="critic", world_size=1, seq=next(seqs)), T0 + 5)
    yield JoinOutcome(joiner.expire(T0 + GRACE))  # step 1 by grace, then step 2
    yield joiner.add(ev(1, 1, {"a": 9.0}, seq=next(seqs)), T0 + GRACE + 1)  # revision 2
    yield joiner.add(ev(0, 3, {"a": 1.0}, seq=next(seqs)), T0 + GRACE + 2)
    yield joiner.add(ev(0, 3, kind="run_end", seq=next(seqs)), T0 + GRACE + 3)
    yield JoinOutcome(joiner.expire(T0 + GRACE + LATE))  # deletes every group but step 3's
    yield joiner.add(ev(1, 2, seq=next(seqs)), T0 + GRACE + LATE)  # too late
    yield JoinOutcome(joiner.expire(T0 + GRACE + 2 * LATE))  # deletes step 3, drains the stages
    yield JoinOutcome(joiner.expire(T0 + GRACE + 3 * LATE))  # deletes the drained stages


def test_state_survives_json_round_trips() -> None:
    plain: tuple[dict[str, Any], dict[str, Any], dict[str, Any]] = ({}, {}, {})
    tables = (JsonRoundTrip(), JsonRoundTrip(), JsonRoundTrip())
    plain_joiner, json_joiner = make(*plain), make(*tables)
    emitted: list[tuple[str, int, int, str]] = []
    for step, (expected, actual) in enumerate(
        zip(scenario(plain_joiner), scenario(json_joiner), strict=True)
    ):
        assert actual == expected, step
        for mapping, table in zip(plain, tables, strict=True):
            assert table.decoded() == json.loads(json.dumps(mapping)), step
        if isinstance(actual, JoinOutcome):
            emitted += [
                (s["stage"], s["step"], s["revision"], s["closed_by"]) for s in actual.summaries
            ]
    assert emitted == [
        ("critic", 1, 1, "complete"),
        ("rollout", 1, 1, "grace"),
        ("rollout", 2, 1, "complete"),
        ("rollout", 1, 2, "grace"),
        ("rollout", 3, 1, "run_end"),
    ]
    assert all(table == {} for table in tables)  # nothing left behind


def test_state_is_cleaned_up() -> None:
    groups: dict[str, Any] = {}
    stages: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    joiner = make(groups, stages, runs)
    joiner.add(ev(0, 1, world_size=1), T0)
    joiner.add(ev(0, 1, world_size=1, stage="critic"), T0)
    assert runs == {"run|0": ["rollout", "critic"]}
    joiner.expire(T0 + LATE)
    assert groups == {}
    assert set(stages) == {"run|0|rollout", "run|0|critic"}  # frontiers kept for a window
    joiner.add(ev(0, 2, world_size=1), T0 + LATE + 1)  # rollout is active again
    joiner.expire(T0 + 2 * LATE)
    assert set(stages) == {"run|0|rollout"}
    assert runs == {"run|0": ["rollout"]}
    joiner.expire(T0 + 3 * LATE)  # deletes rollout's last group
    assert groups == {}
    assert set(stages) == {"run|0|rollout"}
    joiner.expire(T0 + 4 * LATE)
    assert (groups, stages, runs) == ({}, {}, {})


def test_summary_id_is_deterministic() -> None:
    sid = summary_id("run", 0, "rollout", 1, 1)
    expected = uuid.uuid5(SUMMARY_NAMESPACE, "run\x1f0\x1frollout\x1f1\x1f1")
    assert sid == str(expected)
    assert str(SUMMARY_NAMESPACE) == "8df55b85-6d5e-4297-8b62-70b55184a79d"
    ids = set()
    for _ in range(2):
        joiner = make()
        joiner.add(ev(0, 1, world_size=1), T0)
        ids.add(only(joiner.add(ev(0, 2, world_size=1), T0 + 123))["summary_id"])
    assert ids == {summary_id("run", 0, "rollout", 2, 1)}
    variants = {
        summary_id("run", 0, "rollout", 1, 2),
        summary_id("run", 1, "rollout", 1, 1),
        summary_id("run", 0, "actor", 1, 1),
        summary_id("run", 0, "rollout", 2, 1),
        summary_id("run2", 0, "rollout", 1, 1),
    }
    assert sid not in variants
    assert len(variants) == 5


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="grace_s"):
        JoinerSettings(grace_s=0)
    with pytest.raises(ValueError, match="late_window_s"):
        JoinerSettings(late_window_s=-1)


# -- coalesced revisions ----------------------------------------------------------------

KEY = "run|0|rollout|1"


def released_by_grace(joiner: StepJoiner, world_size: int, on_time: int) -> StepSummary:
    """Step 1 with ranks ``0..on_time-1`` released by grace at ``T0 + GRACE``."""
    for rank in range(on_time):
        joiner.add(ev(rank, 1, {"x": float(rank)}, world_size=world_size, seq=0), T0)
    [first] = joiner.expire(T0 + GRACE)
    assert (first["revision"], first["closed_by"]) == (1, "grace")
    return first


def test_a_burst_of_late_ranks_makes_one_revision_with_all_of_them() -> None:
    groups: dict[str, Any] = {}
    stages: dict[str, Any] = {}
    joiner = make(groups, stages)
    released_by_grace(joiner, world_size=256, on_time=50)
    start = T0 + GRACE + S
    for i, rank in enumerate(range(50, 250)):  # 200 late ranks within the linger; 6 never come
        now = start + i * (LINGER // 200)
        assert joiner.add(ev(rank, 1, {"x": float(rank)}, world_size=256), now) == JoinOutcome([])
    assert groups[KEY]["pending_ns"] == start  # the first late event's arrival
    assert stages["run|0|rollout"]["pending"] == [1]
    assert joiner.expire(start + LINGER - 1) == []
    [revision] = joiner.expire(start + LINGER)
    assert (revision["revision"], revision["closed_by"]) == (2, "grace")
    assert revision["ranks_reported"] == list(range(250))
    assert revision["missing_ranks"] == list(range(250, 256))
    assert revision["metrics"]["x"]["count"] == 250
    assert revision["emitted_ns"] == start + LINGER
    assert revision["summary_id"] == summary_id("run", 0, "rollout", 1, 2)
    assert groups[KEY]["pending_ns"] is None
    assert stages["run|0|rollout"]["pending"] == []
    assert joiner.expire(start + 10 * LINGER) == []  # nothing pending: nothing more


def test_a_late_rank_completing_the_step_emits_at_once_with_the_pending_ones() -> None:
    stages: dict[str, Any] = {}
    joiner = make(stages=stages)
    released_by_grace(joiner, world_size=4, on_time=1)
    assert joiner.add(ev(1, 1, {"x": 1.0}, world_size=4), T0 + GRACE + 1).summaries == []
    assert joiner.add(ev(2, 1, {"x": 2.0}, world_size=4), T0 + GRACE + 2).summaries == []
    revision = only(joiner.add(ev(3, 1, {"x": 3.0}, world_size=4), T0 + GRACE + 3))
    assert (revision["revision"], revision["ranks_reported"]) == (2, [0, 1, 2, 3])
    assert (revision["missing_ranks"], revision["emitted_ns"]) == ([], T0 + GRACE + 3)
    assert stages["run|0|rollout"]["pending"] == []
    assert joiner.expire(T0 + GRACE + 3 + LINGER) == []


def test_more_events_for_a_complete_step_wait_for_the_linger() -> None:
    """Only the event that makes the step complete skips the linger, once."""
    joiner = make()
    joiner.add(ev(0, 1, {"a": 1.0}), T0)
    only(joiner.add(ev(1, 1, {"a": 1.0}), T0))  # complete
    assert joiner.add(ev(0, 1, {"b": 1.0}), T0 + S).summaries == []
    assert joiner.add(ev(1, 1, {"b": 3.0}), T0 + 2 * S).summaries == []
    [revision] = joiner.expire(T0 + S + LINGER)
    assert (revision["revision"], revision["metrics"]["b"]["sum"]) == (2, 4.0)


def test_revisions_of_a_steady_trickle_are_a_linger_apart() -> None:
    joiner = make()
    released_by_grace(joiner, world_size=1024, on_time=1)
    emitted: list[StepSummary] = []
    start = T0 + GRACE
    for tenth in range(1, 201):  # a late rank every 100 ms for 20 s, a tick every second
        now = start + tenth * S // 10
        assert joiner.add(ev(tenth, 1, world_size=1024), now).summaries == []
        if tenth % 10 == 0:
            emitted += joiner.expire(now)
    assert [s["revision"] for s in emitted] == list(range(2, 2 + len(emitted)))
    assert len(emitted) <= 20 * S // LINGER
    gaps = [b["emitted_ns"] - a["emitted_ns"] for a, b in itertools.pairwise(emitted)]
    assert min(gaps) >= LINGER
    [last] = joiner.expire(start + 20 * S + LINGER)
    assert last["ranks_reported"] == list(range(201))


def test_run_end_emits_pending_revisions_before_closing_open_steps() -> None:
    joiner = make()
    released_by_grace(joiner, world_size=3, on_time=1)
    joiner.add(ev(0, 2, world_size=3), T0 + GRACE)  # open
    assert joiner.add(ev(1, 1, world_size=3), T0 + GRACE + 1).summaries == []
    summaries = joiner.add(ev(0, 2, kind="run_end"), T0 + GRACE + 2).summaries
    assert [(s["step"], s["revision"], s["closed_by"]) for s in summaries] == [
        (1, 2, "grace"),
        (2, 1, "run_end"),
    ]
    assert summaries[0]["ranks_reported"] == [0, 1]
    assert joiner.expire(T0 + GRACE + 2 + LINGER) == []


def test_a_group_leaving_at_the_end_of_its_window_emits_its_pending_revision() -> None:
    groups: dict[str, Any] = {}
    joiner = make(groups=groups)
    released_by_grace(joiner, world_size=3, on_time=1)
    released = T0 + GRACE
    assert joiner.add(ev(1, 1, world_size=3), released + LATE - S).summaries == []
    [revision] = joiner.expire(released + LATE)  # before the linger ran out
    assert (revision["revision"], revision["ranks_reported"]) == (2, [0, 1])
    assert groups == {}


def test_duplicates_and_too_late_events_of_a_pending_step() -> None:
    groups: dict[str, Any] = {}
    joiner = make(groups=groups)
    released_by_grace(joiner, world_size=3, on_time=1)
    late = ev(1, 1, {"x": 1.0}, world_size=3)
    assert joiner.add(late, T0 + GRACE + 1) == JoinOutcome([])
    assert joiner.add(late, T0 + GRACE + 2) == JoinOutcome([], duplicate=True)
    assert groups[KEY]["pending_ns"] == T0 + GRACE + 1
    out = joiner.add(ev(2, 1, world_size=4), T0 + GRACE + 3)
    assert out.rejected == "invalid: world_size 4 differs from the 3 of run|0|rollout|1"
    [revision] = joiner.expire(T0 + GRACE + 1 + LINGER)
    assert revision["ranks_reported"] == [0, 1]
    assert joiner.add(late, T0 + GRACE + 1 + LINGER) == JoinOutcome([], duplicate=True)
    assert joiner.expire(T0 + GRACE + 1 + 2 * LINGER) == []  # a duplicate marks nothing
    out = joiner.add(ev(2, 1, world_size=3), T0 + GRACE + LATE)
    assert out.rejected is not None
    assert out.rejected.startswith("too_late:")
    assert groups[KEY]["pending_ns"] is None


def pending_scenario(joiner: StepJoiner) -> Iterator[list[StepSummary]]:
    """Pending revisions made, emitted by expire, completion and run_end; yields summaries."""
    later = T0 + 2 * GRACE
    yield [released_by_grace(joiner, world_size=4, on_time=1)]
    yield joiner.add(ev(0, 1, stage="critic", world_size=2, seq=1000), T0 + GRACE).summaries
    yield joiner.expire(later)  # critic step 1 by grace
    yield joiner.add(ev(1, 1, world_size=4, seq=1001), later).summaries  # pending
    yield joiner.add(ev(1, 1, stage="critic", world_size=2, seq=1002), later).summaries  # complete
    yield joiner.add(ev(2, 1, world_size=4, seq=1003), later + 1).summaries  # still pending
    yield joiner.expire(later + LINGER)
    yield joiner.add(ev(3, 1, world_size=4, seq=1004), later + LINGER + 1).summaries  # complete
    yield joiner.add(ev(3, 1, {"y": 1.0}, world_size=4, seq=1005), later + LINGER + 2).summaries
    yield joiner.add(ev(0, 1, kind="run_end", seq=1006), later + LINGER + 3).summaries
    yield joiner.expire(T0 + 2 * LATE)  # deletes the groups
    yield joiner.expire(T0 + 4 * LATE)  # deletes the drained stages


def test_pending_revisions_survive_json_round_trips() -> None:
    """faust persists only assignments: every change of a pending mark is written back."""
    plain: tuple[dict[str, Any], dict[str, Any], dict[str, Any]] = ({}, {}, {})
    tables = (JsonRoundTrip(), JsonRoundTrip(), JsonRoundTrip())
    emitted: list[tuple[str, int, int, list[int]]] = []
    for step, (expected, actual) in enumerate(
        zip(pending_scenario(make(*plain)), pending_scenario(make(*tables)), strict=True)
    ):
        assert actual == expected, step
        for mapping, table in zip(plain, tables, strict=True):
            assert table.decoded() == json.loads(json.dumps(mapping)), step
        emitted += [(s["stage"], s["step"], s["revision"], s["ranks_reported"]) for s in actual]
    assert emitted == [
        ("rollout", 1, 1, [0]),
        ("critic", 1, 1, [0]),
        ("critic", 1, 2, [0, 1]),
        ("rollout", 1, 2, [0, 1, 2]),
        ("rollout", 1, 3, [0, 1, 2, 3]),
        ("rollout", 1, 4, [0, 1, 2, 3]),
    ]
    assert all(table == {} for table in tables)  # nothing left behind


def test_settings_of_revisions_are_validated() -> None:
    assert JoinerSettings().revision_linger_s == 2.0
    with pytest.raises(ValueError, match="revision_linger_s"):
        JoinerSettings(revision_linger_s=0)


# -- property ---------------------------------------------------------------------------

finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)


def direct_stats(values_by_rank: dict[int, float]) -> dict[str, float | int]:
    ranks = sorted(values_by_rank)
    values = [values_by_rank[r] for r in ranks]
    n = len(values)
    mean = math.fsum(values) / n
    low, high = min(values), max(values)
    return {
        "count": n,
        "sum": math.fsum(values),
        "mean": mean,
        # a square is x * x, as docs/design.md fixes it (x ** 2 goes to pow, off by an ulp at times)
        "std": math.sqrt(math.fsum((v - mean) * (v - mean) for v in values) / n),
        "min": low,
        "max": high,
        "min_rank": next(r for r in ranks if values_by_rank[r] == low),
        "max_rank": next(r for r in ranks if values_by_rank[r] == high),
        "non_finite": 0,
    }


def direct_metrics(events: list[TrainerEvent]) -> dict[str, dict[str, float | int]]:
    """Per metric, per rank the value of the highest seq, reduced across ranks."""
    best: dict[str, dict[int, tuple[int, float]]] = {}
    for event in events:
        for name, value in event["metrics"].items():
            held = best.setdefault(name, {}).get(event["rank"])
            if held is None or event["seq"] >= held[0]:
                best[name][event["rank"]] = (event["seq"], value)
    return {
        name: direct_stats({rank: v for rank, (_, v) in by_rank.items()})
        for name, by_rank in best.items()
    }


@st.composite
def runs_of_events(draw: st.DrawFn) -> list[TrainerEvent]:
    """Events of a few steps and stages; each producer's own events stay in order (as in a
    Kafka partition), the producers interleave randomly, duplicates are re-sent anywhere later.
    """
    stages = {"actor": draw(st.integers(1, 3)), "critic": draw(st.integers(1, 3))}
    steps = draw(st.lists(st.integers(0, 20), min_size=1, max_size=4, unique=True))
    per_rank: dict[int, list[TrainerEvent]] = {}
    for step in sorted(steps):
        for stage, world_size in stages.items():
            for rank in range(world_size):
                for _ in range(draw(st.integers(1, 2))):
                    names = draw(st.lists(st.sampled_from("abc"), max_size=3, unique=True))
                    events = per_rank.setdefault(rank, [])
                    events.append(
                        ev(
                            rank,
                            step,
                            {name: draw(finite) for name in names},
                            world_size=world_size,
                            stage=stage,
                            seq=len(events),
                            timestamp_ns=T0 + draw(st.integers(0, 10**6)),
                        )
                    )
    slots = [rank for rank, events in per_rank.items() for _ in events]
    order = draw(st.permutations(slots))
    cursors = dict.fromkeys(per_rank, 0)
    stream: list[TrainerEvent] = []
    for rank in order:
        stream.append(per_rank[rank][cursors[rank]])
        cursors[rank] += 1
    for _ in range(draw(st.integers(0, 5))):
        original = draw(st.integers(0, len(stream) - 1))
        stream.insert(draw(st.integers(original + 1, len(stream))), stream[original])
    return stream


@settings(max_examples=150, deadline=None)
@given(runs_of_events())
def test_property_one_ordered_first_revision_per_step(stream: list[TrainerEvent]) -> None:
    stages: dict[str, Any] = {}
    joiner = make(stages=stages)
    seen: set[tuple[str, int]] = set()
    accepted: dict[tuple[str, int], list[TrainerEvent]] = {}
    firsts: dict[str, list[int]] = {}
    revisions: dict[tuple[str, int], int] = {}
    for i, event in enumerate(stream):
        out = joiner.add(event, T0 + i)
        assert out.rejected is None
        identity = (event["producer_id"], event["seq"])
        assert out.duplicate == (identity in seen)
        seen.add(identity)
        if not out.duplicate:
            accepted.setdefault((event["stage"], event["step"]), []).append(event)
        for summary in out.summaries:
            key = (summary["stage"], summary["step"])
            assert summary["revision"] == revisions.get(key, 0) + 1
            revisions[key] = summary["revision"]
            if summary["revision"] == 1:
                firsts.setdefault(summary["stage"], []).append(summary["step"])
            assert summary["closed_by"] == "complete"
            assert summary["missing_ranks"] == []
            assert summary["metrics"] == direct_metrics(accepted[key])
    expected_steps = sorted({event["step"] for event in stream})
    assert firsts == {"actor": expected_steps, "critic": expected_steps}
    assert open_stage_keys(stages) == []


@settings(max_examples=400, deadline=None)
@given(
    values=st.lists(
        st.floats() | st.sampled_from([1e308, -1e308, 0.0, -0.0]) | st.floats(-10, 10),
        min_size=1,
        max_size=12,
    )
)
def test_a_metric_reduces_to_the_same_bits_whether_or_not_every_value_is_finite(
    values: list[float],
) -> None:
    ranks = list(range(len(values)))
    expected = stats_by_arith(ranks, values)
    got = joiner_stats(ranks, values)
    assert {k: struct.pack("<d", v) if isinstance(v, float) else v for k, v in got.items()} == {
        k: struct.pack("<d", v) if isinstance(v, float) else v for k, v in expected.items()
    }
