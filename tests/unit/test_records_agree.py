"""The TypedDicts of :mod:`rlpulse.schemas.records` say what the ``.avsc`` files say.

The Avro schemas are the wire contract; the TypedDicts are what the type checker sees.
For each record of the newest schemas, top-level and nested, the TypedDict of the same
name must have the same fields with matching types: Avro ``string`` is ``str``, ``int``
and ``long`` are ``int``, ``float`` and ``double`` are ``float``, ``boolean`` is ``bool``,
``bytes`` is ``bytes``, a map is ``dict[str, ...]``, an array ``list[...]``, a nested
record its own TypedDict, an enum ``str`` or a ``Literal`` of its symbols, and a union
with ``null`` is ``X | None``. A field that an older version of its record lacks (added
later, with a default) is ``NotRequired``; every other field is required.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import (
    Any,
    Literal,
    NotRequired,
    TypedDict,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

import pytest

from rlpulse.schemas import records
from rlpulse.schemas.codec import _SHARED_LOG_FIELDS, RECORD_NAMES, SchemaRegistry

Lookup = Callable[[str], type | None]

_PRIMITIVES: dict[str, type] = {
    "null": type(None),
    "boolean": bool,
    "int": int,
    "long": int,
    "float": float,
    "double": float,
    "bytes": bytes,
    "string": str,
}


def _schema_files() -> list[Path]:
    return sorted(Path(str(resources.files("rlpulse.schemas").joinpath("avro"))).glob("*.avsc"))


def _short(name: str) -> str:
    """``dev.rlpulse.MetricStats`` -> ``MetricStats``."""
    return name.rsplit(".", 1)[-1]


def _named(schema: Any) -> Iterator[dict[str, Any]]:
    """Every named type (record, enum, fixed) defined in ``schema``, outermost first."""
    if isinstance(schema, list):
        for branch in schema:
            yield from _named(branch)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in ("record", "enum", "fixed"):
            yield schema
        if kind == "record":
            for field in schema["fields"]:
                yield from _named(field["type"])
        elif kind == "map":
            yield from _named(schema["values"])
        elif kind == "array":
            yield from _named(schema["items"])
        elif isinstance(kind, (dict, list)):
            yield from _named(kind)


def _added_later() -> dict[str, set[str]]:
    """Per record name (nested ones too), the fields of its newest version that an older lacks."""
    fields_by_version: dict[str, list[set[str]]] = {}
    newest: dict[str, set[str]] = {}
    registry = SchemaRegistry()
    for name in RECORD_NAMES:
        versions = registry.versions(name)
        for version in versions:
            for named in _named(json.loads(Path(version.path).read_text())):
                if named["type"] == "record":
                    fields = {field["name"] for field in named["fields"]}
                    fields_by_version.setdefault(_short(named["name"]), []).append(fields)
                    if version is versions[-1]:
                        newest[_short(named["name"])] = fields
    return {
        name: set.union(*(fields - older for older in fields_by_version[name]))
        for name, fields in newest.items()
    }


ADDED_LATER = _added_later()


def _records_typeddict(name: str) -> type | None:
    typed = getattr(records, name, None)
    return typed if isinstance(typed, type) and is_typeddict(typed) else None


def _describe(hint: Any) -> str:
    return getattr(hint, "__name__", None) or repr(hint)


def _type_problem(
    avro: Any, hint: Any, lookup: Lookup, named: dict[str, dict[str, Any]]
) -> str | None:
    """Why ``hint`` does not match the Avro type ``avro`` (None when it does)."""
    if isinstance(avro, str) and avro not in _PRIMITIVES:
        avro = named[_short(avro)]  # a reference to a named type defined earlier
    if isinstance(avro, dict) and avro["type"] in _PRIMITIVES:
        avro = avro["type"]  # {"type": "long", "logicalType": ...}
    if isinstance(avro, list):
        return _union_problem(avro, hint, lookup, named)
    if isinstance(avro, str):
        expected = _PRIMITIVES[avro]
        return None if hint is expected else f"Avro {avro} is {expected.__name__}, not {hint}"
    kind = avro["type"]
    if kind in ("record", "enum", "fixed"):
        named[_short(avro["name"])] = avro
    if kind == "map":
        if get_origin(hint) is not dict or get_args(hint)[0] is not str:
            return f"an Avro map is dict[str, ...], not {hint}"
        return _type_problem(avro["values"], get_args(hint)[1], lookup, named)
    if kind == "array":
        if get_origin(hint) is not list:
            return f"an Avro array is list[...], not {hint}"
        return _type_problem(avro["items"], get_args(hint)[0], lookup, named)
    if kind == "record":
        expected_td = lookup(_short(avro["name"]))
        if expected_td is None:
            return f"the Avro record {avro['name']} has no TypedDict of its name"
        return None if hint is expected_td else f"is {_describe(hint)}, not {avro['name']}"
    if kind == "enum":
        if hint is str:
            return None
        if get_origin(hint) is Literal and set(get_args(hint)) == set(avro["symbols"]):
            return None
        return f"the Avro enum {avro['name']} is str or Literal{avro['symbols']}, not {hint}"
    if kind == "fixed":
        return None if hint is bytes else f"the Avro fixed {avro['name']} is bytes, not {hint}"
    return f"unknown Avro type {avro!r}"


def _union_problem(
    avro: list[Any], hint: Any, lookup: Lookup, named: dict[str, dict[str, Any]]
) -> str | None:
    """Each branch of the Avro union matches one member of the Python union, and no more."""
    members = list(get_args(hint)) if get_origin(hint) is types.UnionType else [hint]
    nullable = "null" in avro
    if nullable != (type(None) in members):
        return (
            f"Avro {avro} is nullable, {hint} is not"
            if nullable
            else f"Avro {avro} is not nullable, {hint} is"
        )
    branches = [branch for branch in avro if branch != "null"]
    members = [member for member in members if member is not type(None)]
    if len(branches) != len(members):
        return f"Avro {avro} has {len(branches)} non-null branches, {hint} {len(members)}"
    for branch in branches:
        matches = [m for m in members if _type_problem(branch, m, lookup, dict(named)) is None]
        if not matches:
            return f"no member of {hint} matches the branch {branch!r} of Avro {avro}"
        members.remove(matches[0])
        _type_problem(branch, matches[0], lookup, named)  # keep the named types it defines
    return None


def disagreements(
    schema: dict[str, Any],
    lookup: Lookup,
    added_later: dict[str, set[str]],
) -> list[str]:
    """Every way the TypedDicts (found by ``lookup``) differ from the Avro record ``schema``.

    Nested records are compared with their own TypedDicts. Each line names the record and
    the field.
    """
    problems: list[str] = []
    named: dict[str, dict[str, Any]] = {}
    pending = [schema]
    done: set[str] = set()
    while pending:
        record = pending.pop(0)
        name = _short(record["name"])
        if name in done:
            continue
        done.add(name)
        named[name] = record
        typed = lookup(name)
        if typed is None:
            problems.append(f"{name}: the Avro record has no TypedDict of its name in records.py")
            continue
        hints = get_type_hints(typed, include_extras=True)
        avro_fields = {field["name"]: field for field in record["fields"]}
        for field in sorted(avro_fields.keys() - hints.keys()):
            problems.append(f"{name}.{field}: in the .avsc file, not in the TypedDict")
        for field in sorted(hints.keys() - avro_fields.keys()):
            problems.append(f"{name}.{field}: in the TypedDict, not in the .avsc file")
        later = added_later.get(name, set())
        for field_name, field in avro_fields.items():
            if field_name not in hints:
                continue
            hint = hints[field_name]
            not_required = get_origin(hint) is NotRequired
            if not_required:
                (hint,) = get_args(hint)
            if not_required and field_name not in later:
                problems.append(
                    f"{name}.{field_name}: NotRequired, but every version of the record has it"
                )
            elif field_name in later and not not_required:
                problems.append(
                    f"{name}.{field_name}: added by a later schema version, so NotRequired"
                )
            problem = _type_problem(field["type"], hint, lookup, named)
            if problem is not None:
                problems.append(f"{name}.{field_name}: {problem}")
        for nested in _named([field["type"] for field in record["fields"]]):
            if nested["type"] == "record":
                pending.append(nested)
    return problems


def test_every_schema_file_is_a_record_the_codec_knows() -> None:
    names = {path.name.split(".", 1)[0] for path in _schema_files()}
    assert names == set(RECORD_NAMES)


@pytest.mark.parametrize("name", RECORD_NAMES)
def test_typeddict_agrees_with_the_avro_record(name: str) -> None:
    schema = json.loads(Path(SchemaRegistry().latest(name).path).read_text())
    problems = disagreements(schema, _records_typeddict, ADDED_LATER)
    assert not problems, f"records.py disagrees with {name}.avsc:\n" + "\n".join(problems)


def test_every_public_typeddict_is_an_avro_record() -> None:
    avro_records = {
        _short(named["name"])
        for path in _schema_files()
        for named in _named(json.loads(path.read_text()))
        if named["type"] == "record"
    }
    typeddicts = {
        name
        for name in dir(records)
        if not name.startswith("_") and _records_typeddict(name) is not None
    }
    assert typeddicts - avro_records == set(records.READER_VIEWS), "TypedDicts with no Avro record"


def test_the_reader_views_are_their_batches_taken_apart() -> None:
    """A SampleText is a SampleTextBatch's shared fields and one entry; a RolloutSample has
    the columns of the archive's ``samples`` table (a row per sample of a chunk)."""
    from rlpulse.archive.tables import CLOCK_COLUMNS, KAFKA_COLUMNS, tables_of
    from rlpulse.schemas.codec import default_codec
    from rlpulse.schemas.topics import Topics

    text = get_type_hints(records.SampleText)
    batch = get_type_hints(records.SampleTextBatch)
    entry = get_type_hints(records.SampleTextEntry)
    assert text == {**{k: v for k, v in batch.items() if k != "entries"}, **entry}
    table = tables_of(Topics("p"), default_codec())["samples"].schema
    beside = {f.name for f in (*KAFKA_COLUMNS, *CLOCK_COLUMNS)} | {"decode_error", "raw_value"}
    assert set(get_type_hints(records.RolloutSample)) == set(table.names) - beside


