"""Fixtures of the integration tests: a fresh rlpulse home, as on a new machine; archive roots."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpulse.local.broker import KafkaJars
from rlpulse.settings import Settings
from tests.integration.archive_location import KINDS, ArchiveLocation
from tests.support.s3proxy import S3Proxy


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


@pytest.fixture(params=KINDS)
def archive_location(request: pytest.FixtureRequest, tmp_path: Path) -> ArchiveLocation:
    """A fresh archive root: a local directory, then (the same test again) a prefix on S3Proxy.

    S3Proxy (the session's ``s3proxy``) starts only when an S3 case runs.
    """
    if request.param == "local":
        return ArchiveLocation.local(tmp_path / "archive")
    server: S3Proxy = request.getfixturevalue("s3proxy")
    return ArchiveLocation.on_s3(server)
