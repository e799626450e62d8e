"""``rlpulse index``: run an indexer (log records and step summaries into a search engine)."""

from __future__ import annotations

import signal
from typing import Annotated

from rlpulse.cli.common import (
    Bootstrap,
    ConfigFile,
    Prefix,
    command_settings,
    one_line_errors,
    say,
    setting_option,
)
from rlpulse.transport.bootstrap import bootstrap_servers


@one_line_errors
def index(
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    url: Annotated[
        str | None,
        setting_option(
            "opensearch_url",
            "--url",
            unset="unset: the node of `rlpulse search up`, else http://127.0.0.1:<search.port>",
        ),
    ] = None,
    group: Annotated[
        str | None,
        setting_option("index.group_id", shown=lambda s: s.index_group),
    ] = None,
    index_prefix: Annotated[
        str | None,
        setting_option(
            "index.index_prefix",
            shown=lambda s: s.index_prefix,
        ),
    ] = None,
    startup_timeout_s: Annotated[
        float | None,
        setting_option("index.startup_timeout_s", "--startup-timeout-s"),
    ] = None,
    config: ConfigFile = None,
) -> None:
    """Index log records and step summaries into OpenSearch/Elasticsearch until SIGTERM."""
    from rlpulse.local.opensearch import search_url
    from rlpulse.streams.indexer.indexer import Indexer

    chosen = command_settings(index, locals())
    address = search_url(chosen)
    indexer = Indexer(chosen, address, say)
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda _signal, _frame: indexer.stop())
    say(
        f"indexer {chosen.index_group}: {chosen.prefix}.logs and {chosen.prefix}.steps from "
        f"Kafka {bootstrap_servers(chosen)} to {address}"
    )
    counts = indexer.run()
    say(
        f"indexer stopped: {counts.documents} documents indexed ({counts.updated} of them "
        f"were there already), {counts.rejected} refused (in {chosen.prefix}.dlq), "
        f"{counts.undecodable} undecodable messages skipped, {counts.requests} _bulk requests, "
        f"{counts.retries} retries"
    )
