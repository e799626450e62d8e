"""``rlpulse agent``: run this host's agent in the foreground (by hand, systemd, a DaemonSet)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from rlpulse.cli.common import (
    Bootstrap,
    ConfigFile,
    Prefix,
    command_settings,
    one_line_errors,
    say,
    setting_option,
)


@one_line_errors
def agent(
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    spool_dir: Annotated[
        Path | None,
        setting_option("producer.spool_dir", "--spool-dir"),
    ] = None,
    hostname: Annotated[
        str | None,
        setting_option("producer.hostname", "--hostname"),
    ] = None,
    idle_exit_s: Annotated[
        float | None,
        setting_option(
            "agent.idle_exit_s",
            "--idle-exit-s",
        ),
    ] = None,
    config: ConfigFile = None,
) -> None:
    """Send every write-ahead log of this host to Kafka, a dead writer's too, until SIGTERM.

    Ranks start one by themselves (detached) when none runs; run it by hand, under systemd or
    in a DaemonSet to have one ready (set --idle-exit-s 0 there). Another agent already serving
    the same spool, host and cluster is left alone: this one exits at once, saying so.
    """
    from rlpulse.producers.delivery.agent_process import place_for, run_foreground

    chosen = command_settings(agent, locals())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    place = place_for(chosen)
    say(f"the agent's directory: {place.directory}")
    raise typer.Exit(run_foreground(chosen))
