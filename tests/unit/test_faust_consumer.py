"""The worker's faust app consumes with rlpulse's consumer, configured from the settings."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from faust.transport.drivers import aiokafka as faust_aiokafka

from rlpulse.settings import Settings, WorkerSettings
from rlpulse.streams.worker.app import faust_app
from rlpulse.streams.worker.faust_consumer import SteadyConsumer


def test_the_worker_app_uses_the_settings_fetch_wait_and_flow_control(tmp_path: Path) -> None:
    worker = WorkerSettings(fetch_max_wait_s=0.02, pause_on_busy_buffer=False)
    settings = Settings(home=tmp_path, worker=worker)
    consumer = faust_app(settings).transport.Consumer
    assert issubclass(consumer, SteadyConsumer)
    assert (consumer.fetch_max_wait_ms, consumer.pause_on_busy_buffer) == (20, False)


def test_the_faust_internals_it_replaces_are_where_it_expects_them() -> None:
    thread = faust_aiokafka.AIOKafkaConsumerThread
    assert callable(getattr(thread, "_create_worker_consumer", None))
    assert callable(getattr(faust_aiokafka.Consumer, "_new_consumer_thread", None))
    assert callable(getattr(faust_aiokafka.Consumer, "on_buffer_full", None))


def test_the_aiokafka_consumer_it_builds_gets_the_fetch_wait(tmp_path: Path) -> None:
    worker = WorkerSettings(fetch_max_wait_s=0.05)

    async def build() -> int:
        app = faust_app(Settings(home=tmp_path, worker=worker))
        consumer: Any = app.consumer
        thread = consumer._thread
        created = thread._create_worker_consumer(app.transport)
        try:
            return int(created._fetch_max_wait_ms)
        finally:
            await created.stop()

    assert asyncio.run(build()) == 50
