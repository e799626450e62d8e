"""``rlpulse broker up|down|status``: the local Apache Kafka broker."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlpulse.cli.common import ConfigFile, one_line_errors, out, say, settings
from rlpulse.local.broker import LocalBroker

broker_app = typer.Typer(
    help="A local Apache Kafka broker (KRaft) on 127.0.0.1.", no_args_is_help=True
)

StateDir = Annotated[
    Path | None,
    typer.Option(help="Where the broker keeps its state (default: $RLPULSE_HOME/broker)."),
]


@broker_app.command("up")
@one_line_errors
def broker_up(
    port: Annotated[
        int | None,
        typer.Option(help="Client port, the controller's is port + 1 (default: 9092; 0: free)."),
    ] = None,
    state_dir: StateDir = None,
    config: ConfigFile = None,
) -> None:
    """Start the local broker (or report the running one)."""
    broker = LocalBroker(settings(config, {"broker.port": port}), state_dir=state_dir)
    info = broker.up(progress=lambda message: say(f"{message}…"))
    out.print(f"Kafka {info.kafka_version} is up at [bold]{info.bootstrap}[/] (pid {info.pid})")


@broker_app.command("down")
@one_line_errors
def broker_down(state_dir: StateDir = None, config: ConfigFile = None) -> None:
    """Stop the local broker: SIGTERM, then SIGKILL after 30 s."""
    stopped = LocalBroker(settings(config), state_dir=state_dir).down()
    out.print("Kafka stopped" if stopped else "Kafka was not running")


@broker_app.command("status")
@one_line_errors
def broker_status(state_dir: StateDir = None, config: ConfigFile = None) -> None:
    """Say whether the local broker is up and where; exit 1 if it is down."""
    broker = LocalBroker(settings(config), state_dir=state_dir)
    out.print(broker.status(), highlight=False)
    if broker.info() is None:
        raise typer.Exit(1)
