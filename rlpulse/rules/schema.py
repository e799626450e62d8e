"""The JSON Schema of rules files, generated from the pydantic models of :mod:`.model`.

Editors that speak JSON Schema (VS Code's YAML extension, JetBrains IDEs) complete keys and
show each field's description from it. The schema is committed as ``rules.schema.json``
next to this module; after a change to the models, refresh it with ``rlpulse rules schema
--output rlpulse/rules/rules.schema.json`` (without ``--output`` it prints the schema, for an
editor set up outside this repository; ``--check`` exits 1 if the file is stale).

The schema checks the shape of a file; the loader checks more (duplicate ids, ``a <= b`` in
``outside [a, b]``, ``stop`` last) and is the authority.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Final

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import CoreSchema

from rlpulse.rules.model import RuleSet

SCHEMA_PATH: Final = Path(__file__).with_name("rules.schema.json")
"""Where the committed schema lives (inside the package, next to this module)."""

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
TITLE: Final = "rlpulse rules file"
REFRESH_COMMAND: Final = "rlpulse rules schema --output rlpulse/rules/rules.schema.json"

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")  # :attr:`type` -> `type`


class _RulesSchemaGenerator(GenerateJsonSchema):
    """pydantic's generator without per-field titles ("For Steps"): descriptions say more."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        """Never: editors show the key and its description."""
        return False

    def generate(self, schema: CoreSchema, mode: Any = "validation") -> JsonSchemaValue:
        """The whole schema, with ``$schema`` and ``title`` first and plain-text descriptions."""
        generated = super().generate(schema, mode=mode)
        generated.pop("title", None)
        return {"$schema": DIALECT, "title": TITLE, **_plain(generated)}


def _plain(value: Any) -> Any:
    """Turn the reStructuredText of docstrings into the Markdown-ish text editors show."""
    if isinstance(value, dict):
        return {
            key: _plain_text(item)
            if key == "description" and isinstance(item, str)
            else _plain(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _plain_text(text: str) -> str:
    return _ROLE.sub(r"`\1`", text).replace("``", "`")


def rules_schema() -> dict[str, Any]:
    """The JSON Schema of a rules file, as a dict."""
    return RuleSet.model_json_schema(mode="validation", schema_generator=_RulesSchemaGenerator)


def schema_text() -> str:
    """The schema as it is committed: 2-space indented JSON and a final newline."""
    return json.dumps(rules_schema(), indent=2, ensure_ascii=False) + "\n"


def is_stale(path: Path = SCHEMA_PATH) -> bool:
    """Whether the file at ``path`` differs from what the models generate (or is missing)."""
    try:
        return path.read_text(encoding="utf-8") != schema_text()
    except FileNotFoundError:
        return True
