"""What the guides and docstrings point at exists: repository paths, and the link's attributes.

A guide that names a file the repository does not have (a requirements file under ci/ that
was never there) or an attribute the code does not (the link's "logger", which is its
``events``) sends a new user nowhere.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlpulse.producers import RunLink
from rlpulse.settings import ProducerSettings, Settings

ROOT = Path(__file__).resolve().parents[2]
TOP = ("rlpulse", "tests", "compose", "benchmarks", "docs", "ci", "schemas", "rules", "streams")
PATH = re.compile(r"`{1,2}((?:" + "|".join(TOP) + r")/[\w./-]*\w)`{1,2}")
LINK_ATTRIBUTE = re.compile(r"`link\.(\w+)(?:\.(\w+))?")
EXAMPLES = {"rules/my-rules.yaml"}  # what a user writes, not a file of the repository


def texts() -> dict[Path, str]:
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    files += [*(ROOT / "tests").rglob("*.py"), *(ROOT / "rlpulse").rglob("*.py")]
    return {path: path.read_text() for path in files}


def test_every_repository_path_a_guide_or_docstring_names_exists() -> None:
    missing = [
        f"{path.relative_to(ROOT)}: {name}"
        for path, text in texts().items()
        for name in PATH.findall(text)
        if not any(c in name for c in "*<{") and name not in EXAMPLES and not (ROOT / name).exists()
    ]
    assert missing == []


def test_the_link_attributes_the_guides_name_exist(tmp_path: Path) -> None:
    guides = {p: t for p, t in texts().items() if p.suffix == ".md"}
    named = {m for text in guides.values() for m in LINK_ATTRIBUTE.findall(text)}
    settings = Settings(producer=ProducerSettings(spool_dir=tmp_path))
    link = RunLink("docs-run", settings=settings)  # no network I/O until it sends
    try:
        for first, second in sorted(named):
            assert hasattr(link, first), f"link.{first}"
            if second:
                assert hasattr(getattr(link, first), second), f"link.{first}.{second}"
    finally:
        link.close(end=False)
