"""The exporter process: wait for Kafka, serve /metrics, read the topics, forward alerts.

Threads: the main one reads Kafka and updates the state; the HTTP server
(:mod:`~rlpulse.streams.exporter.http`) renders it at each scrape; one measures consumer lag
every ``lag_interval_s``; one posts alerts to Alertmanager. They share the state under one
lock, held while records are applied and while a scrape builds its families (never during
I/O). Start-up waits for Kafka and the topics like the worker
(:mod:`rlpulse.transport.readiness`); after that, Kafka or Alertmanager being away never
stops it: /metrics keeps serving the last values.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import cast

from prometheus_client import CollectorRegistry, ProcessCollector

from rlpulse.schemas.records import ActionVerdict, CommandAck, ControlCommand, StepSummary
from rlpulse.settings import Settings
from rlpulse.streams.exporter.alerts import AlertForwarder, command_alert, notified_actions
from rlpulse.streams.exporter.collector import ExporterCollector, reserved_names
from rlpulse.streams.exporter.consumer import Incoming, TopicReader
from rlpulse.streams.exporter.exceptions import ExporterError
from rlpulse.streams.exporter.http import MetricsServer
from rlpulse.streams.exporter.lag import LagProbe
from rlpulse.streams.exporter.state import ExporterState, LogTally
from rlpulse.transport.exceptions import TopicError
from rlpulse.transport.readiness import Deadline, retry_until, wait_for_kafka
from rlpulse.transport.topics import ensure_topics

__all__ = ["Exporter", "run_exporter"]

log = logging.getLogger(__name__)
Say = Callable[[str], None]
EXPIRY_INTERVAL_S = 1.0


class Exporter:
    """One exporter: its state, HTTP server, topic reader, lag probe and alert forwarder.

    Construction does no I/O; :meth:`start` connects and starts serving, :meth:`run` reads
    until ``stop`` is set, :meth:`close` stops everything.
    """

    def __init__(self, settings: Settings) -> None:
        if settings.exporter_group == settings.worker_group:
            raise ExporterError(
                f"the exporter's consumer group {settings.exporter_group!r} is the worker's; "
                "give exporter.group_id another name"
            )
        notified_actions(settings.exporter)  # a typo in notify_actions is refused at start
        self.settings = settings
        self.lock = threading.Lock()
        self.state = ExporterState(settings.exporter, settings.limits, reserved_names())
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ExporterCollector(self.state, self.lock))
        ProcessCollector(registry=self.registry)
        self.reader = TopicReader(settings)
        self.probe = LagProbe(
            settings,
            [
                settings.worker_group,
                settings.exporter_group,
                settings.archive_group,
                settings.index_group,
            ],
        )
        self.forwarder: AlertForwarder | None = None
        self.port: int | None = None
        """The port /metrics listens on, once started."""
        self._stop = threading.Event()
        self._server: MetricsServer | None = None
        self._lag_thread: threading.Thread | None = None

    def start(self, say: Say) -> None:
        """Wait for Kafka and the topics, serve /metrics, take the partitions from the lookback."""
        exporter = self.settings.exporter
        deadline = Deadline(exporter.startup_timeout_s)
        bootstrap = wait_for_kafka(self.settings, deadline, say)
        backlog = retry_until(
            deadline,
            lambda: self._assign(deadline, say),
            f"the {self.settings.prefix}.* topics on {bootstrap}",
            say,
        )
        try:
            self._server = MetricsServer(self.registry, exporter.host, exporter.port)
        except OSError as exc:
            raise ExporterError(
                f"cannot serve /metrics on {exporter.host}:{exporter.port}: {exc.strerror or exc}"
            ) from None
        self.port = self._server.port
        say(
            f"exporter {self.settings.exporter_group}: /metrics on "
            f"http://{exporter.host}:{self.port}/metrics; reading {backlog} records of lookback "
            f"({exporter.lookback_s:.0f} s) from Kafka {bootstrap}"
        )
        if exporter.alertmanager_url is not None:
            with self.lock:
                self.state.notifications.update(dict.fromkeys(("sent", "failed", "dropped"), 0))
            self.forwarder = AlertForwarder(exporter.alertmanager_url, self._count_notification)
            say(f"forwarding {', '.join(notified_actions(exporter))} commands to "
                f"{exporter.alertmanager_url}")  # fmt: skip
        self._lag_thread = threading.Thread(
            target=self._measure_lag, name="rlpulse-lag", daemon=True
        )
        self._lag_thread.start()

    def _assign(self, deadline: Deadline, say: Say) -> int:
        try:  # create the topics if the exporter is up before any worker
            created = ensure_topics(
                self.settings, timeout_s=max(1.0, min(10.0, deadline.left()))
            ).created
        except TopicError as exc:  # another partition count (fine to read), or not allowed
            log.debug("exporter: %s", exc)
        else:
            if created:
                say(f"created the topics no worker had created yet: {', '.join(created)}")
        return self.reader.assign(deadline)

    def run(self, stop: threading.Event | None = None, say: Say | None = None) -> None:
        """Read and apply records until ``stop`` (default: :meth:`close`) is set."""
        stop = stop or self._stop
        last_expiry = 0.0
        while not stop.is_set() and not self._stop.is_set():
            batch = self.reader.poll()
            alerts = self.apply(batch)
            if self.forwarder is not None:
                for alert in alerts:
                    self.forwarder.submit(alert)
            now = time.monotonic()
            if now - last_expiry >= EXPIRY_INTERVAL_S:
                last_expiry = now
                with self.lock:
                    gone = self.state.expire(time.time_ns())
                    caught_up = self.state.caught_up
                if gone:
                    log.info("exporter: runs expired: %s", ", ".join(gone))
                if not caught_up and self.reader.caught_up():
                    with self.lock:
                        self.state.caught_up = True
                    if say is not None:
                        say("exporter caught up with the lookback")

    def apply(self, batch: Iterable[Incoming]) -> list[dict[str, object]]:
        """Apply a batch of records to the state; returns the alerts its commands raise.

        The lock is held for the whole batch, decoding included (see
        :meth:`TopicReader.poll`); a scrape waits at most that long.
        """
        alerts: list[dict[str, object]] = []
        exporter = self.settings.exporter
        forwarding = self.forwarder is not None
        oldest_ns = time.time_ns() - round(exporter.alert_ttl_s * 1e9)
        state = self.state
        read: Counter[str] = Counter()
        with self.lock:
            for role, record, live in batch:
                read[role] += 1
                if record is None:
                    state.undecodable[role] += 1
                elif role == "events":
                    state.add_event(record, live)  # type: ignore[arg-type]
                elif role == "steps":
                    state.add_summary(cast(StepSummary, record))
                elif role == "control":
                    command = cast(ControlCommand, record)
                    state.add_command(command, live)
                    # A command from the lookback is posted again while its alert would still
                    # be active: Alertmanager deduplicates it, and one missed while the
                    # exporter was down still gets out.
                    if forwarding and command["issued_ns"] >= oldest_ns:
                        alert = command_alert(command, exporter)
                        if alert is not None:
                            alerts.append(alert)
                elif role == "acks":
                    state.add_ack(cast(CommandAck, record), live)
                elif role == "verdicts":
                    state.add_verdict(cast(ActionVerdict, record), live)
                elif role == "logs":
                    state.add_logs(cast(LogTally, record), live)
                else:
                    state.add_dead_letter(cast(str, record), live)
            state.messages.update(read)
        return alerts

    def _count_notification(self, outcome: str, alerts: int) -> None:
        with self.lock:
            self.state.notifications[outcome] += alerts

    def _measure_lag(self) -> None:
        interval = self.settings.exporter.lag_interval_s
        while True:
            lag = self.probe.measure()
            with self.lock:
                self.state.set_lag(lag)
            if self._stop.wait(interval):
                return

    def close(self) -> None:
        """Stop reading, serving, measuring and forwarding (posting what is queued)."""
        self._stop.set()
        self.reader.close()
        if self._server is not None:
            self._server.close()
        if self.forwarder is not None:
            self.forwarder.close()
        if self._lag_thread is not None:
            self._lag_thread.join(timeout=10.0)
        self.probe.close()


def run_exporter(settings: Settings, say: Say) -> None:
    """Run an exporter until SIGTERM or SIGINT."""
    logging.basicConfig(
        level=settings.exporter.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _sig, _frame: stop.set())
    exporter = Exporter(settings)
    try:
        exporter.start(say)
        exporter.run(stop, say)
    finally:
        exporter.close()
