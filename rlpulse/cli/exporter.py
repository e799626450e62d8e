"""``rlpulse exporter``: serve the runs' metrics to Prometheus, forward rule commands as alerts."""

from __future__ import annotations

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


@one_line_errors
def exporter(
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    port: Annotated[int | None, setting_option("exporter.port", "Port of /metrics.")] = None,
    host: Annotated[
        str | None, setting_option("exporter.host", "Address /metrics listens on.")
    ] = None,
    namespace: Annotated[
        str | None,
        setting_option("exporter.namespace", "Per-rank gauges are <namespace>_<metric>."),
    ] = None,
    allow_metric: Annotated[
        list[str] | None,
        setting_option(
            "exporter.allow_metrics",
            "Only these logged metrics (globs; repeat the flag) get per-rank series.",
            unset="all",
        ),
    ] = None,
    max_series: Annotated[
        int | None, setting_option("exporter.max_series", "Most series of runs held.")
    ] = None,
    lookback_s: Annotated[
        float | None,
        setting_option(
            "exporter.lookback_s", "Seconds of the topics read at start.", "--lookback-s"
        ),
    ] = None,
    expire_ended_s: Annotated[
        float | None,
        setting_option(
            "exporter.expire_ended_s",
            "A run's series go this many seconds after run_end.",
            "--expire-ended-s",
        ),
    ] = None,
    expire_silent_s: Annotated[
        float | None,
        setting_option(
            "exporter.expire_silent_s",
            "A run's series go this many seconds after its last record.",
            "--expire-silent-s",
        ),
    ] = None,
    zscore_window: Annotated[
        int | None,
        setting_option("exporter.zscore_window", "Steps in rlpulse_step_zscore's window."),
    ] = None,
    alertmanager_url: Annotated[
        str | None,
        setting_option(
            "exporter.alertmanager_url", "Forward rule commands to this Alertmanager.", unset="off"
        ),
    ] = None,
    notify: Annotated[
        list[str] | None,
        setting_option(
            "exporter.notify_actions", "Commands with this action notify (repeat the flag)."
        ),
    ] = None,
    startup_timeout_s: Annotated[
        float | None,
        setting_option("exporter.startup_timeout_s", STARTUP_HELP, "--startup-timeout-s"),
    ] = None,
    log_level: Annotated[str | None, setting_option("exporter.log_level", LOG_LEVEL_HELP)] = None,
    config: ConfigFile = None,
    lookback: Annotated[float | None, alias("--lookback")] = None,
    expire_ended: Annotated[float | None, alias("--expire-ended")] = None,
    expire_silent: Annotated[float | None, alias("--expire-silent")] = None,
    startup_timeout: StartupTimeoutAlias = None,
) -> None:
    """Serve the runs' metrics on /metrics for Prometheus, until SIGTERM or SIGINT."""
    from rlpulse.streams.exporter.server import run_exporter

    chosen = settings(
        config,
        {
            "bootstrap": bootstrap,
            "prefix": prefix,
            "exporter.port": port,
            "exporter.host": host,
            "exporter.namespace": namespace,
            "exporter.allow_metrics": allow_metric,
            "exporter.max_series": max_series,
            "exporter.lookback_s": either(lookback_s, lookback),
            "exporter.expire_ended_s": either(expire_ended_s, expire_ended),
            "exporter.expire_silent_s": either(expire_silent_s, expire_silent),
            "exporter.zscore_window": zscore_window,
            "exporter.alertmanager_url": alertmanager_url,
            "exporter.notify_actions": notify,
            "exporter.startup_timeout_s": either(startup_timeout_s, startup_timeout),
            "exporter.log_level": log_level,
        },
    )
    run_exporter(chosen, say)
