"""Loading rules files: presets, and bad files refused with file:line:column and rule id."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from rlpulse.rules import RulesError, RuleSet, RulesFileError, load_preset, load_rules, parse_rules
from rlpulse.rules.exceptions import PresetNotFoundError, RuleProblem
from rlpulse.rules.loader import list_presets
from rlpulse.rules.model import Comparison, NonFinite, Outside, parse_condition


def problems(text: str) -> list[RuleProblem]:
    with pytest.raises(RulesFileError) as caught:
        parse_rules(text, "bad.yaml")
    return caught.value.problems


# -- presets ---------------------------------------------------------------------------------


def test_seed_preset_loads() -> None:
    seed = load_preset("seed")
    assert "seed" in list_presets()
    assert [rule.id for rule in seed.rules] == ["unstable-reward", "kl-guard"]
    assert seed.model_dump()["rules"] == [
        {
            "id": "unstable-reward",
            "description": None,
            "metric": "reward_mean",
            "stage": "rollout",
            "across_ranks": "mean",
            "over_steps": {"window": 5, "stat": "var"},
            "when": "> 0.5",
            "for_steps": 1,
            "cooldown_steps": 5,
            "once": False,
            "mode": "enforce",
            "match": None,
            "actions": [{"scale_rollout_batch": {"factor": 2.0, "min": None, "max": 256}}],
        },
        {
            "id": "kl-guard",
            "description": None,
            "metric": "kl_divergence",
            "stage": None,
            "across_ranks": "mean",
            "over_steps": None,
            "when": "> 0.3",
            "for_steps": 3,
            "cooldown_steps": 0,
            "once": True,
            "mode": "enforce",
            "match": None,
            "actions": [{"checkpoint": {"tag": "kl_violation"}}, {"stop": {}}],
        },
    ]
    for rule in seed.rules:
        assert re.fullmatch(r"[0-9a-f]{12}", rule.version)


def test_every_preset_loads() -> None:
    for name in list_presets():
        assert isinstance(load_preset(name), RuleSet)


def test_unknown_preset() -> None:
    with pytest.raises(PresetNotFoundError, match="available: seed") as caught:
        load_preset("nope")
    assert isinstance(caught.value, LookupError)
    assert isinstance(caught.value, RulesError)


def test_dumped_rules_read_back_identical() -> None:
    seed = load_preset("seed")
    again = parse_rules(yaml.safe_dump(seed.model_dump()), "dumped.yaml")
    assert again == seed
    assert [r.version for r in again.rules] == [r.version for r in seed.rules]


def test_load_rules_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text('version: 1\nrules:\n  - id: a\n    metric: m\n    when: "> 1"\n')
    with pytest.raises(RulesFileError) as caught:
        load_rules(path)
    assert str(caught.value) == f"{path}:3:5: [a] missing required key 'actions'"


# -- versions and conditions -----------------------------------------------------------------

RULE = """version: 1
rules:
  - id: r
    metric: m
    when: "{when}"
    actions: [{{stop: {{}}}}]
"""


def version_of(when: str) -> str:
    return parse_rules(RULE.format(when=when)).rules[0].version


def test_version_ignores_spelling_and_follows_meaning() -> None:
    assert version_of("> 0.5") == version_of(">0.5") == version_of(">  5e-1")
    assert version_of("> 0.5") != version_of(">= 0.5")
    assert version_of("> 0.5") != version_of("> 0.25")


@pytest.mark.parametrize(
    ("text", "condition"),
    [
        ("> 0.5", Comparison(">", 0.5)),
        ("<=-1e3", Comparison("<=", -1000.0)),
        (" != 0 ", Comparison("!=", 0.0)),
        ("outside [-1, 2.5]", Outside(-1.0, 2.5)),
        ("outside [1,1]", Outside(1.0, 1.0)),
        ("non_finite", NonFinite()),
    ],
)
def test_conditions_parse(text: str, condition: object) -> None:
    assert parse_condition(text) == condition


# -- bad files -------------------------------------------------------------------------------

# (name, file, expected problems as "line:column: [rule id] message")
BAD_FILES = [
    (
        "unknown key",
        """version: 1
rules:
  - id: a
    metric: m
    when: "> 1"
    treshold: 2
    actions: [{stop: {}}]
""",
        [
            "6:5: [a] unknown key 'treshold'; expected one of: across_ranks, actions, "
            "cooldown_steps, description, for_steps, id, match, metric, mode, once, over_steps, "
            "stage, when"
        ],
    ),
    (
        "unknown action",
        """version: 1
rules:
  - id: a
    metric: m
    when: "> 1"
    actions:
      - stop: {}
      - restart: {}
""",
        [
            "8:9: [a] actions[1]: unknown action 'restart'; expected one of: stop, checkpoint, "
            "scale_rollout_batch, set, alert"
        ],
    ),
    (
        "bad when",
        """version: 1
rules:
  - id: a
    metric: m
    when: "above 1"
    actions: [{stop: {}}]
""",
        [
            "5:11: [a] when: cannot parse 'above 1'; expected '<op> <number>' with op one of "
            "> >= < <= == != (e.g. '> 0.5'), 'outside [a, b]' or 'non_finite'"
        ],
    ),
    (
        "window < 2 for std",
        """version: 1
rules:
  - id: a
    metric: m
    over_steps: {window: 1, stat: std}
    when: "> 1"
    actions: [{stop: {}}]
