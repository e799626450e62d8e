"""The ``rlpulse`` command line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from rlpulse.aggregate import aggregate_command
from rlpulse.backtest import backtest_command
from rlpulse.broker import DEFAULT_PORT, LocalBroker
from rlpulse.cli_rules import rules_app
from rlpulse.exceptions import RlpulseError

if TYPE_CHECKING:
    from rlpulse.schemas.records import Action

app = typer.Typer(
    help="Telemetry and closed-loop control for LLM RL post-training.",
    no_args_is_help=True,
    add_completion=False,
)
broker_app = typer.Typer(
    help="A local Apache Kafka broker (KRaft) on 127.0.0.1.", no_args_is_help=True
)
app.add_typer(broker_app, name="broker")
control_app = typer.Typer(
    help="Act on a run by hand: publish an operator ControlCommand.", no_args_is_help=True
)
app.add_typer(control_app, name="control")
rules_app.command("backtest")(backtest_command)
app.add_typer(rules_app, name="rules", help="Check, backtest and publish rules files.")
app.command("aggregate")(aggregate_command)

err = Console(stderr=True)
out = Console()

StateDir = Annotated[
    Path | None,
    typer.Option(help="Where the broker keeps its state (default: $RLPULSE_HOME/broker)."),
]
Bootstrap = Annotated[
    str | None,
    typer.Option(help="Kafka bootstrap servers (default: $RLPULSE_BOOTSTRAP or the local broker)."),
]


def _fail(message: str) -> typer.Exit:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    return typer.Exit(1)


@broker_app.command("up")
def broker_up(
    port: Annotated[
        int, typer.Option(help="Client port; the controller uses port + 1.")
    ] = DEFAULT_PORT,
    state_dir: StateDir = None,
) -> None:
    """Start the local broker (or report the running one)."""
    broker = LocalBroker(state_dir=state_dir, port=port)
    try:
        info = broker.up(progress=lambda msg: err.print(f"[dim]{msg}…[/]"))
    except RlpulseError as exc:
        raise _fail(str(exc)) from None
    out.print(f"Kafka {info.kafka_version} is up at [bold]{info.bootstrap}[/] (pid {info.pid})")


@broker_app.command("down")
def broker_down(state_dir: StateDir = None) -> None:
    """Stop the local broker: SIGTERM, then SIGKILL after 30 s."""
    stopped = LocalBroker(state_dir=state_dir).down()
    out.print("Kafka stopped" if stopped else "Kafka was not running")


@broker_app.command("status")
def broker_status(state_dir: StateDir = None) -> None:
    """Say whether the local broker is up and where; exit 1 if it is down."""
    broker = LocalBroker(state_dir=state_dir)
    out.print(broker.status(), highlight=False)
    if broker.info() is None:
        raise typer.Exit(1)


@app.command()
def worker(
    bootstrap: Bootstrap = None,
    prefix: Annotated[str, typer.Option(help="Topic prefix.")] = "rlpulse",
    rules: Annotated[
        str,
        typer.Option(
            help="'topic': the rules published with `rlpulse rules publish` (seed until then); "
            "a rules file (reloaded on change and SIGHUP); or a preset name."
        ),
    ] = "topic",
    partitions: Annotated[int, typer.Option(help="Partitions of the run-keyed topics.")] = 6,
    grace: Annotated[float, typer.Option(help="Seconds to wait for missing ranks.")] = 30.0,
    late_window: Annotated[
        float, typer.Option(help="Seconds a closed step still takes late ranks (as revisions).")
    ] = 600.0,
    metrics_port: Annotated[int | None, typer.Option(help="Serve Prometheus /metrics.")] = None,
    data_dir: Annotated[
        Path | None, typer.Option(help="faust's data directory (default: under $RLPULSE_HOME).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="faust log level.")] = "warning",
) -> None:
    """Run a stream worker: step joiner and rule engine."""
    from rlpulse.broker import default_cache_dir
    from rlpulse.config import resolve_bootstrap
    from rlpulse.rules import RulesError, load_rules_source
    from rlpulse.streams.app import RULES_FROM_TOPIC, run_worker
    from rlpulse.streams.settings import WorkerSettings

    if rules != RULES_FROM_TOPIC:
        try:
            load_rules_source(rules)
        except RulesError as exc:
            raise _fail(str(exc)) from None
    settings = WorkerSettings(
        bootstrap_servers=resolve_bootstrap(bootstrap),
        topic_prefix=prefix,
        partitions=partitions,
        grace_s=grace,
        late_window_s=late_window,
        metrics_port=metrics_port,
        data_dir=str(data_dir or default_cache_dir() / "worker-data" / prefix),
    )
    kafka = settings.bootstrap_servers
    err.print(f"[dim]worker {settings.group_id}: rules from {rules}, Kafka {kafka}[/]")
    run_worker(settings, rules, loglevel=log_level)


@app.command()
def demo(
    bootstrap: Bootstrap = None,
    step_interval: Annotated[float, typer.Option(help="Seconds between training steps.")] = 0.25,
) -> None:
    """Run a simulated 8-rank training run through the whole pipeline."""
    from rlpulse.demo import run_demo

    try:
        code = run_demo(bootstrap=bootstrap, step_interval_s=step_interval, console=out)
    except RlpulseError as exc:
        raise _fail(str(exc)) from None
    raise typer.Exit(code)


Prefix = Annotated[str, typer.Option(help="Topic prefix.")]
Attempt = Annotated[int, typer.Option(help="The run attempt the command is for.")]
Reason = Annotated[str | None, typer.Option(help="Why; shown to whoever reads the command.")]


def _send_operator_command(
    run_id: str,
    actions: list[Action],
    bootstrap: str | None,
    prefix: str,
    attempt: int,
    reason: str | None,
) -> None:
    from rlpulse.config import resolve_bootstrap
    from rlpulse.operator import operator_command, publish_command
    from rlpulse.producers import ProducerConfig

    config = ProducerConfig(bootstrap_servers=resolve_bootstrap(bootstrap), topic_prefix=prefix)
    command = operator_command(run_id, actions, attempt=attempt, reason=reason)
    try:
        publish_command(config, command)
    except TimeoutError as exc:
        raise _fail(str(exc)) from None
    out.print(f"sent {command['command_id']} to {run_id} (attempt {attempt}): {command['reason']}")


@control_app.command("stop")
def control_stop(
    run_id: Annotated[str, typer.Argument(help="The run to stop.")],
    checkpoint: Annotated[bool, typer.Option(help="Save a checkpoint before stopping.")] = True,
    bootstrap: Bootstrap = None,
    prefix: Prefix = "rlpulse",
    attempt: Attempt = 0,
    reason: Reason = None,
) -> None:
    """Stop a run at its next step (after a checkpoint unless --no-checkpoint)."""
    from rlpulse.operator import action

    actions = [action("checkpoint", tag="operator_stop")] if checkpoint else []
    _send_operator_command(run_id, [*actions, action("stop")], bootstrap, prefix, attempt, reason)


@control_app.command("checkpoint")
def control_checkpoint(
    run_id: Annotated[str, typer.Argument(help="The run to checkpoint.")],
    tag: Annotated[str, typer.Option(help="Tag of the checkpoint.")] = "operator",
    bootstrap: Bootstrap = None,
    prefix: Prefix = "rlpulse",
    attempt: Attempt = 0,
    reason: Reason = None,
) -> None:
    """Save a checkpoint at the run's next step."""
    from rlpulse.operator import action

    _send_operator_command(
        run_id, [action("checkpoint", tag=tag)], bootstrap, prefix, attempt, reason
    )


