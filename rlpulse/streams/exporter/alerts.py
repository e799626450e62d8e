"""Rule commands that tell a person: ControlCommands as alerts for Alertmanager's v2 API.

A command with one of the ``notify_actions`` (by default ``stop``, ``checkpoint`` and
``alert``; dry-run commands never) becomes one alert: ``alertname`` by its weightiest
action, as the action contract declares it (:mod:`rlpulse.schemas.actions`:
``RlpulseRunStopped``, ``RlpulseRunCheckpointed``, ``RlpulseRuleAlert``, else
``RlpulseRuleCommand``), labels ``run``, ``rule``, ``severity`` and ``command_id``, the
command's reason as its ``description``. It starts when the command was issued and resolves
``alert_ttl_s`` later. The labels identify the command, so posting it again (an exporter that
restarted and read the command in its lookback) is a no-op for Alertmanager: each command
notifies once.

:func:`command_alert` is pure; :class:`AlertForwarder` posts in a thread of its own, retrying
while Alertmanager is unreachable, so the exporter never waits for it.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final

from rlpulse.diagnostics import WarnOnce
from rlpulse.rules.model import choice_hint
from rlpulse.schemas.actions import ACTIONS
from rlpulse.schemas.records import ControlCommand
from rlpulse.settings import ExporterSettings
from rlpulse.streams.exporter.exceptions import ExporterError
from rlpulse.streams.exporter.state import command_rule
from rlpulse.transport.backoff import Backoff

__all__ = ["AlertForwarder", "command_alert", "notified_actions"]

log = logging.getLogger(__name__)

Alert = dict[str, Any]

MAX_PENDING: Final = 1000
"""Alerts held while Alertmanager is unreachable; older ones are dropped (counted)."""
FIRST_RETRY_PAUSE_S: Final = 0.5
MAX_RETRY_PAUSE_S: Final = 30.0


def _rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat(timespec="milliseconds")


def notified_actions(settings: ExporterSettings) -> list[str]:
    """The actions whose commands notify: ``notify_actions``, else the contract's defaults.

    Raises :class:`ExporterError` for a name that is no action (a typo would notify never).
    """
    if settings.notify_actions is None:
        return [action.name for action in ACTIONS if action.notified_by_default]
    for name in settings.notify_actions:
        if name not in ACTIONS:
            raise ExporterError(
                f"exporter.notify_actions: {name!r} is no action" + choice_hint(name, ACTIONS.names)
            )
    return list(settings.notify_actions)


def command_alert(command: ControlCommand, settings: ExporterSettings) -> Alert | None:
    """The Alertmanager alert for ``command``, or None if it is not one to notify about."""
    if command["dry_run"]:
        return None
    types = [action["type"] for action in command["actions"]]
    chosen = notified_actions(settings)
    notified = [a for a in ACTIONS if a.name in types and a.name in chosen]
    if not notified:
        return None
    alertname, severity = notified[0].alert_name, notified[0].alert_severity
    messages = []
    for action in command["actions"]:
        if action["type"] == "alert":
            severity = str(action["params"].get("severity") or severity)
            if action["params"].get("message"):
                messages.append(str(action["params"]["message"]))
    run, rule = command["run_id"], command_rule(command)
    summary = (
        f"{rule}: {', '.join(types)} for run {run} at step {command['step']} "
        f"(stage {command['stage']}, attempt {command['attempt']})"
    )
    annotations = {"summary": summary, "description": command["reason"]}
    if messages:
        annotations["message"] = " ".join(messages)
    issued = command["issued_ns"]
    return {
        "labels": {
            "alertname": alertname,
            "run": run,
            "rule": rule,
            "severity": severity,
            "command_id": command["command_id"],
        },
        "annotations": annotations,
        "startsAt": _rfc3339(issued),
        "endsAt": _rfc3339(issued + round(settings.alert_ttl_s * 1e9)),
    }


class AlertForwarder:
    """Posts alerts to ``<url>/api/v2/alerts`` from a daemon thread; never blocks the caller.

    ``on_outcome(outcome, alerts)`` is told ``sent``, ``failed`` (an attempt that found
    Alertmanager unreachable or failing; the alerts are retried with a growing pause) or
    ``dropped`` (alerts Alertmanager refused as invalid, or pushed out of a full queue).
    """

    def __init__(
        self, url: str, on_outcome: Callable[[str, int], None], timeout_s: float = 5.0
    ) -> None:
        self.endpoint = f"{url.rstrip('/')}/api/v2/alerts"
        self.on_outcome = on_outcome
        self.timeout_s = timeout_s
        self._pending: deque[Alert] = deque()
        self._wake = threading.Condition()
        self._closed = False
        self._warn = WarnOnce(log)
        self._thread = threading.Thread(target=self._run, name="rlpulse-alerts", daemon=True)
        self._thread.start()

    def submit(self, alert: Alert) -> None:
        """Queue ``alert`` for posting."""
        with self._wake:
            if len(self._pending) >= MAX_PENDING:
                self._pending.popleft()
                self.on_outcome("dropped", 1)
            self._pending.append(alert)
            self._wake.notify()

    def close(self, timeout_s: float = 5.0) -> None:
        """Post what is queued (one attempt, within ``timeout_s``), then stop the thread."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        pauses = Backoff(FIRST_RETRY_PAUSE_S, MAX_RETRY_PAUSE_S)
        while True:
            with self._wake:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if not self._pending:
                    return
                batch = list(self._pending)
                self._pending.clear()
                closing = self._closed
            outcome = self._post(batch)
            self.on_outcome(outcome, len(batch))
            if outcome != "failed":
                pauses.reset()
                continue
            if closing:
                return
            with self._wake:
                self._pending.extendleft(reversed(batch))
                while len(self._pending) > MAX_PENDING:
                    self._pending.popleft()
                    self.on_outcome("dropped", 1)
                self._wake.wait(pauses.next())

    def _post(self, batch: list[Alert]) -> str:
        """``sent``; ``failed`` (unreachable or a server error: retry); ``dropped`` (refused)."""
        request = urllib.request.Request(
            self.endpoint,
            data=json.dumps(batch).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")[:500]
            self._warn(f"http {exc.code}", "Alertmanager answered %s to alerts: %s", exc.code, body)
            return "failed" if exc.code >= 500 else "dropped"
        except (OSError, ValueError) as exc:
            self._warn("unreachable", "Alertmanager at %s unreachable: %s", self.endpoint, exc)
            return "failed"
        return "sent"
