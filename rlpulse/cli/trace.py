"""``rlpulse trace new``: a fresh trace id for a launcher to export."""

from __future__ import annotations

import typer

from rlpulse.producers.caller.trace import new_trace_id

trace_app = typer.Typer(help="Trace ids for RLPULSE_TRACE_CONTEXT.", no_args_is_help=True)


@trace_app.command("new")
def trace_new() -> None:
    """Print a fresh trace id: export RLPULSE_TRACE_CONTEXT=$(rlpulse trace new)."""
    typer.echo(new_trace_id())
