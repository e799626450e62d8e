"""Starting a worker process: wait for Kafka, make the topics, load the rules, run faust.

Start-up must work on a fresh machine and on a broker that is still starting or electing
leaders: every step that talks to Kafka retries (with a growing pause, announced once)
until ``worker.startup_timeout_s`` has passed, then gives up with one sentence
(:class:`~rlpulse.transport.exceptions.BrokerUnavailableError`).
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import faust
from confluent_kafka import KafkaException
from prometheus_client import CollectorRegistry, start_http_server

from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings
from rlpulse.streams.rulebook import rule_book
from rlpulse.streams.worker.app import WorkerApp
from rlpulse.streams.worker.faust_consumer import SteadyConsumer
from rlpulse.streams.worker.held_partitions import HeldPartitionsLine
from rlpulse.streams.worker.metrics import GcPauseTimer
from rlpulse.transport.clients import new_admin
from rlpulse.transport.exceptions import BrokerUnavailableError
from rlpulse.transport.readiness import Deadline, retry_until, wait_for_kafka
from rlpulse.transport.replication import Replication, fix_commands, under_replicated
from rlpulse.transport.topics import create_missing, ensure_topics, raise_message_limits

__all__ = [
    "BoundedStopWorker",
    "run_worker",
    "say_while_running",
    "start_up",
    "warn_under_replicated",
]

log = logging.getLogger(__name__)
Say = Callable[[str], None]

CONFIG_TRY_S = 5.0
"""The longest one try of reading and raising the state topics' message limit may wait.

