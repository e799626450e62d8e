"""Where a test's archive lives: a local directory, or a prefix of a bucket on S3Proxy.

The archive tests run once per kind of root with the same body (the ``archive_location``
fixture in ``conftest.py``); what differs between the kinds is here: the root and the
settings that reach it, and how a test sees a flush that is being written.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from rlpulse.archive.catalog import open_archive, query_archive
from rlpulse.archive.layout import TEMP_PREFIX, FileName
from rlpulse.archive.store import ArchiveStore, s3_filesystem
from rlpulse.local.child_process import setting_variables
from rlpulse.schemas.topics import Topics
from rlpulse.settings import ArchiveSettings
from tests.support.s3proxy import S3Proxy

KINDS = ("local", "s3")
BUCKET = "rlpulse-tests"


@dataclass
class ArchiveLocation:
    """An archive root, the settings that reach it, and where its files physically are."""

    kind: str
    root: str
    options: ArchiveSettings
    files_dir: Path
    """The archive's files on this machine's disk: the root, or S3Proxy's copy of the prefix."""
    settle_s: float = 0.0
    """How long after a writer died its last request may still land (an upload S3Proxy had)."""

    @classmethod
    def local(cls, directory: Path) -> ArchiveLocation:
        """An archive in a local directory."""
        return cls("local", str(directory), ArchiveSettings(root=str(directory)), directory)

    @classmethod
    def on_s3(cls, server: S3Proxy) -> ArchiveLocation:
        """An archive under a new prefix of the test bucket on ``server``."""
        prefix = f"archive-{uuid.uuid4().hex[:10]}"
        options = server.archive_settings(f"s3://{BUCKET}/{prefix}")
        s3_filesystem(options, allow_bucket_creation=True).create_dir(BUCKET)
        return cls("s3", options.root or "", options, server.data_dir / BUCKET / prefix, 1.0)

    def child_settings(self, **settings: object) -> dict[str, object]:
        """``settings`` (dotted names) plus those that reach this root, for a child process.

        A child gets them as ``RLPULSE_*`` variables (``ArchiverProcess``,
        :meth:`environment`): the only way a secret may reach it.
        """
        if self.kind == "local":
            return dict(settings)
        return {
            "archive.s3_endpoint": self.options.s3_endpoint,
            "archive.s3_access_key_id": self.options.s3_access_key_id,
            "archive.s3_secret_access_key": self.options.s3_secret(),
            **settings,
        }

    def environment(self) -> dict[str, str]:
        """This process's environment plus what a child needs to read this root."""
        return {**os.environ, **setting_variables(self.child_settings())}

    def store(self) -> ArchiveStore:
        """The archive's files, through pyarrow (S3 for an s3:// root)."""
        return ArchiveStore(self.root, self.options)

    def open(self, topics: Topics) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection over the archive."""
        return open_archive(self.root, topics, options=self.options)

    def query(self, topics: Topics, sql: str, parameters: list[Any] | None = None) -> list[Any]:
        """The rows of ``sql`` over the archive."""
        return query_archive(self.root, topics, sql, parameters, options=self.options)[1]

    def flushes_in_progress(self, missing_at_least: int = 1) -> set[str]:
        """What shows flushes being written now, read from the disk (fast enough to poll).

        A local root: the temporary files of a flush (renamed when all are written). An S3
        root: the objects of flushes that have some of their ``n`` objects but miss at least
        ``missing_at_least`` (objects appear whole, one after the other), each with its inode,
        so that an object written again under the same name is new and deleting one never is.
        """
        if self.kind == "local":
            return {
                os.path.join(directory, name)
                for directory, _subdirs, names in os.walk(self.files_dir)
                for name in names
                if name.startswith(TEMP_PREFIX)
            }
        flushes: dict[tuple[str, int, int, int], list[tuple[str, int]]] = {}
        counts: dict[tuple[str, int, int, int], int] = {}
        for directory, _subdirs, names in os.walk(self.files_dir):
            topic = Path(directory).relative_to(self.files_dir).parts[:1]
            for name in names:
                parsed = FileName.parse(name)
                if parsed is None or not topic:
                    continue
                key = (topic[0], *parsed.flush)
                path = os.path.join(directory, name)
                with contextlib.suppress(FileNotFoundError):
                    flushes.setdefault(key, []).append((path, os.stat(path).st_ino))
                counts[key] = parsed.count
        return {
            f"{path}@{inode}"
            for key, objects in flushes.items()
            if len(objects) <= counts[key] - missing_at_least
            for path, inode in objects
        }
