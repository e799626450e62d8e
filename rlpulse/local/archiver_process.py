"""An archiver running as a child process: what the tests and the benchmarks start."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rlpulse.local.child_process import ServiceProcess, setting_variables

__all__ = ["ArchiverProcess"]


class ArchiverProcess(ServiceProcess):
    """Starts ``rlpulse archive`` in a child process and stops it by signal.

    ``settings`` are extra settings as environment variables (``{"archive.roll_s": 1}``
    becomes ``RLPULSE_ARCHIVE__ROLL_S=1``).
    """

    subcommand = "archive"

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        root: Path | str,
        log_file: Path,
        settings: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(bootstrap, prefix, log_file, setting_variables(settings or {}))
        self.root = str(root)

    def _options(self) -> list[str]:
        return ["--root", self.root]