# -- the checker itself finds what it should ---------------------------------------------------


class Inner(TypedDict):
    """A nested record of the wrong shape."""

    n: str


class Outer(TypedDict):
    """A record that disagrees with :data:`OUTER` in every way the test looks at."""

    same: int
    nullable: str
    not_nullable: int | None
    extra: str
    inner: list[Inner]
    kind: Literal["a", "c"]
    later: int
    early: NotRequired[int]
    params: dict[str, bool | int | None]


OUTER: dict[str, Any] = {
    "type": "record",
    "name": "dev.rlpulse.Outer",
    "fields": [
        {"name": "same", "type": "long"},
        {"name": "nullable", "type": ["null", "string"]},
        {"name": "not_nullable", "type": "int"},
        {"name": "missing", "type": "string"},
        {
            "name": "inner",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Inner",
                    "fields": [{"name": "n", "type": "long"}],
                },
            },
        },
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["a", "b"]}},
        {"name": "later", "type": "long", "default": 0},
        {"name": "early", "type": "long"},
        {"name": "params", "type": {"type": "map", "values": ["null", "boolean", "string"]}},
    ],
}


def test_the_checker_names_the_record_and_field_of_each_disagreement() -> None:
    lookup: dict[str, type] = {"Outer": Outer, "Inner": Inner}
    problems = disagreements(OUTER, lookup.get, {"Outer": {"later"}})
    assert [problem.split(":", 1)[0] for problem in problems] == [
        "Outer.missing",
        "Outer.extra",
        "Outer.nullable",
        "Outer.not_nullable",
        "Outer.kind",
        "Outer.later",
        "Outer.early",
        "Outer.params",
        "Inner.n",
    ]


def test_the_checker_accepts_what_agrees() -> None:
    class Fine(TypedDict):
        id: str
        tags: dict[str, str]
        value: float | None
        kind: str

    schema = {
        "type": "record",
        "name": "Fine",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "tags", "type": {"type": "map", "values": "string"}},
            {"name": "value", "type": ["null", "double"]},
            {"name": "kind", "type": {"type": "enum", "name": "K", "symbols": ["x"]}},
        ],
    }
    assert disagreements(schema, {"Fine": Fine}.get, {}) == []


def test_the_codec_splits_log_records_at_the_fields_a_batch_shares() -> None:
    shared = get_type_hints(records.LogBatch).keys() - {"entries"}
    assert set(_SHARED_LOG_FIELDS) == shared
    assert (
        shared | get_type_hints(records.LogEntry).keys() == get_type_hints(records.LogRecord).keys()
    )
