"""``rlpulse demo``: a simulated 8-rank run through the whole pipeline."""

from __future__ import annotations

from typing import Annotated

import typer

from rlpulse.cli.common import Bootstrap, ConfigFile, one_line_errors, out, settings


@one_line_errors
def demo(
    bootstrap: Bootstrap = None,
    step_interval: Annotated[float, typer.Option(help="Seconds between training steps.")] = 0.25,
    config: ConfigFile = None,
) -> None:
    """Run a simulated 8-rank training run through the whole pipeline."""
    from rlpulse.local.demo import run_demo

    code = run_demo(settings(config, {"bootstrap": bootstrap}), step_interval, console=out)
    raise typer.Exit(code)
