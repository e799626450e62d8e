"""An archiver running as a child process: what the tests and the benchmarks start."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from rlpulse.local.child_process import ChildProcess, rlpulse_command, setting_variables

__all__ = ["ArchiverProcess"]


class ArchiverProcess(ChildProcess):
    """Starts ``rlpulse archive`` in a child process and stops it by signal.

    ``settings`` are extra settings as environment variables (``{"archive.roll_s": 1}``
    becomes ``RLPULSE_ARCHIVE__ROLL_S=1``).
    """

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        root: Path | str,
        log_file: Path,
        settings: Mapping[str, object] | None = None,
    ) -> None:
        super().__init__(log_file, setting_variables(settings or {}))
        self.bootstrap = bootstrap
        self.prefix = prefix
        self.root = str(root)

    def command(self) -> list[str]:
        """The command line of the child."""
        return rlpulse_command(
            "archive",
            "--bootstrap",
            self.bootstrap,
            "--prefix",
            self.prefix,
            "--root",
            self.root,
        )
