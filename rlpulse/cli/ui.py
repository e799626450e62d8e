"""``rlpulse ui``: serve the run page (the run list, one page per run) until interrupted."""

from __future__ import annotations

import signal
import threading
from typing import Annotated

import typer

from rlpulse.cli.common import (
    Bootstrap,
    ConfigFile,
    Prefix,
    command_settings,
    fail,
    one_line_errors,
    out,
    setting_option,
)
from rlpulse.cli.reading import ArchiveRoot


@one_line_errors
def ui(
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    archive: ArchiveRoot = None,
    host: Annotated[str | None, setting_option("ui.host")] = None,
    port: Annotated[int | None, setting_option("ui.port")] = None,
    live: Annotated[
        bool, typer.Option(help="Read the live topics too (else the archive only).")
    ] = True,
    config: ConfigFile = None,
) -> None:
    """Serve each run's page: metrics, per-rank heatmaps, commands and a step's logs."""
    from rlpulse.ui.data import run_data
    from rlpulse.ui.server import UiServer

    chosen = command_settings(ui, locals())
    data = run_data(chosen, live=live)
    problem = data.archive_problem()
    if problem is not None and not live:
        data.close()
        raise fail(problem)
    server = UiServer(data, chosen.ui.host, chosen.ui.port)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    try:
        out.print(f"The runs' pages: {server.url} (archive {chosen.archive_root}; Ctrl-C stops)")
        if problem:
            out.print(f"[yellow]{problem}[/]", highlight=False)
        stop.wait()
    finally:
        server.stop()
