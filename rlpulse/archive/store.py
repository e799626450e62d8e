"""The archive's files on a pyarrow filesystem: list, write durably, delete.

A local directory (the default) gets crash-safe writes: each file is written under a
temporary name beginning with ``.`` in its final directory, fsynced, and renamed only
when every file of its flush is on disk; then the directories are fsynced. An object store
(``s3://bucket/prefix``; any other URI ``pyarrow.fs.FileSystem.from_uri`` accepts) has no
rename, but an object appears whole when its upload completes, or not at all: files are
written under their final names, one after the other, and a flush cut short shows as fewer
than its ``n`` files (:mod:`rlpulse.archive.layout` deletes those on resume).

``s3://`` roots go to AWS S3, or to the S3-compatible server at ``archive.s3_endpoint``
(:func:`s3_filesystem`); tested against S3Proxy 2.6.0 (``tests/support/s3proxy.py``).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rlpulse.archive.exceptions import ArchiveError
from rlpulse.archive.layout import TEMP_PREFIX, FileName
from rlpulse.settings import ArchiveSettings

__all__ = ["CHECKSUM_ENVIRONMENT", "ArchiveStore", "StagedFile", "s3_filesystem"]

CHECKSUM_ENVIRONMENT = {
    "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED",
    "AWS_RESPONSE_CHECKSUM_VALIDATION": "WHEN_REQUIRED",
}
"""What :func:`s3_filesystem` puts in the environment unless it is set there already.

