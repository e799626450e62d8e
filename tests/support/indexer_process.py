"""An indexer running as a child process: what the tests and the benchmarks start."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rlpulse.local.child_process import ChildProcess, rlpulse_command, setting_variables

__all__ = ["IndexerProcess"]


class IndexerProcess(ChildProcess):
    """Starts ``rlpulse index`` in a child process and stops it by signal.

    ``settings`` are extra settings as environment variables (``{"index.bulk_max_docs": 100}``
    becomes ``RLPULSE_INDEX__BULK_MAX_DOCS=100``).
    """

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        url: str,
        log_file: Path,
        settings: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(log_file, setting_variables(settings or {}))
        self.bootstrap = bootstrap
        self.prefix = prefix
        self.url = url

    def command(self) -> list[str]:
        """The command line of the child."""
        return rlpulse_command(
            "index", "--bootstrap", self.bootstrap, "--prefix", self.prefix, "--url", self.url
        )
