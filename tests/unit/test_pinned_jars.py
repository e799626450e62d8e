"""The broker's pinned jars: the pins agree with the pom; fetched, verified, repaired, refused.

The pins file is checked against the packaged pom. The fetching is checked on a made-up
pins file whose "jars" a ``file://`` mirror serves in Maven's layout (no network).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import re
import socket
from pathlib import Path
from typing import Any

import pytest

from rlpulse.local.broker import KafkaJars
from rlpulse.local.exceptions import BrokerError
from rlpulse.local.pinned_jars import MANIFEST, PinList, PinnedJars
from rlpulse.settings import JarSettings

KAFKA = Path(__file__).resolve().parents[2] / "rlpulse" / "local" / "kafka"


def test_the_pins_were_made_from_the_packaged_pom() -> None:
    """A changed pom needs `python scripts/pin_jars.py`: the pins name the pom's digest."""
    pins = PinList.read(KAFKA / "jars.txt")
    assert pins.pom_sha256 == hashlib.sha256((KAFKA / "pom.xml").read_bytes()).hexdigest()
    pom = (KAFKA / "pom.xml").read_text()
    (kafka,) = re.findall(r"<kafka\.version>(.+)</kafka\.version>", pom)
    (log4j,) = re.findall(r"<log4j\.version>(.+)</log4j\.version>", pom)
    assert KafkaJars(Path("/nonexistent")).kafka_version == kafka
    assert pins.version_of("log4j-slf4j-impl") == log4j
    assert len(pins.pins) == 46 and 40e6 < pins.total_bytes < 50e6
    assert all(re.fullmatch(r"[0-9a-f]{64}", pin.sha256) for pin in pins.pins)
    assert len({pin.file_name for pin in pins.pins}) == len(pins.pins)  # one directory holds all


def test_a_malformed_pin_is_refused_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "jars.txt"
    path.write_text("# pom.xml sha256 ab\norg.example:a:1 10 " + "0" * 64 + "\norg.example:b 3 x\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:3: expected"):
        PinList.read(path)


class Mirror:
    """Made-up jars in Maven's layout under ``root``, and their pins file."""

    def __init__(self, tmp_path: Path, count: int = 3) -> None:
        self.root = tmp_path / "mirror"
        self.contents = {f"lib{n}": bytes([n]) * (70_000 + n) for n in range(count)}
        lines = ["# pom.xml sha256 " + "0" * 64]
        for name, data in self.contents.items():
            path = self.root / "org" / "example" / name / "1.0" / f"{name}-1.0.jar"
            path.parent.mkdir(parents=True)
            path.write_bytes(data)
            lines.append(f"org.example:{name}:1.0 {len(data)} {hashlib.sha256(data).hexdigest()}")
        self.pins_file = tmp_path / "jars.txt"
        self.pins_file.write_text("\n".join(lines) + "\n")

    def jar(self, name: str) -> Path:
        return self.root / "org" / "example" / name / "1.0" / f"{name}-1.0.jar"

    def jars(self, cache: Path, **source: Any) -> PinnedJars:
        settings = JarSettings(**{"mirror": self.root.as_uri(), **source})
        return PinnedJars(
            cache, self.pins_file, settings, cache_name="jars", product="Example", error=BrokerError
        )


def test_fetched_once_then_found_by_stat_alone(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path)
    jars = mirror.jars(tmp_path / "cache")
    said: list[str] = []
    directory = jars.resolve(said.append)
    assert said[0].startswith(f"Fetching 3 Example jars (0.2 MB) from {mirror.root.as_uri()}")
    assert said[-1] == f"Fetched 3 jars (0.2 MB) into {directory}"
    for name, data in mirror.contents.items():
        assert (directory / f"{name}-1.0.jar").read_bytes() == data
    assert jars.ready() and (directory / MANIFEST).exists()
    for jar in mirror.root.rglob("*.jar"):
        jar.unlink()  # the mirror is gone: the cache alone serves
    again: list[str] = []
    assert jars.resolve(again.append) == directory and again == []


