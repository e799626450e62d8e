"""``rlpulse rules backtest`` on the recorded 8-rank run and on small hand-made recordings."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rlpulse.cli import app
from rlpulse.offline.backtest import (
    InputFormat,
    Recorded,
    RecordedEvent,
    detect_format,
    infer_attempts,
    read_recording,
    run_backtest,
)
from rlpulse.rules import RuleSet, load_preset, load_rules, parse_rules
from rlpulse.schemas.jsonl import MalformedLine, RankLogWriter
from rlpulse.schemas.records import ControlCommand
from rlpulse.settings import JoinerSettings

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "tests" / "fixtures" / "runs"
RUN_JSONL = RUNS / "run.jsonl"
PER_RANK = RUNS / "per_rank"
VERL = RUNS / "verl.jsonl"
FEATURES = RUNS / "features.yaml"
SEED = Path(str(resources.files("rlpulse.rules").joinpath("presets", "seed.yaml")))
RUN = "fixture-run"
S = 1_000_000_000

# The cut-short line of each form of the recording (see make_fixture.py).
MALFORMED_AT = {
    RUN_JSONL: (RUN_JSONL, 338),
    PER_RANK: (PER_RANK / "actor_rank3.jsonl", 22),
    VERL: (VERL, 22),
}

# A rule set with no stage and across_ranks mean only: verl's rank-0 means see the same.
MEAN_RULES = """
version: 1
rules:
  - id: reward-unstable
    metric: reward_mean
    over_steps: {window: 5, stat: var}
    when: "> 0.5"
    cooldown_steps: 5
    actions: [{scale_rollout_batch: {factor: 2, max: 256}}]
  - id: entropy-not-finite
    metric: entropy
    when: non_finite
    actions: [{alert: {severity: critical, message: entropy is not finite}}]
  - id: length-collapse
    metric: response_length
    over_steps: {window: 3, stat: delta}
    when: "< -100"
    once: true
    actions: [{scale_rollout_batch: {factor: 0.5, min: 16}}]
  - id: kl-guard
    metric: kl_divergence
    when: "> 0.3"
    for_steps: 3
    once: true
    actions: [{checkpoint: {tag: kl_violation}}, {stop: {}}]
