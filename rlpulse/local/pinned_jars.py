"""The local broker's jars, pinned in the package and fetched without Maven.

``kafka/jars.txt`` lists every jar the broker runs from: group, artifact, version, size and
SHA-256, with the digest of the ``pom.xml`` the list was made from
(``scripts/pin_jars.py`` makes it with Maven; a unit test checks the two agree). rlpulse
downloads each from a Maven repository (``jars.mirror``: Maven Central, or an
Artifactory/Nexus mirror; a ``file://`` one too) or copies it from ``jars.offline_dir``, and
keeps a jar only if its SHA-256 is the pinned one. A jar whose digest is wrong is fetched
once more, then refused with its coordinates named.

The cache is ``<home>/<cache name>/<digest of the list>/``; ``manifest.json`` there records
each jar's size and modification time when it was last verified, so a start compares 46
``stat`` results and hashes a jar again only when those changed (a truncated or replaced jar
is found that way and fetched again). Concurrent first runs take turns on a lock beside the
cache. Where ``flock`` fails for want of support (Lustre can answer ENOSYS) they go on
without it: each writes its own part files and renames finished, verified jars into place.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

from rlpulse.local.exceptions import LocalError
from rlpulse.local.java import Progress
from rlpulse.settings import JarSettings

__all__ = ["Pin", "PinList", "PinnedJars"]

MANIFEST: Final = "manifest.json"
_CHUNK: Final = 1 << 16
_UNSUPPORTED_LOCK: Final = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP})
_PROGRESS_STEPS: Final = 4
"""How many progress lines a full download says (besides its first and last)."""


@dataclass(frozen=True)
class Pin:
    """One pinned jar: its Maven coordinates, size in bytes and SHA-256 (hex)."""

    group: str
    artifact: str
    version: str
    size: int
    sha256: str

    @property
    def coordinates(self) -> str:
        """``group:artifact:version``."""
        return f"{self.group}:{self.artifact}:{self.version}"

    @property
    def file_name(self) -> str:
        """The jar's file name: ``artifact-version.jar``."""
        return f"{self.artifact}-{self.version}.jar"

    @property
    def repository_path(self) -> str:
        """Where a Maven repository serves it, relative to the repository's root."""
        return f"{self.group.replace('.', '/')}/{self.artifact}/{self.version}/{self.file_name}"


@dataclass(frozen=True)
class PinList:
    """A parsed pins file: the pom it was made from (its SHA-256) and its jars."""

    pom_sha256: str
    pins: tuple[Pin, ...]
    digest: str
    """The first 12 hex digits of the file's own SHA-256: the cache directory's name."""

    @classmethod
    def read(cls, path: Path) -> PinList:
        """Parse ``path``; ValueError with ``file:line`` for a line that is not a pin."""
        data = path.read_bytes()
        pom_sha256 = ""
        pins = []
        for number, line in enumerate(data.decode().splitlines(), start=1):
            text = line.strip()
            if text.startswith("# pom.xml sha256 "):
                pom_sha256 = text.rsplit(" ", 1)[1]
            if not text or text.startswith("#"):
                continue
            fields = text.split()
            coordinates = fields[0].split(":") if fields else []
            if len(fields) != 3 or len(coordinates) != 3 or not fields[1].isdigit():
                raise ValueError(f"{path}:{number}: expected 'group:artifact:version size sha256'")
            group, artifact, version = coordinates
            pins.append(Pin(group, artifact, version, int(fields[1]), fields[2].lower()))
        if not pom_sha256:
            raise ValueError(f"{path}: no '# pom.xml sha256 <hex>' line")
        return cls(pom_sha256, tuple(pins), hashlib.sha256(data).hexdigest()[:12])

    @property
    def total_bytes(self) -> int:
        """The size of all the jars together."""
        return sum(pin.size for pin in self.pins)

    def version_of(self, artifact: str) -> str:
        """The pinned version of ``artifact`` (KeyError if it is not pinned)."""
        for pin in self.pins:
            if pin.artifact == artifact:
                return pin.version
        raise KeyError(artifact)


class _DigestMismatchError(Exception):
    """A fetched file whose SHA-256 or size is not the pinned one."""

    def __init__(self, size: int, sha256: str) -> None:
        super().__init__(f"{size} bytes, SHA-256 {sha256}")
        self.size = size
        self.sha256 = sha256


