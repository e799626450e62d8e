"""Read and validate rules files; every problem is reported at once with its position.

The YAML is composed into nodes first so that each problem -- a syntax error, a pydantic
validation error, a duplicate key or rule id -- points at ``file:line:column`` (1-based)
of the offending node, and names the rule when its id is known.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, get_args

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from rlpulse.rules.exceptions import PresetNotFoundError, RuleProblem, RulesFileError
from rlpulse.rules.model import RuleSet, choice_hint, closest, format_number, rule_set_model
from rlpulse.schemas import actions as action_contract
from rlpulse.schemas.actions import ActionContracts

Loc = tuple[int | str, ...]

_PRESET_SUFFIX = ".yaml"

_QUOTE_HINT = " (quote values that start with '>', '|' or '!', e.g. when: \"> 0.5\")"
_MAX_INPUT_TEXT = 60

# pydantic error type -> what the value must be; the message reads "<path> must be ..., got x"
_MUST_BE: Final[Mapping[str, str]] = MappingProxyType(
    {
        "int_type": "an integer",
        "int_parsing": "an integer",
        "int_from_float": "an integer",
        "float_type": "a number",
        "float_parsing": "a number",
        "finite_number": "a finite number",
        "bool_type": "true or false",
        "bool_parsing": "true or false",
        "string_type": "a string",
        "list_type": "a list",
        "dict_type": "a mapping",
        "model_type": "a mapping",
        "model_attributes_type": "a mapping",
        "string_too_short": "a non-empty string",
    }
)
_BOUNDS: Final[Mapping[str, tuple[str, str]]] = MappingProxyType(
    {
        "greater_than": (">", "gt"),
        "greater_than_equal": (">=", "ge"),
        "less_than": ("<", "lt"),
        "less_than_equal": ("<=", "le"),
    }
)


def load_rules(path: str | os.PathLike[str]) -> RuleSet:
    """Read and validate the rules file at ``path``; raises :class:`RulesFileError`.

    A file that cannot be read raises the ``OSError`` of reading it.
    """
    return _parse_bytes(Path(path).read_bytes(), os.fspath(path))


def _parse_bytes(raw: bytes, filename: str) -> RuleSet:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = RuleProblem(filename, 1, 1, None, f"not UTF-8 text: {exc.reason}")
        raise RulesFileError([problem]) from None
    return parse_rules(text, filename)


def list_presets() -> list[str]:
    """Names of the rule sets shipped in ``rlpulse/rules/presets``."""
    presets = resources.files("rlpulse.rules").joinpath("presets")
    return sorted(
        entry.name.removesuffix(_PRESET_SUFFIX)
        for entry in presets.iterdir()
        if entry.name.endswith(_PRESET_SUFFIX)
    )


def load_preset(name: str) -> RuleSet:
    """Load the shipped rule set ``presets/<name>.yaml`` (``seed``: the two seed rules)."""
    available = list_presets()
    if name not in available:
        raise PresetNotFoundError(name, available)
    resource = resources.files("rlpulse.rules").joinpath("presets", name + _PRESET_SUFFIX)
    return parse_rules(resource.read_text(encoding="utf-8"), f"<preset {name}>")


def load_rules_source(source: str | os.PathLike[str]) -> RuleSet:
    """Load ``source``: the path of a rules file if one exists there, else a preset name."""
    if Path(source).exists():
        return load_rules(source)
    return load_preset(os.fspath(source))


def read_rules_source(source: str | os.PathLike[str]) -> tuple[bytes, RuleSet]:
    """The text of ``source`` (a rules file if one exists there, else a preset) and its rules.

    Raises :class:`RulesFileError`, :class:`PresetNotFoundError` or the ``OSError`` of
    reading the file.
    """
    if Path(source).exists():
        raw = Path(source).read_bytes()
        return raw, _parse_bytes(raw, os.fspath(source))
    ruleset = load_preset(os.fspath(source))
    resource = resources.files("rlpulse.rules").joinpath("presets", f"{source}{_PRESET_SUFFIX}")
    return resource.read_bytes(), ruleset


def parse_rules(
    text: str, filename: str = "<string>", actions: ActionContracts | None = None
) -> RuleSet:
    """Validate the rules file ``text``; problems are reported against ``filename``.

    Its actions are those of ``actions`` (default: the action contract's ``ACTIONS``).
    """
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        raise RulesFileError([_yaml_problem(exc, filename)]) from None
    finally:
        loader.dispose()
    if root is None:
        problem = RuleProblem(filename, 1, 1, None, "empty file; expected 'version: 1' and 'rules'")
        raise RulesFileError([problem])

    problems = _duplicate_keys(root, data, filename) + _duplicate_ids(root, data, filename)
    try:
        model = rule_set_model(action_contract.ACTIONS if actions is None else actions)
        ruleset = model.model_validate(data)
    except ValidationError as exc:
        errors = [
            error
            for error in exc.errors(include_url=False)
            if error["type"] != "duplicate_rule_id"  # reported per rule by _duplicate_ids
        ]
        problems += [
            _validation_problem(error, root, data, filename) for error in _without_typos(errors)
        ]
    if problems:
        raise RulesFileError(sorted(problems, key=lambda p: (p.line, p.column)))
    return ruleset


# -- problems --------------------------------------------------------------------------------


def _yaml_problem(exc: yaml.MarkedYAMLError, filename: str) -> RuleProblem:
    mark, opened = exc.problem_mark or exc.context_mark, exc.context_mark
    line, column = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
    context = exc.context
    if context and opened is not None and opened.line + 1 != line:
        context += f" started on line {opened.line + 1}"
    what = "; ".join(part for part in (context, exc.problem) if part)
    if exc.context == "while scanning a block scalar" or "constructor for the tag" in what:
        what += _QUOTE_HINT
    return RuleProblem(filename, line, column, None, f"invalid YAML: {what}")


def _without_typos(errors: list[ErrorDetails]) -> list[ErrorDetails]:
    """Drop "missing key k" when an unknown key of the same mapping is a misspelling of k.

    ``windw: 5`` is one mistake; its "unknown key 'windw'; did you mean 'window'?" says it all.
    """
    misspelt: set[Loc] = set()
    for error in errors:
        if error["type"] == "extra_forbidden":
            parent, key = tuple(error["loc"][:-1]), str(error["loc"][-1])
            intended = closest(key, _allowed_keys(parent) or [])
            if intended is not None:
                misspelt.add((*parent, intended))
    return [e for e in errors if not (e["type"] == "missing" and tuple(e["loc"]) in misspelt)]


def _validation_problem(
    error: ErrorDetails, root: yaml.Node, data: Any, filename: str
) -> RuleProblem:
    loc: Loc = tuple(error["loc"])
    kind = error["type"]
    if kind in ("missing", "extra_forbidden"):
        parent, key = loc[:-1], loc[-1]
        if kind == "missing":
            message = f"missing required key {key!r}"
        else:
            message = f"unknown key {key!r}"
            if (allowed := _allowed_keys(parent)) is not None:
                message += choice_hint(str(key), allowed)
        node = _node_at(root, loc, key_node=True)
        return _problem(filename, node, data, parent, message)
    return _problem(filename, _node_at(root, loc), data, loc, _message(error, loc))


def _message(error: ErrorDetails, loc: Loc) -> str:
    """Say what is wrong with the value at ``loc``, in words a person writing YAML uses."""
    kind, ctx = error["type"], error.get("ctx", {})
    got = _input_text(error["input"])
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    if not loc and kind in ("model_type", "dict_type"):
        return f"expected a mapping with 'version: 1' and 'rules', got {got}"
    if kind in _MUST_BE:
        return f"must be {_MUST_BE[kind]}, got {got}"
    if kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        bound = ctx[key]
        shown = format_number(bound) if isinstance(bound, float) else str(bound)
        return f"must be {op} {shown}, got {got}"
    if kind == "literal_error":
        return f"must be {ctx['expected']}, got {got}"
    if kind == "too_short" and ctx.get("min_length") == 1:
        return "must not be empty"
    return f"{error['msg']}, got {got}"


def _input_text(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_INPUT_TEXT else text[: _MAX_INPUT_TEXT - 3] + "..."


def _problem(filename: str, node: yaml.Node, data: Any, loc: Loc, message: str) -> RuleProblem:
    """Make a problem at ``node``, naming the path of ``loc`` within its rule.

    ``must ...`` messages read as a sentence about the path (``cooldown_steps must be >= 0,
    got -2``); others follow it after a colon (``when: cannot parse 'x'; ...``).
    """
    rule_id = None
    path = loc
    if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
        rule_id = _rule_id(data, loc[1])
        path = loc[2:] if rule_id is not None else loc  # no id: say rules[3]
    prefix = _path_text(path)
    mark = node.start_mark
    if not prefix:
        text = message
    elif message.startswith("must "):
        text = f"{prefix} {message}"
    else:
        text = f"{prefix}: {message}"
    return RuleProblem(filename, mark.line + 1, mark.column + 1, rule_id, text)


def _rule_id(data: Any, index: int) -> str | None:
    try:
        rule_id = data["rules"][index]["id"]
    except (KeyError, IndexError, TypeError):
        return None
    return rule_id if isinstance(rule_id, str) and rule_id.strip() else None


def _path_text(path: Loc) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _duplicate_ids(root: yaml.Node, data: Any, filename: str) -> list[RuleProblem]:
    rules = data.get("rules") if isinstance(data, dict) else None
    if not isinstance(rules, list):
        return []
    first_line: dict[str, int] = {}
    problems = []
    for index, rule in enumerate(rules):
        rule_id = rule.get("id") if isinstance(rule, dict) else None
        if not isinstance(rule_id, str):
            continue
        node = _node_at(root, ("rules", index, "id"))
        if rule_id in first_line:
            message = f"duplicate rule id {rule_id!r} (first defined on line {first_line[rule_id]})"
            problems.append(_problem(filename, node, data, ("rules", index, "id"), message))
        else:
            first_line[rule_id] = node.start_mark.line + 1
    return problems


def _duplicate_keys(root: yaml.Node, data: Any, filename: str) -> list[RuleProblem]:
    problems = []
    for loc, node in _walk(root, ()):
        if not isinstance(node, yaml.MappingNode):
            continue
        first_line: dict[str, int] = {}
        for key_node, _ in node.value:
            key = str(key_node.value)
            if key in first_line:
                message = f"duplicate key {key!r} (first on line {first_line[key]})"
                problems.append(_problem(filename, key_node, data, loc, message))
            else:
                first_line[key] = key_node.start_mark.line + 1
    return problems


# -- navigating nodes and models -------------------------------------------------------------


def _walk(node: yaml.Node, loc: Loc) -> Iterator[tuple[Loc, yaml.Node]]:
    yield loc, node
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            yield from _walk(value_node, (*loc, str(key_node.value)))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            yield from _walk(item, (*loc, index))


def _node_at(root: yaml.Node, loc: Sequence[int | str], *, key_node: bool = False) -> yaml.Node:
    """Find the node at ``loc``, or the deepest one on the way if the rest is not in the file.

    With ``key_node``, a final mapping step stops at the key (for unknown or duplicate keys).
    """
    node = root
    for depth, part in enumerate(loc):
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if str(key.value) == str(part):
                    last = depth == len(loc) - 1
                    child = key if key_node and last else value
        elif (
            isinstance(node, yaml.SequenceNode)
            and isinstance(part, int)
            and 0 <= part < len(node.value)
        ):
            child = node.value[part]
        if child is None:
            return node
        node = child
    return node


def _allowed_keys(loc: Loc) -> list[str] | None:
    """Return the field names of the model validated at ``loc``, if it is one of ours."""
    model: type[BaseModel] | None = RuleSet
    for part in loc:
        if model is None:
            return None
        if isinstance(part, int):
            continue  # a list index: the items have the type the list was declared with
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field is not None else None
    return sorted(model.model_fields) if model is not None else None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (model := _model_in(arg)) is not None:
            return model
    return None
