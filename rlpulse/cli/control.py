"""``rlpulse control stop|checkpoint|scale RUN``: act on a run by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlpulse.cli.common import Bootstrap, ConfigFile, Prefix, one_line_errors, out, settings
from rlpulse.ops.commands import action, operator_command, publish_command
from rlpulse.schemas.records import Action

control_app = typer.Typer(
    help="Act on a run by hand: publish an operator ControlCommand.", no_args_is_help=True
)

Attempt = Annotated[int, typer.Option(help="The run attempt the command is for.")]
Reason = Annotated[str | None, typer.Option(help="Why; shown to whoever reads the command.")]


def _send(
    run_id: str,
    actions: list[Action],
    bootstrap: str | None,
    prefix: str | None,
    config: Path | None,
    attempt: int,
    reason: str | None,
) -> None:
    chosen = settings(config, {"bootstrap": bootstrap, "prefix": prefix})
    command = operator_command(run_id, actions, attempt=attempt, reason=reason)
    publish_command(chosen, command)
    out.print(f"sent {command['command_id']} to {run_id} (attempt {attempt}): {command['reason']}")


@control_app.command("stop")
@one_line_errors
def control_stop(
    run_id: Annotated[str, typer.Argument(help="The run to stop.")],
    checkpoint: Annotated[bool, typer.Option(help="Save a checkpoint before stopping.")] = True,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    attempt: Attempt = 0,
    reason: Reason = None,
    config: ConfigFile = None,
) -> None:
    """Stop a run at its next step (after a checkpoint unless --no-checkpoint)."""
    actions = [action("checkpoint", tag="operator_stop")] if checkpoint else []
    _send(run_id, [*actions, action("stop")], bootstrap, prefix, config, attempt, reason)


@control_app.command("checkpoint")
@one_line_errors
def control_checkpoint(
    run_id: Annotated[str, typer.Argument(help="The run to checkpoint.")],
    tag: Annotated[str, typer.Option(help="Tag of the checkpoint.")] = "operator",
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    attempt: Attempt = 0,
    reason: Reason = None,
    config: ConfigFile = None,
) -> None:
    """Save a checkpoint at the run's next step."""
    _send(run_id, [action("checkpoint", tag=tag)], bootstrap, prefix, config, attempt, reason)


@control_app.command("scale")
@one_line_errors
def control_scale(
    run_id: Annotated[str, typer.Argument(help="The run whose rollout batch to scale.")],
    factor: Annotated[float, typer.Option(help="Multiply the rollout batch by this.")],
    min_batch: Annotated[int | None, typer.Option("--min", help="Lower bound.")] = None,
    max_batch: Annotated[int | None, typer.Option("--max", help="Upper bound.")] = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    attempt: Attempt = 0,
    reason: Reason = None,
    config: ConfigFile = None,
) -> None:
    """Scale the rollout batch: new = clamp(round(current * factor), min, max)."""
    scale = action("scale_rollout_batch", factor=factor, min=min_batch, max=max_batch)
    _send(run_id, [scale], bootstrap, prefix, config, attempt, reason)
