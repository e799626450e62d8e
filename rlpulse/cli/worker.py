"""``rlpulse worker``: run a stream worker (step joiner and rule engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from rlpulse.cli.common import (
    Bootstrap,
    ConfigFile,
    Prefix,
    StartupTimeoutAlias,
    alias,
    command_settings,
    one_line_errors,
    say,
    setting_option,
)
from rlpulse.transport.bootstrap import bootstrap_servers


@one_line_errors
def worker(
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    rules: Annotated[
        str | None,
        setting_option("worker.rules"),
    ] = None,
    partitions: Annotated[int | None, setting_option("worker.partitions")] = None,
    grace_s: Annotated[
        float | None,
        setting_option("worker.grace_s", "--grace-s"),
    ] = None,
    late_window_s: Annotated[
        float | None,
        setting_option(
            "worker.late_window_s",
            "--late-window-s",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        setting_option("worker.metrics_port", unset="off"),
    ] = None,
    metrics_host: Annotated[str | None, setting_option("worker.metrics_host")] = None,
    data_dir: Annotated[
        Path | None,
        setting_option("worker.data_dir", shown=lambda s: s.worker_data_dir),
    ] = None,
    startup_timeout_s: Annotated[
        float | None,
        setting_option("worker.startup_timeout_s", "--startup-timeout-s"),
    ] = None,
    log_level: Annotated[str | None, setting_option("worker.log_level")] = None,
    config: ConfigFile = None,
    grace: Annotated[float | None, alias("--grace", of="grace_s")] = None,
    late_window: Annotated[float | None, alias("--late-window", of="late_window_s")] = None,
    startup_timeout: StartupTimeoutAlias = None,
) -> None:
    """Run a stream worker: step joiner and rule engine, until SIGTERM or SIGINT."""
    from rlpulse.cli.rules import refuse_rules
    from rlpulse.rules.exceptions import RulesFileError
    from rlpulse.rules.loader import load_rules_source
    from rlpulse.streams.rulebook import RULES_FROM_TOPIC
    from rlpulse.streams.worker.run import run_worker

    chosen = command_settings(worker, locals())
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
