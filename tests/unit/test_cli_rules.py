"""``rlpulse rules check``: one greppable line per problem, exit 1 on any."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from rlpulse.cli import app
from rlpulse.rules import load_preset, schema
from tests.unit.test_rules_loader import EXPECTED_PROBLEMS, FIXTURES

PRESETS = Path(schema.__file__).with_name("presets")
PROBLEM_LINE = re.compile(
    r"^(?P<file>[^:]+):(?P<line>\d+):(?P<column>\d+): (?:\[(?P<rule>[^]]+)\] )?"
)


def check(*paths: Path | str) -> tuple[int, list[str], list[str]]:
    result = CliRunner().invoke(app, ["rules", "check", *map(str, paths)])
    return result.exit_code, result.stdout.splitlines(), result.stderr.splitlines()


def test_broken_directory_reports_every_problem_with_its_line() -> None:
    code, out, err = check(FIXTURES)
    assert code == 1
    expected = [
        f"{FIXTURES / name}:{problem}"
        for name in sorted(EXPECTED_PROBLEMS)
        for problem in EXPECTED_PROBLEMS[name]
    ]
    assert err == expected
    assert all(PROBLEM_LINE.match(line) for line in err)
    good = sorted(FIXTURES.glob("*.good.yaml"))
    assert [line.split(" ")[1] for line in out] == [str(path) for path in good]


def test_each_issue_problem_is_one_line() -> None:
    """The Done-when list of the rules issue: each broken file -> exactly one line."""
    for name in (
        "bad-yaml.bad.yaml",
        "unknown-key.bad.yaml",
        "wrong-type.bad.yaml",
        "unknown-action.bad.yaml",
        "bad-when.bad.yaml",
        "std-window.bad.yaml",
        "worst-equals.bad.yaml",
        "negative-cooldown.bad.yaml",
        "duplicate-id.bad.yaml",
    ):
        code, out, err = check(FIXTURES / name)
        assert (code, out, len(err)) == (1, [], 1), name
        found = PROBLEM_LINE.match(err[0])
        assert found is not None and found["file"] == str(FIXTURES / name)


def test_presets_pass() -> None:
    code, out, err = check(PRESETS)
    assert (code, err) == (0, [])
    assert out == [
        f"ok: {PRESETS / 'openrlhf.yaml'} (12 rules)",
        f"ok: {PRESETS / 'seed.yaml'} (3 rules)",
        f"ok: {PRESETS / 'trl.yaml'} (15 rules)",
        f"ok: {PRESETS / 'verl.yaml'} (17 rules)",
    ]


def test_files_and_directories_mix(tmp_path: Path) -> None:
    (tmp_path / "a.yml").write_text(
        'version: 1\nrules:\n  - {id: a, metric: m, when: "> 1", actions: [{stop: {}}]}\n'
    )
    (tmp_path / "notes.txt").write_text("not a rules file")
    code, out, err = check(tmp_path, FIXTURES / "minimal.good.yaml")
    assert (code, err) == (0, [])
    assert out == [
        f"ok: {tmp_path / 'a.yml'} (1 rule)",
        f"ok: {FIXTURES / 'minimal.good.yaml'} (1 rule)",
    ]


def test_missing_paths_and_empty_directories_fail(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = check(missing, empty, FIXTURES / "minimal.good.yaml")
    assert code == 1
    assert err == [
        f"{missing}: no such file or directory, nor a preset (openrlhf, seed, trl, verl)",
        f"{empty}: no rules files (*.yaml, *.yml) in it",
    ]
    assert out == [f"ok: {FIXTURES / 'minimal.good.yaml'} (1 rule)"]


def test_long_lines_are_not_wrapped() -> None:
    code, _, err = check(FIXTURES / "many-problems.bad.yaml")
    assert code == 1
    assert max(len(line) for line in err) > 120  # printed whole, whatever the terminal width
    assert len(err) == len(EXPECTED_PROBLEMS["many-problems.bad.yaml"])


def test_no_arguments_shows_help() -> None:
    result = CliRunner().invoke(app, ["rules", "check"])
    assert result.exit_code == 2
    assert "Missing argument" in result.stderr


def test_preset_names_are_checked_like_files() -> None:
    code, out, err = check("seed", "verl")
    assert (code, err) == (0, [])
    assert out == ["ok: seed (3 rules)", f"ok: verl ({len(load_preset('verl').rules)} rules)"]


TYPO_RULES = """version: 1
rules:
  - id: kl-guard
    metric: kl_divergence
    when: "> 0.3"
    actions: [{stop: {}}]
  - id: reward-drop
    metric: reward_mean
    whn: "< 0"
    actions: [{alert: {severity: warning, message: reward below 0}}]
"""


def test_the_worker_reports_a_bad_rules_file_as_rules_check_does(tmp_path: Path) -> None:
    """Before connecting; the rule id is kept, one space after the position (rlpulse issue 20)."""
    typo = tmp_path / "typo.yaml"
    typo.write_text(TYPO_RULES)
    _, _, expected = check(typo)
    assert expected and all("[reward-drop]" in line for line in expected)
    env = {"COLUMNS": "80", "RLPULSE_BOOTSTRAP": "127.0.0.1:1"}  # never reached
    result = CliRunner().invoke(app, ["worker", "--rules", str(typo)], env=env)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert lines[: len(expected)] == expected
    assert lines[len(expected) :] == [f"not started: {typo} has problems"]


def test_publish_takes_a_preset_name_like_every_rules_argument() -> None:
    """No broker listens at port 1: a preset gets as far as publishing (a file would too)."""
    env = {"COLUMNS": "200", "RLPULSE_OPERATOR__KAFKA_TIMEOUT_S": "2"}
    args = ["--bootstrap", "127.0.0.1:1", "--prefix", "unit"]
    preset = CliRunner().invoke(app, ["rules", "publish", "seed", *args], env=env)
    assert preset.exit_code == 1
    assert "does not exist" not in preset.output
    assert "could not publish" in preset.stderr
    unknown = CliRunner().invoke(app, ["rules", "publish", "no-such-rules", *args], env=env)
    assert unknown.exit_code == 1
    assert unknown.stderr.startswith("no-such-rules: no such file or directory, nor a preset (")
