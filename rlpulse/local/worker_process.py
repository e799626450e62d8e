"""A worker running as a child process: what the demo, the tests and the benchmarks start."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

from rlpulse.local.broker import tail
from rlpulse.local.child_process import ServiceProcess
from rlpulse.local.exceptions import WorkerProcessError
from rlpulse.local.group_probe import group_stable, group_stable_in_child
from rlpulse.settings import Settings, load_settings
from rlpulse.transport.clients import new_admin, worker_client_id

__all__ = ["WorkerProcess"]


class WorkerProcess(ServiceProcess):
    """Starts ``rlpulse worker`` in a child process and stops it by signal."""

    subcommand = "worker"

    def __init__(
        self,
        bootstrap: str,
        prefix: str,
        log_file: Path,
        rules: str | None = "seed",
        partitions: int = 6,
        grace_s: float = 30.0,
        extra_args: tuple[str, ...] = (),
        data_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        watch_settings: Settings | None = None,
    ) -> None:
        super().__init__(bootstrap, prefix, log_file, env, extra_args)
        self.rules = rules
        self.partitions = partitions
        self.grace_s = grace_s
        self.data_dir = data_dir or log_file.parent / f"{prefix}-worker-data"
        self.watch_settings = watch_settings
        """How :meth:`wait_consuming` reaches Kafka (default: ``bootstrap``, unsecured)."""

    @property
    def group_id(self) -> str:
        """The worker's consumer group."""
        return f"{self.prefix}-worker"

    def _options(self) -> list[str]:
        return [
            *(() if self.rules is None else ("--rules", self.rules)),
            "--partitions",
            str(self.partitions),
            "--grace-s",
            str(self.grace_s),
            "--data-dir",
            str(self.data_dir),
        ]

    def wait_consuming(self, timeout_s: float = 60.0) -> None:
        """Block until the worker's consumer group is stable with this worker in it.

        This worker is recognised by its client id
        (:func:`~rlpulse.transport.clients.worker_client_id`): a worker started beside a killed
        one would otherwise count the dead member, which stays in the group until its session
        times out.

        On an unsecured cluster of several brokers a child process asks (see
        :mod:`rlpulse.local.group_probe`: librdkafka can abort the asking process there).
        """
        watch = self.watch_settings or load_settings({"bootstrap": self.bootstrap})
        admin = new_admin(watch, "worker watch")
        brokers = len(admin.list_topics(timeout=timeout_s).brokers)
        in_child = brokers > 1 and self.watch_settings is None
        assert self.process is not None, "wait_consuming before start"
        client_id = worker_client_id(self.process.pid)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise WorkerProcessError(
                    f"worker exited early; its log:\n{tail(self.log_file, 30)}"
                )
            if in_child:
                stable = group_stable_in_child(self.bootstrap, self.group_id, client_id)
            else:
                stable = group_stable(admin, self.group_id, client_id)
            if stable:
                return
            time.sleep(0.3)
        raise WorkerProcessError(
            f"worker did not join group {self.group_id} within {timeout_s:.0f} s; "
            f"its log:\n{tail(self.log_file, 30)}"
        )
