"""The ``rlpulse`` command line: one module per command, each thin over a library function.

``rlpulse worker`` is :mod:`rlpulse.cli.worker`, ``rlpulse rules ...`` is
:mod:`rlpulse.cli.rules`, and so on. Heavy imports (faust, the worker) happen inside the
commands that need them, so ``rlpulse broker ...`` starts quickly.
"""

from __future__ import annotations

from typing import Annotated

import typer

from rlpulse import __version__
from rlpulse.cli.agent import agent
from rlpulse.cli.aggregate import aggregate
from rlpulse.cli.archive import archive_app
from rlpulse.cli.audit import audit
from rlpulse.cli.broker import broker_app
from rlpulse.cli.config import config_app
from rlpulse.cli.control import control_app
from rlpulse.cli.demo import demo
from rlpulse.cli.diagnose import diagnose
from rlpulse.cli.exporter import exporter
from rlpulse.cli.index import index
from rlpulse.cli.query import query
from rlpulse.cli.rules import rules_app
from rlpulse.cli.search import search_app
from rlpulse.cli.show import show
from rlpulse.cli.spool import spool_app, spool_send
from rlpulse.cli.trace import trace_app
from rlpulse.cli.ui import ui
from rlpulse.cli.worker import worker
from rlpulse.diagnostics import install as install_diagnostics

__all__ = ["app", "main"]

app = typer.Typer(
    help="Telemetry and closed-loop control for LLM RL post-training.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"rlpulse {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print rlpulse's version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """Telemetry and closed-loop control for LLM RL post-training."""
    install_diagnostics()


app.add_typer(broker_app, name="broker")
app.add_typer(search_app, name="search")
app.add_typer(control_app, name="control")
app.add_typer(rules_app, name="rules", help="Check, backtest and publish rules files.")
app.add_typer(config_app, name="config")
app.command("worker")(worker)
app.command("exporter")(exporter)
app.command("demo")(demo)
app.command("agent")(agent)
app.command(
    "replay",
    deprecated=True,
    help="Deprecated: the old spelling of `rlpulse spool send [DIR]`, which it runs.",
)(spool_send)
app.add_typer(spool_app, name="spool")
app.command("aggregate")(aggregate)
app.add_typer(archive_app, name="archive")
app.command("index")(index)
app.add_typer(trace_app, name="trace")
app.command("query")(query)
app.command("diagnose")(diagnose)
app.command("show")(show)
app.command("audit")(audit)
app.command("ui")(ui)


def main() -> None:
    """Entry point of the ``rlpulse`` script."""
    app()
