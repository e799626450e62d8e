"""The README's set-up commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def setup_section() -> str:
    """The README's "Set up on a fresh machine" section."""
    text = (ROOT / "README.md").read_text()
    return text.split("## Set up on a fresh machine", 1)[1].split("\n## ", 1)[0]


def setup_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", setup_section())


def test_readme_has_exactly_two_setup_commands() -> None:
    commands = setup_commands()
    assert len(commands) == 2
    assert commands[0].endswith("rlpulse demo")
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command() -> None:
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert setup_commands()[1] in ci_lines


def test_ci_installs_the_system_packages_the_readme_names() -> None:
    """A newcomer with what the README's set-up names has everything CI has."""
    (packages,) = re.findall(r"`(apt-get [^`]+)`", setup_section())
    ci = (ROOT / ".ci" / "run").read_text()
    assert packages in ci.splitlines()
    assert ci.count("apt-get install") == 1  # CI installs nothing else


def test_readme_names_a_fast_subset_and_one_file() -> None:
    text = (ROOT / "README.md").read_text()
    assert "`python -m pytest tests/unit`" in text
    assert "python -m pytest tests/integration/" in text
    assert (ROOT / "tests" / "README.md").exists()
