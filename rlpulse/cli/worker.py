"""``rlpulse worker``: run a stream worker (step joiner and rule engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from rlpulse.cli.common import (
    LOG_LEVEL_HELP,
    STARTUP_HELP,
    Bootstrap,
    ConfigFile,
    Prefix,
    StartupTimeoutAlias,
    alias,
    either,
    one_line_errors,
    say,
    setting_option,
    settings,
)
from rlpulse.transport.bootstrap import bootstrap_servers


@one_line_errors
def worker(
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    rules: Annotated[
        str | None,
        setting_option(
            "worker.rules",
            "'topic': the rules published with `rlpulse rules publish` (seed until then); "
            "a rules file (reloaded on change and SIGHUP); or a preset name.",
        ),
    ] = None,
    partitions: Annotated[
        int | None, setting_option("worker.partitions", "Partitions of the run-keyed topics.")
    ] = None,
    grace_s: Annotated[
        float | None,
        setting_option("worker.grace_s", "Seconds to wait for missing ranks.", "--grace-s"),
    ] = None,
    late_window_s: Annotated[
        float | None,
        setting_option(
            "worker.late_window_s",
            "Seconds a closed step still takes late ranks.",
            "--late-window-s",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        setting_option(
            "worker.metrics_port", "Serve Prometheus /metrics on this port.", unset="off"
        ),
    ] = None,
    metrics_host: Annotated[
        str | None, setting_option("worker.metrics_host", "Address /metrics listens on.")
    ] = None,
    data_dir: Annotated[
        Path | None,
        setting_option(
            "worker.data_dir", "faust's data directory.", shown=lambda s: s.worker_data_dir
        ),
    ] = None,
    startup_timeout_s: Annotated[
        float | None,
        setting_option("worker.startup_timeout_s", STARTUP_HELP, "--startup-timeout-s"),
    ] = None,
    log_level: Annotated[str | None, setting_option("worker.log_level", LOG_LEVEL_HELP)] = None,
    config: ConfigFile = None,
    grace: Annotated[float | None, alias("--grace")] = None,
    late_window: Annotated[float | None, alias("--late-window")] = None,
    startup_timeout: StartupTimeoutAlias = None,
) -> None:
    """Run a stream worker: step joiner and rule engine, until SIGTERM or SIGINT."""
    from rlpulse.cli.rules import refuse_rules
    from rlpulse.rules.exceptions import RulesFileError
    from rlpulse.rules.loader import load_rules_source
    from rlpulse.streams.rulebook import RULES_FROM_TOPIC
    from rlpulse.streams.worker.run import run_worker

    chosen = settings(
        config,
        {
            "bootstrap": bootstrap,
            "prefix": prefix,
            "worker.rules": rules,
            "worker.partitions": partitions,
            "worker.grace_s": either(grace_s, grace),
            "worker.late_window_s": either(late_window_s, late_window),
            "worker.metrics_port": metrics_port,
            "worker.metrics_host": metrics_host,
            "worker.data_dir": data_dir,
            "worker.startup_timeout_s": either(startup_timeout_s, startup_timeout),
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