""",
        ["5:26: [a] over_steps.window: Input should be greater than or equal to 2, got 1"],
    ),
    (
        "zscore needs window 3",
        """version: 1
rules:
  - id: a
    metric: m
    over_steps:
      stat: zscore
      window: 2
    when: "> 1"
    actions: [{stop: {}}]
""",
        [
            "7:15: [a] over_steps.window: zscore needs window >= 3 (a mean and std of the "
            "previous values), got 2"
        ],
    ),
    (
        "duplicate id",
        """version: 1
rules:
  - id: a
    metric: m
    when: "> 1"
    actions: [{stop: {}}]
  - id: a
    metric: n
    when: "> 1"
    actions: [{stop: {}}]
""",
        ["7:9: [a] id: duplicate rule id 'a' (first defined on line 3)"],
    ),
    (
        "worst with ==",
        """version: 1
rules:
  - id: a
    metric: m
    across_ranks: worst
    when: "== 1"
    actions: [{stop: {}}]
""",
        ["6:11: [a] when: across_ranks 'worst' needs a >, >=, < or <= condition, got '== 1'"],
    ),
    (
        "outside with a > b",
        """version: 1
rules:
  - id: a
    metric: m
    when: "outside [2, 1]"
    actions: [{stop: {}}]
""",
        ["5:11: [a] when: 'outside [a, b]' needs a <= b, got 'outside [2, 1]'"],
    ),
    (
        "unquoted when",
        """version: 1
rules:
  - id: a
    metric: m
    when: > 1
""",
        [
            "5:13: invalid YAML: while scanning a block scalar; expected a comment or a line "
            "break, but found '1' (quote values that start with '>' or '|', e.g. "
            'when: "> 0.5")'
        ],
    ),
    (
        "duplicate key",
        """version: 1
rules:
  - id: a
    metric: m
    when: "> 1"
    when: "> 2"
    actions: [{stop: {}}]
""",
        ["6:5: [a] duplicate key 'when' (first on line 5)"],
    ),
    (
        "bad action parameters, no id",
        """version: 1
rules:
  - metric: m
    when: "> 1"
    actions:
      - scale_rollout_batch: {factor: 0, max: 2.5}
      - alert: {severity: loud, message: hi}
""",
        [
            "3:5: rules[0]: missing required key 'id'",
            "6:39: rules[0].actions[0].scale_rollout_batch.factor: "
            "Input should be greater than 0, got 0",
            "6:47: rules[0].actions[0].scale_rollout_batch.max: "
            "Input should be a valid integer, got 2.5",
            "7:27: rules[0].actions[1].alert.severity: "
            "Input should be 'info', 'warning' or 'critical', got 'loud'",
        ],
    ),
    (
        "wrong version, empty actions",
        """version: 2
rules:
  - id: a
    metric: m
    when: "> 1"
    actions: []
""",
        [
            "1:10: version: Input should be 1, got 2",
            "6:14: [a] actions: List should have at least 1 item after validation, not 0",
        ],
    ),
    ("empty file", "", ["1:1: empty file; expected 'version: 1' and 'rules'"]),
]


@pytest.mark.parametrize(
    ("text", "expected"), [case[1:] for case in BAD_FILES], ids=[case[0] for case in BAD_FILES]
)
def test_bad_file(text: str, expected: list[str]) -> None:
    assert [str(p).removeprefix("bad.yaml:") for p in problems(text)] == expected


def test_all_problems_are_reported_at_once() -> None:
    text = """version: 1
rules:
  - id: unknown-key
    metric: m
    when: "> 1"
    treshold: 2
    actions: [{stop: {}}]
  - id: unknown-action
    metric: m
    when: "> 1"
    actions: [{restart: {}}]
  - id: bad-when
    metric: m
    when: "> one"
    actions: [{stop: {}}]
  - id: short-window
    metric: m
    over_steps: {window: 1, stat: std}
    when: "> 1"
    actions: [{stop: {}}]
  - id: unknown-key
    metric: m
    when: "> 1"
    actions: [{stop: {}}]
  - id: worst
    metric: m
    across_ranks: worst
    when: "== 1"
    actions: [{stop: {}}]
"""
    with pytest.raises(RulesFileError) as caught:
        parse_rules(text, "rules.yaml")
    found = [(p.line, p.rule_id, p.message.split(":")[0]) for p in caught.value.problems]
    assert found == [
        (6, "unknown-key", "unknown key 'treshold'; expected one of"),
        (11, "unknown-action", "actions[0]"),
        (14, "bad-when", "when"),
        (18, "short-window", "over_steps.window"),
        (21, "unknown-key", "id"),
        (28, "worst", "when"),
    ]
    lines = str(caught.value).splitlines()
    assert len(lines) == 6
    assert lines[0].startswith("rules.yaml:6:5: [unknown-key] unknown key 'treshold'")
    assert lines[5] == (
        "rules.yaml:28:11: [worst] when: across_ranks 'worst' needs a >, >=, < or <= "
        "condition, got '== 1'"
    )


def test_rules_file_error_is_a_rules_error_and_a_value_error() -> None:
    with pytest.raises(RulesFileError) as caught:
        parse_rules("version: 1\nrules: 3\n")
    assert isinstance(caught.value, RulesError)
    assert isinstance(caught.value, ValueError)
    assert caught.value.problems == [
        RuleProblem("<string>", 2, 8, None, "rules: Input should be a valid list, got 3")
    ]
