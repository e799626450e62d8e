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
    assert [rule.id for rule in seed.rules] == ["unstable-reward", "kl-guard", "run-silent"]
    assert seed.model_dump()["rules"] == [
        {
            "id": "unstable-reward",
            "description": None,
            "metric": "reward_mean",
            "silent": None,
            "missing_ranks": None,
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
            "expect": {
                "metric": None,
                "stage": None,
                "across_ranks": None,
                "over_steps": {"window": 5, "stat": "var"},
                "when": "<= 0.5",
                "within_steps": 10,
            },
        },
        {
            "id": "kl-guard",
            "description": None,
            "metric": "kl_divergence",
            "silent": None,
            "missing_ranks": None,
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
            "expect": None,
        },
        {
            "id": "run-silent",
            "description": None,
            "metric": None,
            "silent": {"factor": 5.0, "floor_s": 300.0},
            "missing_ranks": None,
            "stage": None,
            "across_ranks": "mean",
            "over_steps": None,
            "when": None,
            "for_steps": 1,
            "cooldown_steps": 0,
            "once": False,
            "mode": "enforce",
            "match": None,
            "actions": [
                {
                    "alert": {
                        "severity": "critical",
                        "message": "The run stopped starting steps: see the stacks of its ranks "
                        "(rlpulse show RUN --stacks).",
                    }
                },
                {"capture_stacks": {"wait_s": None}},
            ],
            "expect": None,
        },
    ]
    for rule in seed.rules:
        assert re.fullmatch(r"[0-9a-f]{12}", rule.version)


def test_every_preset_loads() -> None:
    for name in list_presets():
        assert isinstance(load_preset(name), RuleSet)


def test_unknown_preset() -> None:
    with pytest.raises(PresetNotFoundError, match="available: openrlhf, seed, trl, verl") as caught:
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


# -- bad files: tests/fixtures/rules/*.bad.yaml ---------------------------------------------

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rules"
WHEN_SYNTAX = (
    "expected '<op> <number>' with op one of > >= < <= == != (e.g. '> 0.5'), "
    "'outside [a, b]' or 'non_finite'"
)
QUOTE_HINT = "(quote values that start with '>', '|' or '!', e.g. when: \"> 0.5\")"
ACTIONS = "expected one of: stop, checkpoint, alert, capture_stacks, scale_rollout_batch, set"
RULE_KEYS = (
    "expected one of: across_ranks, actions, cooldown_steps, description, expect, for_steps, "
    "id, match, metric, missing_ranks, mode, once, over_steps, silent, stage, when"
)

# Every *.bad.yaml fixture -> its problems, exactly as reported after "<file>:".
EXPECTED_PROBLEMS: dict[str, list[str]] = {
    "bad-yaml.bad.yaml": [
        "9:3: invalid YAML: while parsing a flow sequence started on line 8; "
        "expected ',' or ']', but got '-'"
    ],
    "unquoted-when.bad.yaml": [
        "6:13: invalid YAML: while scanning a block scalar; expected a comment or a line "
        f"break, but found '0' {QUOTE_HINT}"
    ],
    "unquoted-not-equal.bad.yaml": [
        f"7:11: invalid YAML: could not determine a constructor for the tag '!=' {QUOTE_HINT}"
    ],
    "unknown-key.bad.yaml": [
        "9:5: [unstable-reward] unknown key 'cooldown'; did you mean 'cooldown_steps'?"
    ],
    "wrong-type.bad.yaml": ["7:16: [kl-guard] for_steps must be an integer, got 'three'"],
    "unknown-action.bad.yaml": [
        f"10:9: [kl-guard] actions[1]: unknown action 'restart'; {ACTIONS}"
    ],
    "bad-when.bad.yaml": [f"6:11: [kl-band] when: cannot parse '> 0.1 and < 0.3'; {WHEN_SYNTAX}"],
    "std-window.bad.yaml": [
        "6:37: [reward-noise] over_steps.window must be >= 2 for stat 'std' "
        "(a spread needs at least 2 values), got 1"
    ],
    "var-window.bad.yaml": [
        "8:15: [unstable-reward] over_steps.window must be >= 2 for stat 'var' "
        "(a spread needs at least 2 values), got 1"
    ],
    "worst-equals.bad.yaml": [
        "7:11: [rank-dead] when: across_ranks 'worst' needs a >, >=, < or <= condition, got '== 0'"
    ],
    "negative-cooldown.bad.yaml": ["8:21: [unstable-reward] cooldown_steps must be >= 0, got -2"],
    "duplicate-id.bad.yaml": [
        "10:9: [kl-guard] id: duplicate rule id 'kl-guard' (first defined on line 4)"
    ],
    "stop-not-last.bad.yaml": [
        "8:14: [kl-guard] actions: stop must be the last action: actions[1] (checkpoint) "
        "after it would never run"
    ],
    "many-problems.bad.yaml": [
        f"7:5: [unknown-key] unknown key 'treshold'; {RULE_KEYS}",
        "13:11: [wrong-type] once must be true or false, got 'yes'",
        f"19:15: [unknown-action] actions[0]: unknown action 'restart'; {ACTIONS}",
        f"23:11: [bad-when] when: cannot parse '> one'; {WHEN_SYNTAX}",
        "28:26: [short-std-window] over_steps.window must be >= 2 for stat 'std' "
        "(a spread needs at least 2 values), got 1",
        "35:11: [worst-equals] when: across_ranks 'worst' needs a >, >=, < or <= "
        "condition, got '== 1'",
        "41:21: [negative-cooldown] cooldown_steps must be >= 0, got -2",
        "44:9: [unknown-key] id: duplicate rule id 'unknown-key' (first defined on line 4)",
    ],
}


