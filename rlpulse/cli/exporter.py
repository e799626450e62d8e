"""``rlpulse exporter``: serve the runs' metrics to Prometheus, forward rule commands as alerts."""

from __future__ import annotations

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


@one_line_errors
def exporter(
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    port: Annotated[int | None, typer.Option(help="Port of /metrics (default: 9091).")] = None,
    host: Annotated[
        str | None, typer.Option(help="Address /metrics listens on (default: 0.0.0.0).")
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(help="Per-rank gauges are <namespace>_<metric> (default: rlpulse)."),
    ] = None,
    allow_metric: Annotated[
        list[str] | None,
        typer.Option(
            help="Only these logged metrics (globs; repeat the flag) get per-rank series "
            "(default: all)."
        ),
    ] = None,
    max_series: Annotated[
        int | None, typer.Option(help="Most series of runs held (default: 50000).")
    ] = None,
    lookback: Annotated[
        float | None,
        typer.Option(help="Seconds of the topics read at start (default: 900)."),
    ] = None,
    expire_ended: Annotated[
        float | None,
        typer.Option(help="A run's series go this many seconds after run_end (default: 600)."),
    ] = None,
    expire_silent: Annotated[
        float | None,
        typer.Option(
            help="A run's series go this many seconds after its last record (default: 3600)."
        ),
    ] = None,
    zscore_window: Annotated[
        int | None, typer.Option(help="Steps in rlpulse_step_zscore's window (default: 20).")
    ] = None,
    alertmanager_url: Annotated[
        str | None,
        typer.Option(help="Forward rule commands to this Alertmanager (default: off)."),
    ] = None,
    notify: Annotated[
        list[str] | None,
        typer.Option(
            help="Commands with this action notify (repeat the flag; default: alert, stop, "
            "checkpoint)."
        ),
    ] = None,
    startup_timeout: StartupTimeout = None,
    log_level: LogLevel = None,
    config: ConfigFile = None,
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
            "exporter.lookback_s": lookback,
            "exporter.expire_ended_s": expire_ended,
            "exporter.expire_silent_s": expire_silent,
            "exporter.zscore_window": zscore_window,
            "exporter.alertmanager_url": alertmanager_url,
            "exporter.notify_actions": notify,
            "exporter.startup_timeout_s": startup_timeout,
            "exporter.log_level": log_level,
        },
    )
    run_exporter(chosen, say)