@control_app.command("scale")
def control_scale(
    run_id: Annotated[str, typer.Argument(help="The run whose rollout batch to scale.")],
    factor: Annotated[float, typer.Option(help="Multiply the rollout batch by this.")],
    min_batch: Annotated[int | None, typer.Option("--min", help="Lower bound.")] = None,
    max_batch: Annotated[int | None, typer.Option("--max", help="Upper bound.")] = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = "rlpulse",
    attempt: Attempt = 0,
    reason: Reason = None,
) -> None:
    """Scale the rollout batch: new = clamp(round(current * factor), min, max)."""
    from rlpulse.operator import action

    scale = action("scale_rollout_batch", factor=factor, min=min_batch, max=max_batch)
    _send_operator_command(run_id, [scale], bootstrap, prefix, attempt, reason)


@app.command()
def replay(
    directory: Annotated[
        Path | None, typer.Argument(help="A spool directory (default: every run's spool).")
    ] = None,
    bootstrap: Bootstrap = None,
    prefix: Annotated[
        str | None, typer.Option(help="Send to <prefix>.events instead of the spooled topic.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait per spool file.")] = 60.0,
) -> None:
    """Send the events a trainer process left in its spool (e.g. after it was killed)."""
    from rlpulse.producers.config import default_spool_root
    from rlpulse.replay import replay_command

    raise typer.Exit(replay_command(directory or default_spool_root(), bootstrap, prefix, timeout))


def main() -> None:
    """Entry point of the ``rlpulse`` script."""
    app()