def test_every_bad_fixture_has_its_expected_problems() -> None:
    assert sorted(path.name for path in FIXTURES.glob("*.bad.yaml")) == sorted(EXPECTED_PROBLEMS)


@pytest.mark.parametrize("name", sorted(EXPECTED_PROBLEMS))
def test_bad_fixture(name: str) -> None:
    path = FIXTURES / name
    with pytest.raises(RulesFileError) as caught:
        load_rules(path)
    assert [str(p).removeprefix(f"{path}:") for p in caught.value.problems] == (
        EXPECTED_PROBLEMS[name]
    )
    assert all(p.file == str(path) for p in caught.value.problems)


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.good.yaml")), ids=lambda p: p.name)
def test_good_fixture(path: Path) -> None:
    assert load_rules(path).rules


def test_every_feature_fixture_reads_as_written() -> None:
    ruleset = load_rules(FIXTURES / "every-feature.good.yaml")
    first, straggler, drift, nan = ruleset.rules
    assert first.metrics == ("reward_mean", "critic/score/mean", "reward")
    assert first.match is not None and first.match.tags == {"team": "post-training"}
    assert [a.type for a in first.actions] == ["scale_rollout_batch", "set", "alert"]
    assert straggler.across_ranks == "worst" and straggler.mode == "dry_run"
    assert drift.when == Outside(-4.0, 4.0)
    assert nan.when == NonFinite() and nan.actions[-1].type == "stop"  # `stop:` (null) is {}


# -- bad files: details ----------------------------------------------------------------------

