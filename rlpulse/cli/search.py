"""``rlpulse search up|down|status``: the local OpenSearch node (``rlpulse.local.opensearch``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlpulse.cli.common import (
    LOCAL_CONTROL_SKIPS,
    ConfigFile,
    command_settings,
    one_line_errors,
    out,
    say,
    setting_option,
    settings,
    state_dir_option,
)
from rlpulse.local.opensearch import LocalSearch

search_app = typer.Typer(
    help="A local single-node OpenSearch on 127.0.0.1 (the logs' search engine).",
    no_args_is_help=True,
)

StateDir = Annotated[Path | None, state_dir_option("the node", "search")]


@search_app.command("up")
@one_line_errors
def search_up(
    port: Annotated[int | None, setting_option("search.port")] = None,
    transport_port: Annotated[
        int | None,
        setting_option("search.transport_port"),
    ] = None,
    heap: Annotated[str | None, setting_option("search.heap", note="(512m, 1g)")] = None,
    state_dir: StateDir = None,
    config: ConfigFile = None,
) -> None:
    """Start the local OpenSearch node (or report the running one) and wait for its REST API."""
    chosen = command_settings(search_up, locals(), without=LOCAL_CONTROL_SKIPS)
    node = LocalSearch(chosen, state_dir=state_dir)
    info = node.up(progress=lambda message: say(f"{message}…"))
    out.print(
        f"OpenSearch {info.version} is up at [bold]{info.url}[/] "
        f"(pid {info.pid}, heap {info.heap})",
        highlight=False,
    )


@search_app.command("down")
@one_line_errors
def search_down(state_dir: StateDir = None, config: ConfigFile = None) -> None:
    """Stop the local OpenSearch node: SIGTERM, then SIGKILL after 30 s."""
    chosen = settings(config, without=LOCAL_CONTROL_SKIPS)
    stopped = LocalSearch(chosen, state_dir=state_dir).down()
    out.print("OpenSearch stopped" if stopped else "OpenSearch was not running")


@search_app.command("status")
@one_line_errors
def search_status(state_dir: StateDir = None, config: ConfigFile = None) -> None:
    """Say whether the local OpenSearch node is up and where; exit 1 if it is down."""
    chosen = settings(config, without=LOCAL_CONTROL_SKIPS)
    node = LocalSearch(chosen, state_dir=state_dir)
    out.print(node.status(), highlight=False, soft_wrap=True)
    if node.info() is None:
        raise typer.Exit(1)
