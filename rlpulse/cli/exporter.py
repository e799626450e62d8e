"""``rlpulse exporter``: serve the runs' metrics to Prometheus, forward rule commands as alerts."""

from __future__ import annotations

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


@one_line_errors
def exporter(
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    port: Annotated[int | None, setting_option("exporter.port")] = None,
    host: Annotated[str | None, setting_option("exporter.host")] = None,
    namespace: Annotated[
        str | None,
        setting_option("exporter.namespace"),
    ] = None,
    allow_metric: Annotated[
        list[str] | None,
        setting_option("exporter.allow_metrics", unset="all", note="(globs; repeat the flag)"),
    ] = None,
    max_series: Annotated[int | None, setting_option("exporter.max_series")] = None,
    lookback_s: Annotated[
        float | None,
        setting_option("exporter.lookback_s", "--lookback-s"),
    ] = None,
    expire_ended_s: Annotated[
        float | None,
        setting_option(
            "exporter.expire_ended_s",
            "--expire-ended-s",
        ),
    ] = None,
    expire_silent_s: Annotated[
        float | None,
        setting_option(
            "exporter.expire_silent_s",
            "--expire-silent-s",
        ),
    ] = None,
    zscore_window: Annotated[
        int | None,
        setting_option("exporter.zscore_window"),
    ] = None,
    alertmanager_url: Annotated[
        str | None,
        setting_option("exporter.alertmanager_url", unset="off"),
    ] = None,
    notify: Annotated[
        list[str] | None,
        setting_option("exporter.notify_actions", note="(repeat the flag)"),
    ] = None,
    startup_timeout_s: Annotated[
        float | None,
        setting_option("exporter.startup_timeout_s", "--startup-timeout-s"),
    ] = None,
    log_level: Annotated[str | None, setting_option("exporter.log_level")] = None,
    config: ConfigFile = None,
    lookback: Annotated[float | None, alias("--lookback", of="lookback_s")] = None,
    expire_ended: Annotated[float | None, alias("--expire-ended", of="expire_ended_s")] = None,
    expire_silent: Annotated[float | None, alias("--expire-silent", of="expire_silent_s")] = None,
    startup_timeout: StartupTimeoutAlias = None,
) -> None:
    """Serve the runs' metrics on /metrics for Prometheus, until SIGTERM or SIGINT."""
    from rlpulse.streams.exporter.server import run_exporter

    chosen = command_settings(exporter, locals())
    run_exporter(chosen, say)
