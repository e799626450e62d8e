"""An indexer running as a child process: what the tests and the benchmarks start."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rlpulse.local.child_process import ServiceProcess, setting_variables

__all__ = ["IndexerProcess"]


class IndexerProcess(ServiceProcess):
    """Starts ``rlpulse index`` in a child process and stops it by signal.

    ``settings`` are extra settings as environment variables (``{"index.bulk_max_docs": 100}``
    becomes ``RLPULSE_INDEX__BULK_MAX_DOCS=100``).
    """

    subcommand = "index"

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        url: str,
        log_file: Path,
        settings: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(bootstrap, prefix, log_file, setting_variables(settings or {}))
        self.url = url

    def _options(self) -> list[str]:
        return ["--url", self.url]