class PinnedJars:
    """The jars of one pins file, verified in ``<cache_dir>/<cache_name>/<list digest>``.

    ``product`` names them in messages ("Apache Kafka"); ``source`` says where they come
    from; ``error`` is the exception class raised, with one line saying what to change.
    """

    def __init__(
        self,
        cache_dir: Path,
        pins_file: Path,
        source: JarSettings,
        *,
        cache_name: str,
        product: str,
        error: type[LocalError],
    ) -> None:
        self.pins_file = pins_file
        self.pin_list = PinList.read(pins_file)
        self.source = source
        self.product = product
        self.error = error
        self.directory = cache_dir / cache_name / self.pin_list.digest

    def ready(self) -> bool:
        """Whether every jar is in the cache as last verified (a ``stat`` each; no hashing)."""
        manifest = _read_manifest(self.directory)
        return all(
            _unchanged(self.directory / pin.file_name, manifest.get(pin.file_name), pin)
            for pin in self.pin_list.pins
        )

    def resolve(self, progress: Progress) -> Path:
        """The cache directory with every pinned jar verified in it, fetching what is missing."""
        if self.ready():
            return self.directory
        self._make_directory(self.directory)
        with self._lock(self.directory.with_name(self.directory.name + ".lock"), progress):
            self._complete(self.directory, progress)
        return self.directory

    def fetch_to(self, target: Path, progress: Progress) -> Path:
        """Every pinned jar, verified, in ``target`` (for ``jars.offline_dir`` elsewhere)."""
        self._make_directory(target)
        with self._lock(target / ".rlpulse-jars.lock", progress):
            self._complete(target, progress)
        return target

    def _make_directory(self, directory: Path) -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self.error(f"cannot make {directory}: {exc.strerror}") from None

    @contextlib.contextmanager
    def _lock(self, path: Path, progress: Progress) -> Iterator[None]:
        """Hold ``path``'s flock (waiting for another process), or go on where there is none."""
        try:
            handle = path.open("a")
        except OSError as exc:
            raise self.error(f"cannot write {path}: {exc.strerror}") from None
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                progress(f"Waiting for another process fetching the {self.product} jars")
                fcntl.flock(handle, fcntl.LOCK_EX)
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED_LOCK:
                    raise
                progress(f"{path.parent} has no file locks ({exc.strerror}); going on without")
            yield

    def _complete(self, directory: Path, progress: Progress) -> None:
        """Verify what ``directory`` holds, fetch the rest, and write its manifest."""
        manifest = _read_manifest(directory)
        missing: list[Pin] = []
        for pin in self.pin_list.pins:
            path = directory / pin.file_name
            recorded = manifest.get(pin.file_name)
            if _unchanged(path, recorded, pin):
                continue
            if path.exists():
                size, sha256 = _hash_file(path)
                if size == pin.size and sha256 == pin.sha256:
                    manifest[pin.file_name] = _entry(path)
                    continue
                progress(
                    f"{path} is damaged ({size} of {pin.size} bytes, SHA-256 {sha256[:12]}…); "
                    "fetching it again"
                )
            missing.append(pin)
        pinned = {pin.file_name for pin in self.pin_list.pins}
        for stray in directory.glob("*.jar"):  # the broker's classpath is <directory>/*
            if stray.name not in pinned:
                stray.unlink()
        if missing:
            self._fetch_all(missing, directory, manifest, progress)
        else:
            self._write_manifest(directory, manifest)

    def _fetch_all(
        self,
        missing: list[Pin],
        directory: Path,
        manifest: dict[str, list[int]],
        progress: Progress,
    ) -> None:
        total = sum(pin.size for pin in missing)
        where = self.source.offline_dir or self.source.mirror
        progress(
            f"Fetching {len(missing)} {self.product} jars ({_mb(total)}) from {where} "
            "(first run only; each checked against its pinned SHA-256)"
        )
        done = 0
        said = 0
        for count, pin in enumerate(missing, start=1):
            self._fetch_one(pin, directory)
            manifest[pin.file_name] = _entry(directory / pin.file_name)
            done += pin.size
            if done * _PROGRESS_STEPS // total > said and count < len(missing):
                said = done * _PROGRESS_STEPS // total
                progress(f"  {_mb(done)} of {_mb(total)} ({count} of {len(missing)} jars)")
        self._write_manifest(directory, manifest)
        progress(f"Fetched {len(missing)} jars ({_mb(total)}) into {directory}")

    def _fetch_one(self, pin: Pin, directory: Path) -> None:
        """Fetch ``pin`` into ``directory``, trying twice before refusing a wrong digest."""
        target = directory / pin.file_name
        part = directory / f".{pin.file_name}.part-{os.getpid()}"
        address = self._address(pin)
        try:
            for attempt in (1, 2):
                try:
                    with self._open(pin, address) as stream:
                        self._copy_checked(stream, part, pin, address)
                except _DigestMismatchError as wrong:
                    if attempt == 2:
                        raise self.error(
                            f"{pin.coordinates} from {address} is {wrong}, twice; the pinned jar "
                            f"is {pin.size} bytes, SHA-256 {pin.sha256}. The source serves "
                            "another or a damaged file: check jars.mirror / jars.offline_dir."
                        ) from None
                    continue
                os.replace(part, target)
                return
        finally:
            part.unlink(missing_ok=True)

    def _address(self, pin: Pin) -> str:
        if self.source.offline_dir is not None:
            flat = self.source.offline_dir / pin.file_name
            layout = self.source.offline_dir / pin.repository_path
            return str(layout if layout.exists() and not flat.exists() else flat)
        return f"{self.source.mirror.rstrip('/')}/{pin.repository_path}"

    def _open(self, pin: Pin, address: str) -> IO[bytes]:
        """A stream of ``pin``'s bytes at ``address``; one line naming what to change if not."""
        if self.source.offline_dir is not None:
            try:
                return open(address, "rb")
            except OSError as exc:
                raise self.error(
                    f"{pin.coordinates} is not in jars.offline_dir ({address}: {exc.strerror}); "
                    "fill it with `rlpulse broker fetch --to DIR` where a mirror is reachable"
                ) from None
        try:
            response: IO[bytes] = urllib.request.urlopen(
                address, timeout=self.source.timeout_s, context=self._tls()
            )
        except urllib.error.HTTPError as exc:
            raise self.error(
                f"{address} answered HTTP {exc.code} ({exc.reason}) for {pin.coordinates}; "
                "jars.mirror (RLPULSE_JARS__MIRROR) must be a Maven repository that serves it"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise self.error(
                f"cannot reach {address} ({reason}); set jars.mirror (RLPULSE_JARS__MIRROR) to a "
                "Maven repository this machine reaches, or jars.offline_dir to a directory of "
                "the jars (`rlpulse broker fetch --to DIR` on a machine that has internet)"
            ) from None
        return response

    def _tls(self) -> ssl.SSLContext | None:
        if not self.source.mirror.startswith("https:"):
            return None
        ca_file = self.source.ca_file
        return ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))

    def _copy_checked(self, stream: IO[bytes], part: Path, pin: Pin, address: str) -> None:
        """Write ``stream`` to ``part``; _DigestMismatchError unless it is the pinned jar."""
        digest = hashlib.sha256()
        size = 0
        try:
            out = part.open("wb")
        except OSError as exc:
            raise self.error(f"cannot write {part}: {exc.strerror}") from None
        with out:
            while True:
                try:
                    chunk = stream.read(_CHUNK)
                except OSError as exc:
                    raise self.error(f"reading {address} failed: {exc}") from None
                if not chunk:
                    break
                size += len(chunk)
                if size > pin.size:
                    break  # a wrong file; no need to read on
                digest.update(chunk)
                try:
                    out.write(chunk)
                except OSError as exc:
                    raise self.error(f"cannot write {part}: {exc.strerror}") from None
        if size != pin.size or digest.hexdigest() != pin.sha256:
            raise _DigestMismatchError(size, digest.hexdigest())

    def _write_manifest(self, directory: Path, manifest: dict[str, list[int]]) -> None:
        staging = directory / f".{MANIFEST}.{os.getpid()}"
        try:
            staging.write_text(json.dumps(manifest, indent=1, sort_keys=True))
            os.replace(staging, directory / MANIFEST)
        except OSError as exc:
            staging.unlink(missing_ok=True)
            raise self.error(f"cannot write {directory / MANIFEST}: {exc.strerror}") from None


def _read_manifest(directory: Path) -> dict[str, list[int]]:
    try:
        data = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _entry(path: Path) -> list[int]:
    status = path.stat()
    return [status.st_size, status.st_mtime_ns]


def _unchanged(path: Path, recorded: list[int] | None, pin: Pin) -> bool:
    """Whether ``path`` is as it was when verified (and that was ``pin``'s size)."""
    if recorded is None or recorded[0] != pin.size:
        return False
    try:
        return _entry(path) == recorded
    except OSError:
        return False


def _hash_file(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            size += len(chunk)
            digest.update(chunk)
    return size, digest.hexdigest()


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"
