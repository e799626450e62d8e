"""Step joiner: straggler tracking, input limits, and replays after a partial persist."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from rlpulse.settings import EventLimits, JoinerSettings
from rlpulse.streams.joiner import JoinOutcome, StepJoiner
from tests.unit.test_joiner import GRACE, LATE, LINGER, T0, S, ev, make, only


def test_stragglers_are_ranks_last_in_k_of_the_last_n_steps() -> None:
    joiner = StepJoiner({}, {}, {}, JoinerSettings(straggler_window=4, straggler_min=3))
    found = []
    for step in range(1, 9):
        slow = 2 if step <= 5 else 0  # rank 2 arrives last in steps 1-5, rank 0 after that
        order = [r for r in range(3) if r != slow] + [slow]
        for rank in order:
            out = joiner.add(ev(rank, step, world_size=3), T0 + step)
        summary = only(out)
        assert summary["last_rank"] == slow
        found.append(summary["stragglers"])
    # window of 4: rank 2 is last in >= 3 of them from step 3 to step 6; rank 0 from step 8
    assert found == [[], [], [2], [2], [2], [2], [], [0]]


def test_stragglers_ignore_incomplete_and_single_rank_steps() -> None:
    joiner = StepJoiner({}, {}, {}, JoinerSettings(straggler_window=2, straggler_min=1))
    assert only(joiner.add(ev(0, 1, world_size=1), T0))["stragglers"] == []
    joiner.add(ev(1, 2, stage="actor"), T0)
    [summary] = joiner.expire(T0 + 31 * 10**9)
    assert (summary["closed_by"], summary["missing_ranks"], summary["stragglers"]) == (
        "grace",
        [0],
        [],
    )


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"run_id": "r" * 257}, "too_large: run_id of 257 chars > 256"),
        ({"world_size": 70_000}, "too_large: world_size 70000 > 65536"),
        ({"metrics": {f"m{i}": 0.0 for i in range(1_025)}}, "too_large: 1025 metrics"),
        ({"tags": {f"t{i}": "" for i in range(65)}}, "too_large: 65 tags > 64"),
        ({"metrics": {"m" * 300: 1.0}}, "too_large: a name or tag of 300 chars > 256"),
        ({"tags": {"k": "v" * 300}}, "too_large: a name or tag of 300 chars > 256"),
    ],
)
def test_absurd_sizes_are_refused(overrides: dict[str, Any], reason: str) -> None:
    event: dict[str, Any] = dict(ev())
    event.update(overrides)
    out = make().add(event, T0)  # type: ignore[arg-type]
    assert out.rejected is not None
    assert out.rejected.startswith(reason), out.rejected


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="straggler_min"):
        JoinerSettings(straggler_window=3, straggler_min=4)
    with pytest.raises(ValueError, match="max_metrics"):
        EventLimits(max_metrics=0)


def test_replay_over_a_stale_stage_gives_the_same_summaries() -> None:
    """groups persisted after the release, stages from before it: the replay re-emits
    identical summaries (same ids), and late events still find the released group."""
    groups: dict[str, Any] = {}
    stages: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    joiner = StepJoiner(groups, stages, runs)
    joiner.add(ev(0, 1, {"a": 1.0}, seq=1), T0)
    stale_stages, stale_runs = copy.deepcopy(stages), copy.deepcopy(runs)
    first = only(joiner.add(ev(1, 1, {"a": 3.0}, seq=2), T0 + 5))
    # crash: groups (and the summary) landed, stages did not; replay both events
    stages.clear()
    stages.update(stale_stages)
    runs.clear()
    runs.update(stale_runs)
    replay = StepJoiner(groups, stages, runs)
    assert replay.add(ev(0, 1, {"a": 1.0}, seq=1), T0 + 10).duplicate
    again = only(replay.add(ev(1, 1, {"a": 3.0}, seq=2), T0 + 11))
    assert again["summary_id"] == first["summary_id"]
    assert (again["metrics"], again["revision"]) == (first["metrics"], 1)
    assert replay.add(ev(1, 1, {"a": 5.0}, seq=3), T0 + 12).summaries == []  # pending
    [late] = replay.expire(T0 + 12 + LINGER)
    assert (late["revision"], late["metrics"]["a"]["max"]) == (2, 5.0)


def test_a_released_group_unknown_to_its_stage_is_adopted() -> None:
    """The stage record is from before the group existed: the group is adopted as retained,
    its events count as duplicates (its summary is out), and the frontier moves past it."""
    groups: dict[str, Any] = {}
    stages: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    joiner = StepJoiner(groups, stages, runs)
    joiner.add(ev(0, 1, world_size=1), T0)
    stale = copy.deepcopy(stages)
    joiner.add(ev(0, 2, world_size=1, seq=50), T0 + 1)
    stages.clear()
    stages.update(stale)
    out = joiner.add(ev(0, 2, world_size=1, seq=50), T0 + 2)
    assert out.duplicate
    assert stages["run|0|rollout"]["frontier"] == 2
    assert stages["run|0|rollout"]["retained"] == [[1, 2]]
    assert joiner.add(ev(0, 2, world_size=1, seq=51), T0 + 3).summaries == []  # pending
    assert joiner.add(ev(0, 1, world_size=1, seq=52), T0 + 4).summaries == []
    revisions = joiner.expire(T0 + 4 + LINGER)
    assert [(s["step"], s["revision"]) for s in revisions] == [(1, 2), (2, 2)]
    joiner.expire(T0 + 700 * 10**9)
    assert groups == {}


def test_a_takeover_gives_open_steps_a_fresh_grace_period() -> None:
    stages: dict[str, Any] = {}
    joiner = make(stages=stages)
    joiner.add(ev(0, 1, world_size=2), T0)
    taken_over = T0 + 2 * GRACE  # no worker watched in between
    assert joiner.restart_grace(list(stages), taken_over) == 1
    assert joiner.expire(taken_over + GRACE - S) == []  # the old clock would have closed it
    late_rank = only(joiner.add(ev(1, 1, world_size=2), taken_over + S))
    assert (late_rank["closed_by"], late_rank["ranks_reported"]) == ("complete", [0, 1])


def test_restart_grace_leaves_closed_steps_and_unknown_stages_alone() -> None:
    stages: dict[str, Any] = {}
    joiner = make(stages=stages)
    joiner.add(ev(0, 2, world_size=2), T0)
    [summary] = joiner.expire(T0 + GRACE)
    assert summary["closed_by"] == "grace"
    assert joiner.restart_grace([*stages, "no-such|0|stage"], T0 + 2 * GRACE) == 0


# -- pending revisions after a crash -----------------------------------------------------------

STAGE = "run|0|rollout"
GROUP = "run|0|rollout|1"


def restored(mapping: dict[str, Any]) -> dict[str, Any]:
    """What a changelog gives back: a JSON copy."""
    return dict(json.loads(json.dumps(mapping)))


def with_pending_step(groups: dict[str, Any], stages: dict[str, Any]) -> StepJoiner:
    """Step 1 (world size 3) released by grace with rank 0; rank 1 late, its revision pending."""
    joiner = make(groups, stages)
    joiner.add(ev(0, 1, {"x": 1.0}, world_size=3, seq=0), T0)
    joiner.expire(T0 + GRACE)
    assert joiner.add(ev(1, 1, {"x": 2.0}, world_size=3, seq=0), T0 + GRACE + S).summaries == []
    return joiner


def test_a_pending_revision_survives_a_restore_of_the_tables() -> None:
    groups: dict[str, Any] = {}
    stages: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    joiner = with_pending_step(groups, stages)
    after = make(restored(groups), restored(stages), restored(runs))
    due = T0 + GRACE + S + LINGER
    [revision] = after.expire(due)
    assert revision == only(JoinOutcome(joiner.expire(due)))  # as if nothing had happened
    assert (revision["revision"], revision["ranks_reported"]) == (2, [0, 1])


def test_a_stage_record_that_missed_the_mark_gets_it_back_from_the_replay() -> None:
    """groups persisted with the late event (and its mark), stages not: the replayed event is a
    duplicate of the group, and lists the step again."""
    groups: dict[str, Any] = {}
    stages: dict[str, Any] = {}
    joiner = make(groups, stages)
    joiner.add(ev(0, 1, {"x": 1.0}, world_size=3, seq=0), T0)
    joiner.expire(T0 + GRACE)
    stale = copy.deepcopy(stages)
    joiner.add(ev(1, 1, {"x": 2.0}, world_size=3, seq=0), T0 + GRACE + S)
    stages.clear()
    stages.update(stale)
    replay = make(groups, stages)
    assert replay.expire(T0 + GRACE + S + LINGER) == []  # the stage does not know it yet
    assert replay.add(ev(1, 1, {"x": 2.0}, world_size=3, seq=0), T0 + GRACE + 3 * S).duplicate
    assert stages[STAGE]["pending"] == [1]
    [revision] = replay.expire(T0 + GRACE + 3 * S)  # the linger ran from the first arrival
    assert (revision["revision"], revision["ranks_reported"]) == (2, [0, 1])


def test_a_revision_sent_but_not_recorded_is_sent_again_with_its_id() -> None:
    """The summary went out, then the process died before groups and stages were written."""
    groups: dict[str, Any] = {}
    stages: dict[str, Any] = {}
    joiner = with_pending_step(groups, stages)
    before = (copy.deepcopy(groups), copy.deepcopy(stages))
    due = T0 + GRACE + S + LINGER
    [sent] = joiner.expire(due)
    [again] = make(*before).expire(due + S)
    assert again == {**sent, "emitted_ns": due + S}


def test_a_step_listed_but_emitted_before_is_dropped_from_the_list() -> None:
    """groups written after the revision went out, the stage record not."""
    groups: dict[str, Any] = {}
    stages: dict[str, Any] = {}
    joiner = with_pending_step(groups, stages)
    stale = copy.deepcopy(stages)
    assert len(joiner.expire(T0 + GRACE + S + LINGER)) == 1
    stages.clear()
    stages.update(stale)
    assert stages[STAGE]["pending"] == [1]
    assert make(groups, stages).expire(T0 + GRACE + S + 2 * LINGER) == []
    assert stages[STAGE]["pending"] == []
    assert groups[GROUP]["revision"] == 2


def test_a_pending_group_its_stage_never_listed_emits_when_it_leaves() -> None:
    """The replayed late event came after the late window (refused as too late), so nothing
    listed the step again: the group's revision goes out when the group is deleted."""
    groups: dict[str, Any] = {}
    stages: dict[str, Any] = {}
    joiner = with_pending_step(groups, stages)
    del stages[STAGE]["pending"]
    [revision] = joiner.expire(T0 + GRACE + LATE)
    assert (revision["revision"], revision["ranks_reported"]) == (2, [0, 1])
    assert groups == {}