"""


def backtest(
    ruleset: RuleSet, items: Iterable[Recorded], settings: JoinerSettings | None = None
) -> list[ControlCommand]:
    return run_backtest(ruleset, items, settings).commands


def fire(ruleset: RuleSet, path: Path) -> list[ControlCommand]:
    return backtest(ruleset, read_recording(path, run=RUN))


def as_text(commands: Iterable[ControlCommand]) -> list[str]:
    """Comparable commands: NaN evidence makes dict equality useless, JSON text is not."""
    return [json.dumps(command, sort_keys=True) for command in commands]


def where(commands: Iterable[ControlCommand]) -> list[tuple[int, str, int, str | None]]:
    return [(c["attempt"], c["stage"], c["step"], c["rule_id"]) for c in commands]


def cli(*args: str) -> Any:
    return CliRunner().invoke(app, ["rules", "backtest", *args], env={"COLUMNS": "200"})


def rlpulse_line(**fields: Any) -> str:
    event = {"run_id": "r", "step": 1, "stage": "actor", "rank": 0, "world_size": 1}
    return json.dumps(event | fields) + "\n"


# -- the recorded run ------------------------------------------------------------------------


def test_the_recorded_run_is_what_make_fixture_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.spec_from_file_location("make_fixture", RUNS / "make_fixture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    module.generate(tmp_path)
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.jsonl"))
    committed = sorted(p.relative_to(RUNS) for p in RUNS.rglob("*.jsonl"))
    assert written == committed and len(written) == 18
    for name in written:
        assert (tmp_path / name).read_bytes() == (RUNS / name).read_bytes(), name


@pytest.mark.parametrize("rules", [SEED, FEATURES], ids=["seed", "features"])
def test_rlpulse_jsonl_and_per_rank_layout_give_the_same_firings(rules: Path) -> None:
    ruleset = load_rules(rules)
    from_jsonl = fire(ruleset, RUN_JSONL)
    from_per_rank = fire(ruleset, PER_RANK)
    assert from_jsonl, "the recorded run must make the rules fire"
    assert as_text(from_jsonl) == as_text(from_per_rank)  # ids, reasons, evidence, times


def test_seed_rules_fire_where_the_run_misbehaves() -> None:
    firings = fire(load_preset("seed"), PER_RANK)
    assert where(firings) == [
        (0, "rollout", 15, "unstable-reward"),  # reward swings from step 14
        (0, "rollout", 21, "unstable-reward"),  # 5 evaluations of cooldown later
        (0, "actor", 39, "kl-guard"),  # KL > 0.3 at 37, 38, 39
    ]
    guard = firings[-1]
    assert [action["type"] for action in guard["actions"]] == ["checkpoint", "stop"]
    assert guard["reason"].startswith("kl_divergence 0.421638 > 0.3 for 3 consecutive steps")
    assert guard["issued_ns"] > 1_718_000_000 * S  # the recording's clock, not the wall clock


def test_features_rule_set_on_the_recorded_run() -> None:
    firings = fire(load_rules(FEATURES), PER_RANK)
    by_rule: dict[str, list[tuple[int, int]]] = {}
    for firing in firings:
        by_rule.setdefault(firing["rule_id"] or "", []).append((firing["attempt"], firing["step"]))
    assert by_rule["entropy-not-finite"] == [(0, 30)]  # rank 6's NaN, max across ranks
    assert by_rule["kl-guard"] == [(0, 39)]
    assert by_rule["kl-worst-rank"] == [(0, 38), (0, 39)]
    assert by_rule["length-collapse"] == [(1, 50)]  # once
    assert by_rule["length-mean-low"] == [(1, 52), (1, 55)]  # cooldown 2
    assert "tagged-only" not in by_rule  # no tags in the recording
    assert all(f["dry_run"] == (f["rule_id"] == "kl-worst-rank") for f in firings)
    kl_guard = next(i for i, f in enumerate(firings) if f["rule_id"] == "kl-guard")
    assert all(f["attempt"] == 1 for f in firings[kl_guard + 1 :])  # stopped: attempt 0 is over
    assert {f["attempt"] for f in firings} == {0, 1}


def test_verl_means_fire_at_the_same_steps_as_the_ranks() -> None:
    ruleset = parse_rules(MEAN_RULES)
    steps = [(f["rule_id"], f["attempt"], f["step"]) for f in fire(ruleset, PER_RANK)]
    assert steps == [(f["rule_id"], f["attempt"], f["step"]) for f in fire(ruleset, VERL)]
    assert steps == [(f["rule_id"], f["attempt"], f["step"]) for f in fire(ruleset, RUN_JSONL)]
    assert {rule_id for rule_id, _, _ in steps} == {
        "reward-unstable",
        "entropy-not-finite",
        "length-collapse",
        "kl-guard",
    }
    assert {f["stage"] for f in fire(ruleset, VERL)} == {"trainer"}


def test_absent_attempts_are_inferred_as_the_trainer_numbered_them(tmp_path: Path) -> None:
    stripped = tmp_path / "run.jsonl"
    with RUN_JSONL.open() as source, stripped.open("w") as target:
        for line in source:
            try:
                fields = json.loads(line)
            except ValueError:
                target.write(line)
                continue
            del fields["attempt"]
            target.write(json.dumps(fields) + "\n")
    ruleset = load_rules(FEATURES)
    recorded = fire(ruleset, RUN_JSONL)
    inferred = fire(ruleset, stripped)
    assert [f["attempt"] for f in inferred] == [f["attempt"] for f in recorded]
    assert [f["command_id"] for f in inferred] == [f["command_id"] for f in recorded]


@pytest.mark.parametrize("path", [RUN_JSONL, PER_RANK, VERL], ids=["rlpulse", "per-rank", "verl"])
def test_a_malformed_line_is_reported_with_file_and_line_and_skipped(path: Path) -> None:
    result = run_backtest(load_preset("seed"), read_recording(path, run=RUN))
    assert [(m.path, m.line) for m in result.malformed] == [MALFORMED_AT[path]]
    assert "not JSON" in result.malformed[0].reason
    assert result.rejected == [] and result.duplicates == 0

    outcome = cli("--rules", str(SEED), "--events", str(path), "--run", RUN)
    assert outcome.exit_code == 0, outcome.output
    file, line = MALFORMED_AT[path]
    assert f"{file}:{line}: not JSON" in outcome.stderr
    assert "1 malformed lines skipped" in outcome.stderr


def test_json_output_has_one_object_per_firing() -> None:
    outcome = cli("--rules", str(FEATURES), "--events", str(RUN_JSONL), "--json")
    assert outcome.exit_code == 0, outcome.output
    lines = outcome.stdout.splitlines()
    assert len(lines) == len(fire(load_rules(FEATURES), RUN_JSONL)) > 0
    required = {"run_id", "attempt", "step", "stage", "rule_id", "actions", "reason", "dry_run"}
    for line in lines:
        found = json.loads(line)
        assert required | {"command_id", "origin", "evidence", "issued_ns"} <= set(found)
        assert found["run_id"] == RUN and isinstance(found["actions"], list)


def test_tables_per_run() -> None:
    outcome = cli("--rules", str(SEED), "--events", str(PER_RANK), "--run", RUN)
    assert outcome.exit_code == 0, outcome.output
    out = outcome.stdout
    assert f"run {RUN}: 3 commands" in out
    for text in ("unstable-reward", "kl-guard", "checkpoint(tag=kl_violation)", "stop", "39"):
        assert text in out
    assert "scale_rollout_batch(factor=2, max=256)" in out
    assert "1031 events, 129 step summaries, 3 commands" in outcome.stderr


def test_a_run_without_firings_is_listed(tmp_path: Path) -> None:
    path = tmp_path / "quiet.jsonl"
    path.write_text(rlpulse_line(metrics={"kl_divergence": 0.1}))
    outcome = cli("--rules", str(SEED), "--events", str(path))
    assert outcome.exit_code == 0 and "run r: no rule fired" in outcome.stdout


def test_runs_as_a_subcommand_with_a_preset_name() -> None:
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(paths)}  # this checkout's rlpulse
    command = [sys.executable, "-m", "rlpulse", "rules", "backtest", "--rules", "seed"]
    command += ["--events", str(VERL), "--json", "--run", RUN]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, cwd=REPO)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert json.loads(line)["rule_id"] == "kl-guard"
    assert f"{VERL}:22: not JSON" in done.stderr


def test_a_bad_rules_file_exits_1_with_its_position(tmp_path: Path) -> None:
    rules = tmp_path / "bad.yaml"
    rules.write_text("version: 1\nrules:\n  - id: x\n    metric: kl\n    when: '>> 1'\n")
    outcome = cli("--rules", str(rules), "--events", str(VERL))
    assert outcome.exit_code == 1
    assert f"{rules}:5:" in outcome.stderr and "[x]" in outcome.stderr


def test_a_directory_without_rank_files_exits_1(tmp_path: Path) -> None:
    outcome = cli("--rules", str(SEED), "--events", str(tmp_path))
    assert outcome.exit_code == 1 and "holds no <component>_rank<N>.jsonl files" in outcome.stderr


# -- inputs ----------------------------------------------------------------------------------


def test_formats_are_detected(tmp_path: Path) -> None:
    verl = tmp_path / "exp.jsonl"
    verl.write_text('oops\n{"step": 1, "data": {"actor/ppo_kl": 0.5}}\n')
    ours = tmp_path / "events.jsonl"
    ours.write_text(rlpulse_line(data={}))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert detect_format(verl) is InputFormat.VERL
    assert detect_format(ours) is InputFormat.RLPULSE
    assert detect_format(empty) is InputFormat.RLPULSE
    assert detect_format(tmp_path) is InputFormat.PER_RANK


def test_verl_lines_are_rank_0_of_stage_trainer(tmp_path: Path) -> None:
    path = tmp_path / "my-experiment.jsonl"
    path.write_text(
        '{"step": 3, "elapsed_seconds": 1.5, "data": {"actor/ppo_kl": 0.5, '
        '"critic/score/mean": NaN, "note": "x", "flag": true}}\n'
        '{"step": -1, "data": {}}\n'
        '{"step": 4, "data": [1]}\n'
    )
    items = list(read_recording(path))
    event = items[0]
    assert isinstance(event, RecordedEvent) and not event.attempt_given
    assert event.event["run_id"] == "my-experiment"
    assert (event.event["stage"], event.event["rank"], event.event["world_size"]) == (
        "trainer",
        0,
        1,
    )
    assert list(event.event["metrics"]) == ["actor/ppo_kl", "critic/score/mean"]
    assert [(m.line, m.reason) for m in items[1:] if isinstance(m, MalformedLine)] == [
        (2, 'expected {"step": <int >= 0>, "data": {...}}'),
        (3, 'expected {"step": <int >= 0>, "data": {...}}'),
    ]
    (firing,) = backtest(
        parse_rules(
            "version: 1\nrules:\n  - {id: kl, metric: actor/ppo_kl, when: '> 0.4', "
            "actions: [{stop: {}}]}\n"
        ),
        items,
    )
    assert (firing["run_id"], firing["stage"], firing["step"]) == ("my-experiment", "trainer", 3)


def test_rlpulse_lines_get_defaults_and_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(
        rlpulse_line(metrics={"kl": 1})
        + json.dumps({"kind": "run_end", "run_id": "r", "step": 1})
        + "\n"
        + rlpulse_line(run_id=None)
        + rlpulse_line(metrics={"kl": "high"})
        + rlpulse_line(kind="alarm")
        + rlpulse_line(rank="0")
        + rlpulse_line(tags={"a": 1})
    )
    items = list(read_recording(path))
    first, run_end = items[0], items[1]
    assert isinstance(first, RecordedEvent) and isinstance(run_end, RecordedEvent)
    assert first.event["metrics"] == {"kl": 1.0} and first.event["kind"] == "metrics"
    assert (first.event["producer_id"], first.event["seq"]) == (str(path), 1)
    assert (first.event["timestamp_ns"], first.event["tags"], first.attempt_given) == (0, {}, False)
    assert (run_end.event["stage"], run_end.event["rank"], run_end.event["world_size"]) == (
        "trainer",
        0,
        1,
    )
    reasons = [(m.line, m.reason) for m in items if isinstance(m, MalformedLine)]
    assert reasons == [
        (3, "missing field 'run_id'"),
        (4, "metrics must be numbers, got {'kl': 'high'}"),
        (5, "kind must be one of ['log', 'metrics', 'run_end', 'run_start'], got 'alarm'"),
        (6, "rank must be an int, got '0'"),
        (7, "tags must map to strings, got {'a': 1}"),
    ]


def test_events_the_joiner_refuses_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(
        rlpulse_line(rank=3, world_size=2)
        + rlpulse_line(producer_id="p", seq=1, attempt=0)
        + rlpulse_line(producer_id="p", seq=1, attempt=0)  # without attempts: a resume
    )
    result = run_backtest(load_preset("seed"), read_recording(path))
    assert [str(r) for r in result.rejected] == [f"{path}:1: invalid: rank 3 outside [0, 2)"]
    assert result.duplicates == 1 and result.events == 3


def test_run_selects_one_run_of_rlpulse_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(rlpulse_line(run_id="a") + rlpulse_line(run_id="b") + "junk\n")
    items = list(read_recording(path, run="b"))
    assert [i.event["run_id"] for i in items if isinstance(i, RecordedEvent)] == ["b"]
    assert [i.line for i in items if isinstance(i, MalformedLine)] == [3]


# -- time and attempts -----------------------------------------------------------------------

X_ABOVE_1 = parse_rules(
    "version: 1\nrules:\n  - {id: x-high, metric: x, when: '> 1', actions: [{alert: "
    "{severity: info, message: x is high}}]}\n"
)


def test_a_step_with_a_missing_rank_closes_by_grace_on_the_recorded_clock(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    lines = [  # (step, rank, seconds, x); rank 1 never reports step 1
        (0, 0, 0, 0.0),
        (0, 1, 1, 0.0),
        (1, 0, 10, 5.0),
        (2, 0, 20, 0.0),
        (2, 1, 21, 0.0),
        (3, 0, 45, 0.0),
        (3, 1, 46, 0.0),
    ]
    path.write_text(
        "".join(
            rlpulse_line(step=step, rank=rank, world_size=2, timestamp_ns=sec * S, metrics={"x": x})
            for step, rank, sec, x in lines
        )
    )
    (firing,) = backtest(X_ABOVE_1, read_recording(path))
    assert firing["step"] == 1 and "reported by rank 0 only" in firing["reason"]
    assert firing["issued_ns"] == 45 * S  # the first event at or after 10 s + 30 s of grace

    (late,) = backtest(X_ABOVE_1, read_recording(path), JoinerSettings(grace_s=100))
    assert late["step"] == 1 and late["issued_ns"] == (46 + 100) * S  # closed at the end


def test_the_end_of_the_recording_closes_open_steps(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text(rlpulse_line(world_size=8, timestamp_ns=5 * S, metrics={"x": 2.0}))
    result = run_backtest(X_ABOVE_1, read_recording(path), JoinerSettings(grace_s=7))
    assert result.summaries == 1
    assert [(f["step"], f["issued_ns"]) for f in result.commands] == [(1, 12 * S)]


def test_late_ranks_of_a_recording_make_one_revision(tmp_path: Path) -> None:
    """As in the worker: late ranks within ``revision_linger_s`` of the first one make one
    revision, emitted when the recorded clock passes the linger, or at the end."""
    lines = [(1, 0, 0.0)]  # (step, rank, seconds); world size 8
    lines += [(2, rank, 40.0) for rank in range(8)]  # step 1 closes by grace before these
    lines += [(1, rank, 41.0 + rank / 10) for rank in range(1, 7)]  # rank 7 never comes
    lines += [(3, rank, 50.0) for rank in range(8)]
    path = tmp_path / "events.jsonl"
    path.write_text(
        "".join(
            rlpulse_line(step=step, rank=rank, world_size=8, attempt=0, timestamp_ns=round(sec * S))
            for step, rank, sec in lines
        )
    )
    result = run_backtest(X_ABOVE_1, read_recording(path))
    assert (result.events, result.summaries, result.rejected) == (23, 4, [])  # 3 steps, 1 revision

    path.write_text("".join(path.read_text().splitlines(keepends=True)[:15]))  # ends pending
    settings = JoinerSettings(grace_s=7, revision_linger_s=60)
    assert run_backtest(X_ABOVE_1, read_recording(path), settings).summaries == 3


def test_a_resumed_run_is_attempt_1_from_where_its_steps_go_back(tmp_path: Path) -> None:
    kl = {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.1, 4: 0.5, 5: 0.5}  # attempt 0: steps 0..5
    resumed = {3: 0.1, 4: 0.1, 5: 0.1, 6: 0.5, 7: 0.5}  # resumed from step 2's checkpoint
    for rank in (0, 1):
        with RankLogWriter(tmp_path, "actor", rank) as writer:
            for seconds, (step, value) in enumerate([*kl.items(), *resumed.items()]):
                writer.write(step, "actor", {"kl": value}, timestamp_ns=(seconds * 10 + rank) * S)
    items = list(read_recording(tmp_path, run="r"))
    assert all(isinstance(i, RecordedEvent) and not i.attempt_given for i in items)
    attempts = [
        (i.event["step"], i.event["attempt"])
        for i in infer_attempts(items)
        if isinstance(i, RecordedEvent) and i.event["rank"] == 0
    ]
    assert attempts == [(s, 0) for s in kl] + [(s, 1) for s in resumed]

    rules = parse_rules(
        "version: 1\nrules:\n  - {id: kl, metric: kl, when: '> 0.3', for_steps: 2, "
        "actions: [{stop: {}}]}\n"
    )
    assert where(backtest(rules, items)) == [(0, "actor", 5, "kl"), (1, "actor", 7, "kl")]


def test_attempt_inference_rules() -> None:
    def event(step: int, stage: str = "actor", rank: int = 0, kind: str = "metrics") -> Any:
        fields = {"run_id": "r", "step": step, "stage": stage, "rank": rank, "kind": kind}
        return RecordedEvent(fields, attempt_given=False)  # type: ignore[arg-type]

    fields = {"run_id": "r", "step": 9, "stage": "x", "rank": 0, "kind": "metrics", "attempt": 4}
    given = RecordedEvent(fields)  # type: ignore[arg-type]
    stream = [
        event(1),
        event(2),
        event(2, "rollout"),  # another stage: its own steps
        event(2),  # at the last step: a resume
        event(3, "ref"),  # first seen after the resume: joins attempt 1
        event(3, kind="run_end"),  # joins the run's current attempt
        MalformedLine(Path("f"), 1, "bad", ""),
        event(1),  # below again: attempt 2
        event(1, rank=1),  # new rank: joins attempt 2
        given,
    ]
    got = [
        (i.event["stage"], i.event["step"], i.event["attempt"])
        if isinstance(i, RecordedEvent)
        else None
        for i in infer_attempts(stream)
    ]
    assert got == [
        ("actor", 1, 0),
        ("actor", 2, 0),
        ("rollout", 2, 0),
        ("actor", 2, 1),
        ("ref", 3, 1),
        ("actor", 3, 1),
        None,
        ("actor", 1, 2),
        ("actor", 1, 2),
        ("x", 9, 4),
    ]


def test_preset_names_are_rules_too() -> None:
    outcome = cli("--rules", "verl", "--events", str(VERL), "--run", RUN, "--json")
    assert outcome.exit_code == 0, outcome.output
    expected = fire(load_preset("verl"), VERL)
    assert [json.loads(line)["command_id"] for line in outcome.stdout.splitlines()] == [
        command["command_id"] for command in expected
    ]
    unknown = cli("--rules", "no-such-preset", "--events", str(VERL))
    assert unknown.exit_code == 1 and "unknown preset 'no-such-preset'" in unknown.stderr


# -- files an EventLogger wrote (rlpulse issue 20) ------------------------------------------


def write_two_runs(log_dir: Path) -> None:
    """Two 2-rank runs sharing one ``log_dir``: their lines interleave in the same files.

    The lines carry ``run_id`` and ``attempt``, as EventLogger's local files do; run ``hot``
    has KL 0.5 from step 10, run ``calm`` 0.1 throughout (the means of both would be 0.3).
    """
    writers = [RankLogWriter(log_dir, "trainer", rank) for rank in (0, 1)]
    for step in range(20):
        for run, kl in (("calm", 0.1), ("hot", 0.5 if step >= 10 else 0.1)):
            for writer in writers:
                ts = (step * 10 + writer.rank) * S
                writer.write(
                    step, "actor", {"kl_divergence": kl}, run_id=run, attempt=0, timestamp_ns=ts
                )
    for writer in writers:
        writer.close()


def test_runs_sharing_a_log_dir_are_split_by_each_lines_run_id(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    write_two_runs(log_dir)
    result = run_backtest(parse_rules(MEAN_RULES), read_recording(log_dir))
    assert result.runs == ["calm", "hot"]
    assert [(c["run_id"], *where([c])[0]) for c in result.commands] == [
        ("hot", 0, "actor", 12, "kl-guard")
    ]
    outcome = cli("--rules", "seed", "--events", str(log_dir))
    assert outcome.exit_code == 0, outcome.output
    assert "run calm: no rule fired" in outcome.stdout and "run logs" not in outcome.stdout


def test_run_picks_one_run_of_a_shared_log_dir(tmp_path: Path) -> None:
    write_two_runs(tmp_path)
    result = run_backtest(parse_rules(MEAN_RULES), read_recording(tmp_path, run="calm"))
    assert result.runs == ["calm"] and result.commands == [] and result.events == 40


def test_one_rank_file_an_event_logger_wrote_is_read(tmp_path: Path) -> None:
    write_two_runs(tmp_path)
    path = tmp_path / "trainer_rank0.jsonl"
    assert detect_format(path) is InputFormat.PER_RANK
    outcome = cli("--rules", str(FEATURES), "--events", str(path), "--json")
    assert outcome.exit_code == 0, outcome.output
    assert "missing field" not in outcome.stderr
    assert "40 events, 40 step summaries" in outcome.stderr  # rank 0 alone: world size 1
    result = run_backtest(parse_rules(MEAN_RULES), read_recording(path))
    assert [c["run_id"] for c in result.commands] == ["hot"]


def test_nothing_read_is_one_line_and_exit_1(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n')
    outcome = cli("--rules", "seed", "--events", str(path))
    assert outcome.exit_code == 1
    last = outcome.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: no events read from {path}: 2 lines skipped"), last
