"""``rlpulse config show``: the effective settings and where each value came from."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from rlpulse.cli.common import ConfigFile, fail, one_line_errors, out, settings
from rlpulse.local.exceptions import LocalError
from rlpulse.local.java import find_java
from rlpulse.settings import Settings, explain, masked
from rlpulse.transport.bootstrap import BrokerRecord, bootstrap_servers, local_broker_dir

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
    An unset bootstrap shows the address clients use: the local broker's, else the default.
    The last row, ``java``, is not a setting: the Java the local services would run with.
    """
    flags: dict[str, str] = {}
    for assignment in assignments or []:
        name, sep, value = assignment.partition("=")
        if not sep or not name.strip():
            raise fail(f"--set takes NAME=VALUE, got {assignment!r}")
        flags[name.strip()] = value
    chosen = settings(config, flags)
    values = masked(chosen)
    origins = explain(flags, config)
    if chosen.bootstrap is None:
        values["bootstrap"], origins["bootstrap"] = _bootstrap_in_use(chosen)
    values["java"], origins["java"] = _java_in_use()
    if json_output:
        for name, value in values.items():
            typer.echo(json.dumps({"name": name, "value": value, "source": origins[name]}))
        return
    table = Table(box=None, pad_edge=False)
    table.add_column("setting", no_wrap=True, min_width=max(map(len, values)))
    table.add_column("value", overflow="fold")
    table.add_column("source", overflow="fold")
    for name, value in values.items():
        table.add_row(name, json.dumps(value), origins.get(name, "default"))
    out.print(table)


def _java_in_use() -> tuple[str, str]:
    """The Java ``rlpulse broker up`` would run, and how it was found (not a setting)."""
    try:
        java = find_java("the local services", LocalError)
    except LocalError as exc:
        return str(exc), "found: none (not a setting)"
    passed = "".join(f"; {note}" for note in java.notes)
    return java.describe(), f"found on this machine (not a setting){passed}"


def _bootstrap_in_use(chosen: Settings) -> tuple[str, str]:
    """What an unset ``bootstrap`` means now: the address clients use, and why."""
    record = BrokerRecord.read(local_broker_dir(chosen))
    if record is not None:
        return record.bootstrap, f"the local broker (pid {record.pid}, `rlpulse broker up`)"
    return bootstrap_servers(chosen), "default (no local broker running: 127.0.0.1:broker.port)"
