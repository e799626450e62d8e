"""``rlpulse config show``: the effective settings and where each value came from."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from rlpulse.cli.common import ConfigFile, fail, one_line_errors, out, settings
from rlpulse.settings import explain, masked

config_app = typer.Typer(help="The settings rlpulse runs with.", no_args_is_help=True)


@config_app.command("show")
@one_line_errors
def show(
    assignments: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Set a value as a flag would, e.g. --set worker.grace_s=5 (repeatable).",
            metavar="NAME=VALUE",
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="One JSON object per setting.")
    ] = False,
    config: ConfigFile = None,
) -> None:
    """Print every setting: its value (secrets masked) and its source.

    Sources, highest first: flag (here: --set), env RLPULSE_..., the config file, default.
    """
    flags: dict[str, str] = {}
    for assignment in assignments or []:
        name, sep, value = assignment.partition("=")
        if not sep or not name.strip():
            raise fail(f"--set takes NAME=VALUE, got {assignment!r}")
        flags[name.strip()] = value
    values = masked(settings(config, flags))
    origins = explain(flags, config)
    if json_output:
        for name, value in values.items():
            typer.echo(json.dumps({"name": name, "value": value, "source": origins[name]}))
        return
    table = Table("setting", "value", "source", box=None, pad_edge=False)
    for name, value in values.items():
        table.add_row(name, json.dumps(value), origins.get(name, "default"))
    out.print(table)
