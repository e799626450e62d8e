"""Real Prometheus and Alertmanager processes for tests, run from compose/'s own files.

The Debian packages' binaries (``prometheus``, ``prometheus-alertmanager``) on 127.0.0.1 free
ports, with compose/prometheus/prometheus.yml and alerts.yml and
compose/alertmanager/alertmanager.yml: only the targets, the receiver's URL and (for
Prometheus) the intervals are rewritten. A missing binary fails the test. Also a webhook
receiver (an ``http.server`` thread) that records what Alertmanager posts.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlpulse.local.broker import tail
from rlpulse.local.child_process import ChildProcess, free_port

COMPOSE = Path(__file__).resolve().parents[2] / "compose"
INSTALL_HINT = (
    "install it: apt-get install --no-install-recommends prometheus prometheus-alertmanager"
)


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH; {INSTALL_HINT}")
    return path


def get_json(url: str, timeout_s: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read())


def wait_ready(process: ChildProcess, url: str, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process.alive():
            pytest.fail(f"{what} exited early:\n{tail(process.log_file, 30)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    pytest.fail(f"{what} was not ready within {timeout_s:.0f} s:\n{tail(process.log_file, 30)}")


class Prometheus(ChildProcess):
    """compose/'s Prometheus config with ``targets`` (job -> host:port), scraping every 1 s."""

    def __init__(
        self, workdir: Path, targets: dict[str, str], alertmanager: str | None = None
    ) -> None:
        super().__init__(workdir / "prometheus.log")
        self.workdir = workdir
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = yaml.safe_load((COMPOSE / "prometheus" / "prometheus.yml").read_text())
        config["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
        for job in config["scrape_configs"]:
            target = targets.get(job["job_name"], f"127.0.0.1:{self.port}")
            job["static_configs"] = [{"targets": [target]}]
        if alertmanager is None:
            del config["alerting"]
        else:
            config["alerting"]["alertmanagers"] = [
                {"static_configs": [{"targets": [alertmanager]}]}
            ]
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        shutil.copy(COMPOSE / "prometheus" / "alerts.yml", workdir / "alerts.yml")

    def command(self) -> list[str]:
        return [
            binary("prometheus"),
            f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]

    def start(self) -> Prometheus:
        super().start()
        wait_ready(self, f"{self.base}/-/ready", "prometheus")
        return self

    def api(self, path: str, **params: str) -> Any:
        """``/api/v1/<path>``'s data; a query Prometheus refuses fails the test with its error."""
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            body = get_json(url)
        except urllib.error.HTTPError as exc:
            pytest.fail(f"prometheus refused {params}: {exc.read().decode()}")
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        data = self.api("query", **params)
        assert data["resultType"] == "vector", data
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step="1")
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, match: str) -> set[str]:
        return set(self.api(f"label/{label}/values", **{"match[]": match}))

    def wait_for(self, expr: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Poll ``expr`` until it returns a series (the first scrape takes ~5 s)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result:
                return result
            time.sleep(0.5)
        pytest.fail(f"prometheus: {expr} returned nothing within {timeout_s:.0f} s")

    def wait_scraped_after(self, moment: float, timeout_s: float = 60.0) -> None:
        """Poll until every target's newest scrape began after ``moment`` (``time.time()``):
        what each served from then on is in (``timestamp(up)``: when each was last scraped)."""
        deadline = time.monotonic() + timeout_s
        scrapes: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            scrapes = self.query("timestamp(up)")
            if scrapes and all(float(scrape["value"][1]) > moment for scrape in scrapes):
                return
            time.sleep(0.2)
        pytest.fail(
            f"prometheus: not every target scraped after {moment:.3f} within {timeout_s:.0f} s: "
            f"{scrapes}"
        )


class Alertmanager(ChildProcess):
    """compose/'s Alertmanager config, its webhook receiver pointed at ``webhook_url``."""

    def __init__(self, workdir: Path, webhook_url: str) -> None:
        super().__init__(workdir / "alertmanager.log")
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = yaml.safe_load((COMPOSE / "alertmanager" / "alertmanager.yml").read_text())
        for receiver in config["receivers"]:
            for webhook in receiver.get("webhook_configs", []):
                webhook["url"] = webhook_url
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "alertmanager.yml").write_text(yaml.safe_dump(config))

    def command(self) -> list[str]:
        return [
            binary("prometheus-alertmanager"),
            f"--config.file={self.workdir / 'alertmanager.yml'}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # no gossip: no 9094, no 10 s settling
            "--log.level=warn",
        ]

    def start(self) -> Alertmanager:
        super().start()
        wait_ready(self, f"{self.url}/-/ready", "alertmanager")
        return self

    def alerts(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = get_json(f"{self.url}/api/v2/alerts")
        return result


class WebhookReceiver:
    """Records the JSON bodies POSTed to it (Alertmanager's webhook notifications)."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        lock = threading.Lock()
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    received.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}/rlpulse"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert of every notification received, in order."""
        return [alert for note in list(self.notifications) for alert in note["alerts"]]
