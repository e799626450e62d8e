"""A built wheel carries every subpackage and data file, and imports from itself."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _clean_source(dest: Path) -> Path:
    """A copy of the source tree without build outputs: a stale ``build/`` must not hide data."""
    shutil.copytree(
        ROOT,
        dest,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".venv"
        ),
    )
    return dest


def test_wheel_contains_subpackages_and_data(tmp_path: Path) -> None:
    source = _clean_source(tmp_path / "source")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "-o",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("rlpulse-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "rlpulse/producers/__init__.py",
        "rlpulse/rules/presets/seed.yaml",
        "rlpulse/schemas/avro/TrainerEvent.v1.avsc",
        "rlpulse/streams/joiner.py",
        "rlpulse/local/kafka/pom.xml",
        "rlpulse/local/kafka/server.properties",
        "rlpulse/local/opensearch/pom.xml",
        "rlpulse/local/opensearch/RlpulseNode.java",
        "rlpulse/local/opensearch/log4j2.properties",
        "rlpulse/py.typed",
    ):
        assert required in names, required
    unpacked = tmp_path / "unpacked"
    zipfile.ZipFile(wheel).extractall(unpacked)
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import rlpulse.producers, rlpulse.rules, rlpulse.schemas;"
        "assert rlpulse.producers.__file__.startswith(sys.argv[1]);"
        "rlpulse.rules.load_preset('seed'); rlpulse.schemas.default_codec()"
    )
    subprocess.run([sys.executable, "-c", probe, str(unpacked)], check=True, cwd=tmp_path)
