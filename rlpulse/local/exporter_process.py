"""An exporter running as a child process: what the demo, the tests and the benchmarks start."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from rlpulse.local.broker import tail
from rlpulse.local.child_process import ServiceProcess
from rlpulse.local.exceptions import ExporterProcessError

__all__ = ["ExporterProcess"]


class ExporterProcess(ServiceProcess):
    """Starts ``rlpulse exporter`` on 127.0.0.1:``port`` in a child process; scrapes it."""

    subcommand = "exporter"

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        log_file: Path,
        port: int,
        namespace: str = "rlpulse",
        extra_args: tuple[str, ...] = (),
    ) -> None:
        super().__init__(bootstrap, prefix, log_file, extra_args=extra_args)
        self.port = port
        self.namespace = namespace

    @property
    def url(self) -> str:
        """Where the exporter serves its metrics."""
        return f"http://127.0.0.1:{self.port}/metrics"

    def _options(self) -> list[str]:
        return ["--host", "127.0.0.1", "--port", str(self.port), "--namespace", self.namespace]

    def scrape(self, timeout_s: float = 10.0) -> str:
        """The exposition text of /metrics (raises ``OSError`` if it does not answer)."""
        with urllib.request.urlopen(self.url, timeout=timeout_s) as response:
            text: str = response.read().decode()
        return text

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of a scrape: (name, sorted labels) -> value."""
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(self.scrape())
            for sample in family.samples
        }

    def value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """The value of the sample ``name{labels}`` in a fresh scrape, or None."""
        return self.samples().get((name, tuple(sorted((labels or {}).items()))))

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """Block until the exporter serves and has read its lookback."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise ExporterProcessError(
                    f"exporter exited early; its log:\n{tail(self.log_file, 30)}"
                )
            try:
                if self.value("rlpulse_exporter_caught_up") == 1.0:
                    return
            except (OSError, urllib.error.URLError):
                pass  # not serving yet
            time.sleep(0.2)
        raise ExporterProcessError(
            f"exporter did not serve its lookback on {self.url} within {timeout_s:.0f} s; "
            f"its log:\n{tail(self.log_file, 30)}"
        )
