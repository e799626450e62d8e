"""``rlpulse worker``: run a stream worker (step joiner and rule engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rlpulse.cli.common import (
    Bootstrap,
    ConfigFile,
    LogLevel,
    Prefix,
    StartupTimeout,
    one_line_errors,
    say,
    settings,
)
from rlpulse.transport.bootstrap import bootstrap_servers


@one_line_errors
def worker(
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    rules: Annotated[
        str | None,
        typer.Option(
            help="'topic': the rules published with `rlpulse rules publish` (seed until then); "
            "a rules file (reloaded on change and SIGHUP); or a preset name. Default: topic."
        ),
    ] = None,
    partitions: Annotated[
        int | None, typer.Option(help="Partitions of the run-keyed topics (default: 6).")
    ] = None,
    grace: Annotated[
        float | None, typer.Option(help="Seconds to wait for missing ranks (default: 30).")
    ] = None,
    late_window: Annotated[
        float | None,
        typer.Option(help="Seconds a closed step still takes late ranks (default: 600)."),
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus /metrics on this port (default: off).")
    ] = None,
    metrics_host: Annotated[
        str | None, typer.Option(help="Address /metrics listens on (default: 0.0.0.0).")
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="faust's data directory (default: $RLPULSE_HOME/worker-data/<group>)."),
    ] = None,
    startup_timeout: StartupTimeout = None,
    log_level: LogLevel = None,
    config: ConfigFile = None,
) -> None:
    """Run a stream worker: step joiner and rule engine, until SIGTERM or SIGINT."""
    from rlpulse.cli.rules import refuse_rules
    from rlpulse.rules.exceptions import RulesFileError
    from rlpulse.rules.loader import load_rules_source
    from rlpulse.streams.rulebook import RULES_FROM_TOPIC
    from rlpulse.streams.worker import run_worker

    chosen = settings(
        config,
        {
            "bootstrap": bootstrap,
            "prefix": prefix,
            "worker.rules": rules,
            "worker.partitions": partitions,
            "worker.grace_s": grace,
            "worker.late_window_s": late_window,
            "worker.metrics_port": metrics_port,
            "worker.metrics_host": metrics_host,
            "worker.data_dir": data_dir,
            "worker.startup_timeout_s": startup_timeout,
            "worker.log_level": log_level,
        },
    )
    if chosen.worker.rules != RULES_FROM_TOPIC:
        try:
            load_rules_source(chosen.worker.rules)  # refuse a bad file before connecting
        except RulesFileError as exc:
            raise refuse_rules(exc, f"not started: {chosen.worker.rules} has problems") from None
    say(
        f"worker {chosen.worker_group}: rules from {chosen.worker.rules}, "
        f"Kafka {bootstrap_servers(chosen)}"
    )
    run_worker(chosen, say)
