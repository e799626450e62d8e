"""A copy of the packaged Avro schemas with one record changed: how a schema change looks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from rlpulse.schemas.codec import Codec, SchemaRegistry, default_codec


def codec_with_new_field(
    directory: Path, record: str, field: dict[str, Any], inside: str | None = None
) -> Codec:
    """A codec whose newest ``record`` schema (a new version) has ``field`` added.

    ``inside``: the name of a field of ``record`` whose array items get the field instead
    (LogBatch's ``entries``).
    """
    latest = default_codec().registry.latest(record)
    shutil.copytree(Path(latest.path).parent, directory)
    schema = json.loads(Path(latest.path).read_text())
    target = schema
    if inside is not None:
        target = next(f for f in schema["fields"] if f["name"] == inside)["type"]["items"]
    target["fields"].append(field)
    (directory / f"{record}.v{latest.version + 1}.avsc").write_text(json.dumps(schema))
    return Codec(SchemaRegistry(directory))
