"""rules/rules.schema.json: generated from the models, committed, and agreeing with the loader."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from rlpulse.cli import app
from rlpulse.rules import schema
from rlpulse.rules.loader import list_presets
from tests.unit.test_rules_loader import EXPECTED_PROBLEMS, FIXTURES

PRESETS = Path(schema.__file__).with_name("presets")
# A test-only dependency without type stubs; imported by name so mypy needs none.
jsonschema = importlib.import_module("jsonschema")

# Bad fixtures the schema cannot see: YAML syntax (no document), and what only the loader
# checks (duplicate ids across rules, the order of actions).
LOADER_ONLY = {
    "bad-yaml.bad.yaml",
    "unquoted-when.bad.yaml",
    "unquoted-not-equal.bad.yaml",
    "duplicate-id.bad.yaml",
    "stop-not-last.bad.yaml",
}


def validator() -> Any:
    document = json.loads(schema.SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(document)
    return jsonschema.Draft202012Validator(document)


def read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_committed_schema_is_up_to_date() -> None:
    assert not schema.is_stale(), (
        f"{schema.SCHEMA_PATH.name} is stale: the rule models changed. "
        f"Refresh it with `{schema.REFRESH_COMMAND}` and commit it."
    )


def test_schema_has_a_dialect_a_title_and_descriptions() -> None:
    document = schema.rules_schema()
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert document["title"] == "rlpulse rules file"
    for name, definition in document["$defs"].items():
        assert definition.get("description"), name
        for key, field in definition.get("properties", {}).items():
            assert field.get("description"), f"{name}.{key}"
            assert "title" not in field, f"{name}.{key}"
            assert "``" not in field["description"] and ":attr:" not in field["description"]


@pytest.mark.parametrize("name", list_presets())
def test_presets_conform(name: str) -> None:
    errors = list(validator().iter_errors(read_yaml(PRESETS / f"{name}.yaml")))
    assert [error.message for error in errors] == []


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.good.yaml")), ids=lambda p: p.name)
def test_good_fixtures_conform(path: Path) -> None:
    assert [error.message for error in validator().iter_errors(read_yaml(path))] == []


@pytest.mark.parametrize("name", sorted(set(EXPECTED_PROBLEMS) - LOADER_ONLY))
def test_schema_refuses_what_the_loader_refuses(name: str) -> None:
    errors = list(validator().iter_errors(read_yaml(FIXTURES / name)))
    assert errors, f"{name} passes the schema"


def test_when_pattern_agrees_with_the_parser() -> None:
    check = validator()

    def conforms(when: object) -> bool:
        rule = {"id": "r", "metric": "m", "when": when, "actions": [{"stop": {}}]}
        return bool(check.is_valid({"version": 1, "rules": [rule]}))

    for good in ("> 0.5", ">=-1e3", " != 0 ", "outside [-1, 2.5]", "non_finite", "<.5"):
        assert conforms(good), good
    for bad in ("> one", "above 1", "0.5", ">", "outside [1]", "non-finite", 0.5):
        assert not conforms(bad), bad


def test_the_command_writes_checks_and_prints_the_schema(tmp_path: Path) -> None:
    stale = tmp_path / "rules.schema.json"
    stale.write_text("{}\n", encoding="utf-8")
    runner = CliRunner()
    checked = runner.invoke(app, ["rules", "schema", "--check", "--output", str(stale)])
    assert checked.exit_code == 1
    assert f"{stale} is stale; run `rlpulse rules schema --output {stale}`" in checked.output
    assert runner.invoke(app, ["rules", "schema", "--output", str(stale)]).exit_code == 0
    assert runner.invoke(app, ["rules", "schema", "--check", "--output", str(stale)]).exit_code == 0
    assert stale.read_text(encoding="utf-8") == schema.schema_text()
    missing = tmp_path / "none" / "rules.schema.json"
    absent = runner.invoke(app, ["rules", "schema", "--check", "--output", str(missing)])
    assert absent.exit_code == 1 and "does not exist" in absent.output
    unwritable = runner.invoke(app, ["rules", "schema", "--output", str(missing)])
    assert unwritable.exit_code == 1 and f"cannot write {missing}" in unwritable.output
    printed = runner.invoke(app, ["rules", "schema"])
    assert printed.exit_code == 0 and json.loads(printed.output) == schema.rules_schema()