# (name, file, expected problems as "line:column: [rule id] message")
BAD_FILES = [
    (
        "typo of a required key is one problem",
        """version: 1
rules:
  - id: a
    metrc: m
    when: "> 1"
    over_steps: {windw: 5, stat: var}
    actions: [{stop: {}}]
""",
        [
            "4:5: [a] unknown key 'metrc'; did you mean 'metric'?",
            "6:18: [a] over_steps: unknown key 'windw'; did you mean 'window'?",
        ],
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
            "7:15: [a] over_steps.window must be >= 3 for stat 'zscore' (a mean and std of the "
            "previous values), got 2"
        ],
    ),
    (
        "mean over one value",
        """version: 1
rules:
  - id: a
    metric: m
    over_steps: {window: 0, stat: mean}
    when: "> 1"
    actions: [{stop: {}}]
""",
        [
            "5:26: [a] over_steps.window must be >= 2 for stat 'mean' (a window of 1 is the "
            "value itself: leave out over_steps), got 0"
        ],
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
        "when is not a string",
        """version: 1
rules:
  - id: a
    metric: m
    when: 0.5
    actions: [{stop: {}}]
""",
        [f"5:11: [a] when must be a string (quote it in YAML), got 0.5; {WHEN_SYNTAX}"],
    ),
    (
        "metric aliases repeat a name",
        """version: 1
rules:
  - id: a
    metric: [kl, kl]
    when: "> 1"
    actions: [{stop: {}}]
""",
        [
            "4:13: [a] metric must be a metric name or a non-empty list of distinct names "
            "(aliases), got ['kl', 'kl']"
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
      - set: {key: lr, value: [1, 2]}
      - checkpoint: {tags: x}
""",
        [
            "3:5: rules[0]: missing required key 'id'",
            "6:39: rules[0].actions[0].scale_rollout_batch.factor must be > 0, got 0",
            "6:47: rules[0].actions[0].scale_rollout_batch.max must be an integer, got 2.5",
            "7:27: rules[0].actions[1].alert.severity must be 'info', 'warning' or "
            "'critical', got 'loud'",
            "8:31: rules[0].actions[2].set.value must be a string, a finite number, true, false "
            "or null, got [1, 2]",
            "9:22: rules[0].actions[3].checkpoint: unknown key 'tags'; did you mean 'tag'?",
        ],
    ),
    (
        "an action that is not a one-key mapping",
        """version: 1
rules:
  - id: a
    metric: m
    when: "> 1"
    actions: [stop, {checkpoint: {}, stop: {}}]
""",
        [
            "6:15: [a] actions[0]: an action is a one-key mapping such as {stop: {}} or "
            "{checkpoint: {tag: best}}, got 'stop'",
            "6:21: [a] actions[1]: an action is a one-key mapping such as {stop: {}} or "
            "{checkpoint: {tag: best}}, got {'checkpoint': {}, 'stop': {}}",
        ],
    ),
    (
        "wrong version, empty actions, misspelt enum",
        """version: 2
rules:
  - id: a
    metric: m
    across_ranks: median
    when: "> 1"
    actions: []
""",
        [
            "1:10: version must be 1, got 2",
            "5:19: [a] across_ranks must be 'mean', 'min', 'max', 'sum', 'std' or 'worst', "
            "got 'median'",
            "7:14: [a] actions must not be empty",
        ],
    ),
    (
        "rules that are not mappings",
        """version: 1
rules: [kl-guard, null]
""",
        [
            "2:9: rules[0] must be a mapping, got 'kl-guard'",
            "2:19: rules[1] must be a mapping, got None",
        ],
    ),
    (
        "not a mapping at all",
        "- version: 1\n",
        ["1:1: expected a mapping with 'version: 1' and 'rules', got [{'version': 1}]"],
    ),
    (
        "a long value is shortened",
        """version: 1
rules:
  - id: a
    metric: m
    when: "> 1"
    stage: {name: rollout, ranks: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]}
    actions: [{stop: {}}]
""",
        [
            "6:12: [a] stage must be a string, got {'name': 'rollout', 'ranks': [0, 1, 2, 3, "
            "4, 5, 6, 7, 8, ..."
        ],
    ),
    ("empty file", "", ["1:1: empty file; expected 'version: 1' and 'rules'"]),
]


@pytest.mark.parametrize(
    ("text", "expected"), [case[1:] for case in BAD_FILES], ids=[case[0] for case in BAD_FILES]
)
def test_bad_file(text: str, expected: list[str]) -> None:
    assert [str(p).removeprefix("bad.yaml:") for p in problems(text)] == expected


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("version: 1\n# caf\xe9\n".encode("latin-1"))
    with pytest.raises(RulesFileError) as caught:
        load_rules(path)
    assert str(caught.value) == f"{path}:1:1: not UTF-8 text: invalid continuation byte"


def test_rules_file_error_is_a_rules_error_and_a_value_error() -> None:
    with pytest.raises(RulesFileError) as caught:
        parse_rules("version: 1\nrules: 3\n")
    assert isinstance(caught.value, RulesError)
    assert isinstance(caught.value, ValueError)
    assert caught.value.problems == [
        RuleProblem("<string>", 2, 8, None, "rules must be a list, got 3")
    ]