def test_state_of_the_previous_release_loads() -> None:
    """Records without ``pending_ns`` and ``pending`` (written before revisions were
    coalesced) work on: a released group takes late events, an open one is released."""
    groups: dict[str, Any] = {}
    stages: dict[str, Any] = {}
    runs: dict[str, Any] = {}
    joiner = make(groups, stages, runs)
    joiner.add(ev(0, 1, {"x": 1.0}, world_size=3, seq=0), T0)
    joiner.expire(T0 + GRACE)  # step 1 released, rank 0 only
    joiner.add(ev(0, 2, {"x": 1.0}, world_size=3, seq=1), T0 + GRACE)  # step 2 open
    for group in [*groups.values(), *stages[STAGE]["groups"].values()]:
        del group["pending_ns"]
    assert all("pending" not in stage for stage in stages.values())
    old = make(restored(groups), restored(stages), restored(runs))
    assert old.add(ev(1, 1, world_size=3, seq=0), T0 + GRACE + S).summaries == []
    [revision] = old.expire(T0 + GRACE + S + LINGER)
    assert (revision["step"], revision["revision"], revision["ranks_reported"]) == (1, 2, [0, 1])
    assert old.add(ev(2, 1, world_size=3, seq=0), T0 + GRACE + 3 * S).summaries[0]["revision"] == 3
    summaries = old.add(ev(0, 2, kind="run_end", seq=2), T0 + GRACE + 4 * S).summaries
    assert [(s["step"], s["revision"], s["closed_by"]) for s in summaries] == [(2, 1, "run_end")]