The AWS SDK in pyarrow sends (and checks) flexible checksums on every request by default;
S3-compatible servers that predate them refuse the uploads (S3Proxy 2.6.0, measured here:
"XAmzContentSHA256Mismatch"; gaul/s3proxy#795). Asking for checksums only where an operation
requires them is what AWS SDKs did before 2025, and AWS S3 accepts it.
"""


def s3_filesystem(
    options: ArchiveSettings, *, bucket: str | None = None, allow_bucket_creation: bool = False
) -> pafs.S3FileSystem:
    """The S3 client (pyarrow's) for the endpoint, region and credentials of ``options``.

    Without an endpoint or a region, the region of ``bucket`` is asked of AWS (as
    ``FileSystem.from_uri`` does). Without an access key id, the AWS default chain supplies
    the credentials. Sets :data:`CHECKSUM_ENVIRONMENT` where the environment does not.
    """
    for name, value in CHECKSUM_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    endpoint = None if options.s3_endpoint is None else urlsplit(options.s3_endpoint)
    region = options.s3_region
    if region is None and endpoint is None and bucket:
        region = pafs.resolve_s3_region(bucket)
    secret = options.s3_secret()
    return pafs.S3FileSystem(
        access_key=options.s3_access_key_id if secret is not None else None,
        secret_key=secret,
        region=region,
        scheme=None if endpoint is None else endpoint.scheme,
        endpoint_override=None if endpoint is None else endpoint.netloc,
        allow_bucket_creation=allow_bucket_creation,
    )


@dataclass(frozen=True)
class StagedFile:
    """A file written under a temporary name, waiting to be renamed."""

    temp: str
    final: str


class ArchiveStore:
    """The files under one archive root (a directory or a filesystem URI).

    ``options`` (the ``archive`` settings) say where an ``s3://`` root's server is and how to
    sign in; other roots ignore them.
    """

    def __init__(self, root: str, options: ArchiveSettings | None = None) -> None:
        self.root = root
        try:
            if root.startswith("s3://"):
                parts = urlsplit(root)
                self.fs = s3_filesystem(options or ArchiveSettings(), bucket=parts.netloc)
                base = parts.netloc + parts.path
            elif "://" in root:
                self.fs, base = pafs.FileSystem.from_uri(root)
            else:
                self.fs, base = pafs.LocalFileSystem(), str(Path(root).expanduser().absolute())
        except (pa.ArrowInvalid, OSError) as exc:
            raise ArchiveError(f"archive root {root!r} is not usable: {exc}") from exc
        self.base = base.rstrip("/")
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        """Whether the archive is a local directory (crash-safe renames)."""

    def exists(self) -> bool:
        """Whether the root is there, as a directory (what the archiver writes into)."""
        try:
            return bool(self.fs.get_file_info(self.base).type == pafs.FileType.Directory)
        except OSError as exc:
            raise ArchiveError(f"cannot reach the archive at {self.root}: {exc}") from exc

    def prepare(self) -> None:
        """Make a local root and check a file can be written there; an object store: nothing.

        What the archiver calls before it reads anything, so that a root it cannot write
        (a typo, a read-only mount) is refused at start, not at the first flush minutes later.
        """
        if not self.local:
            return
        try:
            os.makedirs(self.base, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.base) as probe:  # nameless: nothing left over
                probe.write(b"rlpulse")
        except OSError as exc:
            raise ArchiveError(f"cannot write to the archive at {self.root}: {exc}") from exc

    def path(self, relative: str) -> str:
        """The full path of ``relative`` under the root."""
        return f"{self.base}/{relative}"

    def files(self, topic: str) -> list[tuple[str, FileName]]:
        """Every archive file of ``topic``: (full path, parsed name)."""
        found = []
        for info in self._walk(self.path(topic)):
            name = FileName.parse(info.base_name)
            if name is not None:
                found.append((info.path, name))
        return found

    def temp_files(self, topic: str, partition: int) -> list[str]:
        """Temporary files that a writer of ``topic`` partition ``partition`` left behind."""
        prefix = f"{TEMP_PREFIX}{partition:05d}-"
        return [
            info.path for info in self._walk(self.path(topic)) if info.base_name.startswith(prefix)
        ]

    def _walk(self, directory: str) -> Iterator[pafs.FileInfo]:
        selector = pafs.FileSelector(directory, recursive=True, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(selector)
        except OSError as exc:
            raise ArchiveError(f"cannot list {directory}: {exc}") from exc
        return (info for info in infos if info.type == pafs.FileType.File)

    def stage(self, relative: str, table: pa.Table, compression: str) -> StagedFile:
        """Write ``table`` for the final path ``relative``; durable, not yet visible."""
        final = self.path(relative)
        directory, _, name = final.rpartition("/")
        if not self.local:
            try:
                with self.fs.open_output_stream(final) as stream:
                    pq.write_table(table, stream, compression=compression)
            except OSError as exc:
                raise ArchiveError(f"cannot write {final}: {exc}") from exc
            return StagedFile(final, final)
        temp = f"{directory}/{TEMP_PREFIX}{name}.{uuid.uuid4().hex[:8]}"
        missing: OSError | None = None
        for _ in range(3):  # a concurrent prune may remove the directory once it is empty
            try:  # (or its parent, between makedirs' steps)
                os.makedirs(directory, exist_ok=True)
                handle = open(temp, "wb")  # noqa: SIM115 -- closed below, after the fsync
            except FileNotFoundError as exc:
                missing = exc
                continue
            except OSError as exc:
                raise ArchiveError(f"cannot create {temp}: {exc}") from exc
            try:
                with handle:
                    pq.write_table(table, handle, compression=compression)
                    handle.flush()
                    os.fsync(handle.fileno())
            except OSError as exc:
                raise ArchiveError(f"cannot write {temp}: {exc}") from exc
            return StagedFile(temp, final)
        raise ArchiveError(
            f"cannot create {temp}: {missing} (three tries; a prune removing the directory "
            "each time, or a directory that cannot be made there)"
        )

    def commit(self, staged: list[StagedFile]) -> None:
        """Make staged files visible under their final names (renames, then directory fsyncs)."""
        if not self.local:
            return
        directories = set()
        for file in staged:
            os.replace(file.temp, file.final)
            directories.add(file.final.rpartition("/")[0])
        for directory in sorted(directories):
            _fsync_directory(directory)

    def delete(self, paths: list[str]) -> None:
        """Delete ``paths`` (already gone is fine), then directories they leave empty."""
        parents = set()
        for path in paths:
            try:
                self.fs.delete_file(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise ArchiveError(f"cannot delete {path}: {exc}") from exc
            parents.add(path.rpartition("/")[0])
        if self.local:
            for directory in sorted(parents, key=len, reverse=True):
                _remove_empty_up_to(directory, self.base)


def _fsync_directory(directory: str) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _remove_empty_up_to(directory: str, base: str) -> None:
    """Remove ``directory`` and its parents while empty, never ``base`` or above it."""
    current = Path(directory)
    stop = Path(base)
    while current != stop and stop in current.parents:
        try:
            current.rmdir()
        except OSError:
            return
        current = current.parent