def test_a_truncated_jar_in_the_cache_is_found_and_fetched_again(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path)
    jars = mirror.jars(tmp_path / "cache")
    directory = jars.resolve(lambda _message: None)
    cut = directory / "lib1-1.0.jar"
    cut.write_bytes(cut.read_bytes()[:1000])
    stray = directory / "other-2.0.jar"  # the classpath is <directory>/*: nothing else may stay
    stray.write_bytes(b"x")
    assert not jars.ready()
    said: list[str] = []
    jars.resolve(said.append)
    assert said[0].startswith(f"{cut} is damaged (1000 of 70001 bytes, SHA-256 ")
    assert said[1].startswith("Fetching 1 Example jars")
    assert cut.read_bytes() == mirror.contents["lib1"] and not stray.exists()


def test_a_jar_changed_in_place_with_its_size_kept_is_found_by_its_digest(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path)
    jars = mirror.jars(tmp_path / "cache")
    directory = jars.resolve(lambda _message: None)
    changed = directory / "lib2-1.0.jar"
    changed.write_bytes(b"\xff" * changed.stat().st_size)  # a new mtime: hashed again
    said: list[str] = []
    jars.resolve(said.append)
    assert said[0].startswith(f"{changed} is damaged (70002 of 70002 bytes")
    assert changed.read_bytes() == mirror.contents["lib2"]


def test_a_wrong_file_from_the_mirror_is_tried_twice_then_refused_by_name(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path)
    mirror.jar("lib0").write_bytes(b"not the jar")
    jars = mirror.jars(tmp_path / "cache")
    with pytest.raises(BrokerError) as refused:
        jars.resolve(lambda _message: None)
    message = str(refused.value)
    assert message.startswith(f"org.example:lib0:1.0 from {mirror.jar('lib0').as_uri()} is 11 ")
    assert "twice; the pinned jar is 70000 bytes, SHA-256 " in message
    assert "\n" not in message
    assert list(jars.directory.glob("*lib0*")) == []  # nothing half-written stays


def test_an_unreachable_mirror_is_one_line_naming_the_address_and_the_setting(
    tmp_path: Path,
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    jars = Mirror(tmp_path).jars(tmp_path / "cache", mirror=f"http://127.0.0.1:{port}/maven2")
    with pytest.raises(BrokerError) as refused:
        jars.resolve(lambda _message: None)
    message = str(refused.value)
    assert message.startswith(
        f"cannot reach http://127.0.0.1:{port}/maven2/org/example/lib0/1.0/lib0-1.0.jar ("
    )
    assert "Connection refused" in message and "jars.mirror (RLPULSE_JARS__MIRROR)" in message
    assert "\n" not in message


def test_an_offline_directory_serves_flat_or_in_maven_layout(tmp_path: Path) -> None:
    mirror = Mirror(tmp_path)
    flat = mirror.jars(tmp_path / "c1").fetch_to(tmp_path / "flat", lambda _message: None)
    assert sorted(p.name for p in flat.glob("*.jar")) == [
        "lib0-1.0.jar",
        "lib1-1.0.jar",
        "lib2-1.0.jar",
    ]
    for offline in (flat, mirror.root):
        jars = mirror.jars(tmp_path / f"cache-{offline.name}", offline_dir=offline)
        said: list[str] = []
        directory = jars.resolve(said.append)
        assert said[0].startswith(f"Fetching 3 Example jars (0.2 MB) from {offline}")
        assert (directory / "lib2-1.0.jar").read_bytes() == mirror.contents["lib2"]
    empty = mirror.jars(tmp_path / "c3", offline_dir=tmp_path / "empty")
    with pytest.raises(BrokerError, match=r"^org\.example:lib0:1\.0 is not in jars\.offline_dir"):
        empty.resolve(lambda _message: None)


def test_a_cache_that_cannot_be_written_gives_the_os_reason(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    jars = Mirror(tmp_path).jars(blocker / "cache")
    with pytest.raises(
        BrokerError, match=rf"^cannot make {re.escape(str(jars.directory))}: Not a directory$"
    ):
        jars.resolve(lambda _message: None)


def test_without_file_locks_the_fetch_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lustre can answer flock with ENOSYS: say so, and fetch without the lock."""

    def no_locks(_file: object, _operation: int) -> None:
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    mirror = Mirror(tmp_path)
    said: list[str] = []
    directory = mirror.jars(tmp_path / "cache").resolve(said.append)
    assert (
        said[0]
        == f"{directory.parent} has no file locks (Function not implemented); going on without"
    )
    assert (directory / "lib0-1.0.jar").read_bytes() == mirror.contents["lib0"]