A request that went to a broker which just died waits for its whole timeout (seen here: a
worker restarted beside a dead broker waited 24 s in one DescribeConfigs, with 30 s then
allowed). The next try's fresh client, once the cluster has fenced the dead broker, asks a
live one. (Creating the state topics keeps up to 30 s a try: on a fresh cluster it waits
until every new partition is served.)
"""


def start_up(settings: Settings, say: Say) -> WorkerApp:
    """Everything before the faust worker runs: Kafka reachable, topics, rules, metrics.

    Says at the end how long it took, step by step (a start-up against a cluster that lost a
    broker waits on its fail-over in several of them).
    """
    deadline = Deadline(settings.worker.startup_timeout_s)
    steps = StepClock()
    bootstrap = wait_for_kafka(settings, deadline, say)
    steps.done("Kafka")
    topics = Topics(settings.prefix)
    created, replication = retry_until(
        deadline,
        lambda: ensure_topics(settings, topics, timeout_s=max(1.0, min(30.0, deadline.left()))),
        f"the {settings.prefix}.* topics on {bootstrap}",
        say,
    )
    if created:
        say(f"created the topics: {', '.join(created)}")
    steps.done("topics")
    warn_under_replicated(settings, topics, replication, bootstrap)
    steps.done("replication check")
    book, follow = rule_book(settings)
    registry = CollectorRegistry()
    worker_app = WorkerApp(settings, book, registry=registry, replication=replication)
    faust_app: Any = worker_app.app

    def group_members() -> Awaitable[int | None]:  # the consumer exists once faust runs
        consumer: SteadyConsumer = faust_app.consumer
        return consumer.group_members()

    HeldPartitionsLine(
        topics.events,
        settings.worker.partitions,
        settings.worker_group,
        say_while_running,
        group_members,
    ).attach(faust_app)
    state_topics = worker_app.faust_topics()
    retry_until(
        deadline,
        lambda: create_missing(
            new_admin(settings),
            state_topics,
            replication,
            timeout_s=max(1.0, min(30.0, deadline.left())),
        ),
        "the worker's state topics",
        say,
    )
    steps.done("state topics")
    limits = retry_until(
        deadline,
        lambda: raise_message_limits(
            new_admin(settings),
            state_topics,
            timeout_s=max(1.0, min(CONFIG_TRY_S, deadline.left())),
        ),
        "the worker's state topics' message limit",
        say,
    )
    state_max = f"worker.state_max_bytes ({settings.worker.state_max_bytes:,} bytes)"
    if limits.raised:
        say(f"raised max.message.bytes to {state_max} on {', '.join(limits.raised)}")
    for refusal in limits.refused:
        log.warning(
            "could not raise max.message.bytes to %s on %s; a state record above the "
            "topic's limit will stop the worker",
            state_max,
            refusal,
        )
    steps.done("message limits")
    follow(deadline)  # after WorkerApp attached the book's counters: refusals at start count
    steps.done("rules")
    port = settings.worker.metrics_port
    if port is not None:
        start_http_server(port, addr=settings.worker.metrics_host, registry=registry)
        say(f"metrics on http://{settings.worker.metrics_host}:{port}/metrics")
    say(f"started in {steps}; faust joins the group next")
    return worker_app


class StepClock:
    """How long each step of a start-up took, said as one line (``str``)."""

    def __init__(self) -> None:
        self._began = self._last = time.monotonic()
        self._steps: list[tuple[str, float]] = []

    def done(self, step: str) -> None:
        """``step`` ended now."""
        now = time.monotonic()
        self._steps.append((step, now - self._last))
        self._last = now

    def __str__(self) -> str:
        each = ", ".join(f"{step} {seconds:.1f}" for step, seconds in self._steps)
        return f"{self._last - self._began:.1f} s ({each})"


def say_while_running(message: str) -> None:
    """Write one line to the process's stderr, as the start-up lines are, once faust runs.

    A running faust worker replaces ``sys.stderr`` with a proxy that logs what is written to
    it as a WARNING, and the command line's ``say`` wraps at the terminal's width (80 columns
    in a file): a line said while the worker runs goes to the real stderr, whole.
    """
    stream = sys.__stderr__ or sys.stderr
    stream.write(f"{message}\n")
    stream.flush()


def warn_under_replicated(
    settings: Settings, topics: Topics, replication: Replication, bootstrap: str
) -> list[str]:
    """Warn about every topic the worker uses with fewer replicas than it would create.

    The worker's topics: rlpulse's under the prefix, and faust's (``<app id>-...``). Warns once
    per start with the topics and Kafka's commands that fix them (a reassignment plan written
    to the worker's data directory); returns the topics. A warning, not a refusal: the worker
    still works, it only stops while a broker holding a single copy is down.
    """
    admin = new_admin(settings, "replication check")
    try:
        cluster = admin.list_topics(timeout=10.0)
    except KafkaException as exc:
        raise BrokerUnavailableError(f"Kafka did not answer a metadata request: {exc}") from exc
    metadata = cluster.topics
    mine = [*topics.all(), *(n for n in metadata if n.startswith(f"{settings.worker_group}-"))]
    short = under_replicated(metadata, mine, replication)
    if not short:
        return []
    plan = settings.worker_data_dir / "replication-plan.json"
    brokers = [int(b) for b in cluster.brokers]
    commands = fix_commands(short, replication, brokers, bootstrap, plan)
    counts = ", ".join(f"{t.topic} ({min(len(r) for r in t.replicas.values())})" for t in short)
    log.warning(
        "%d topic(s) have fewer than %d replicas on this %d-broker cluster: %s. While a broker "
        "holding their only copy is down, every run on their partitions stops. Fix: %s",
        len(short),
        replication.factor,
        replication.brokers,
        counts,
        " && ".join(commands),
    )
    return [t.topic for t in short]


class BoundedStopWorker(faust.Worker):
    """faust's worker, whose stop ends the process within ``stop_timeout_s`` whatever happens.

    faust's stop waits until every message its agent took is acknowledged; a message taken
    and never finished makes that wait endless (seen here once: two ticks taken in the first
    seconds of a worker's life, still waited for when it was stopped minutes later). A
    supervisor would SIGKILL such a process after its own grace period; this ends it first,
    saying why. Nothing is lost either way: what was committed stands, and the next owner of
    a partition reads it again from its committed offset (as after a SIGKILL).
    """

    def __init__(self, app: faust.App, stop_timeout_s: float, **options: Any) -> None:
        super().__init__(app, **options)
        self._stop_timeout_s = stop_timeout_s

    async def on_stop(self) -> None:
        """Start the clock on the stop, then stop as faust does."""
        threading.Thread(
            target=_exit_after, args=(self._stop_timeout_s,), name="rlpulse-stop", daemon=True
        ).start()
        await super().on_stop()


def _exit_after(timeout_s: float) -> None:
    time.sleep(timeout_s)
    log.warning(
        "the worker did not stop within %g s (worker.stop_timeout_s): faust still waits for "
        "messages it took and never finished; exiting now (what was committed stands; the "
        "rest is read again by the next owner of those partitions)",
        timeout_s,
    )
    logging.shutdown()
    os._exit(0)


def run_worker(settings: Settings, say: Say) -> None:
    """Start a worker (see :func:`start_up`) and run it until SIGTERM or SIGINT."""
    worker_app = start_up(settings, say)
    # The process's garbage collector is this function's to set, not start_up's: faust makes
    # several objects per message, and Python's default (a young collection every 700
    # allocations) spends the loop's time on them. What start-up built is never garbage.
    GcPauseTimer(worker_app.metrics).install()
    gc.set_threshold(settings.worker.gc_threshold, *gc.get_threshold()[1:])
    gc.freeze()
    level = settings.worker.log_level
    worker = BoundedStopWorker(
        worker_app.app, settings.worker.stop_timeout_s, loglevel=level, quiet=True
    )
    if not worker.stdout.isatty():
        worker.spinner = None  # it hides and shows the cursor even where there is none
    # Their debug calls would build a log record per message sent or received.
    for name in ("faust", "aiokafka", "mode"):
        logging.getLogger(name).setLevel(level.upper())
    worker.execute_from_commandline()
