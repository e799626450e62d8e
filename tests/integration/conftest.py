"""Fixtures of the integration tests: a fresh rlpulse home, as on a new machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpulse.local.broker import KafkaJars
from rlpulse.settings import Settings


@pytest.fixture
def fresh_home(tmp_path: Path) -> Path:
    """An empty RLPULSE_HOME that shares only the resolved Kafka jars with this machine's."""
    home = tmp_path / "home"
    home.mkdir()
    jars = KafkaJars(Settings().home)
    if jars.ready():
        (home / "kafka-jars").mkdir()
        (home / "kafka-jars" / jars.directory.name).symlink_to(jars.directory)
    return home
