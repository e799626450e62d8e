"""The layout of docs/design.md holds: one name per module, and layers that import downwards.

The card's top-level folders (schemas/, producers/, rules/, streams/) are links to the real
packages under rlpulse/; importing them under their bare names must fail instead of loading
a second copy of the same files. The parts of rlpulse import each other only downwards, with
no cycle.
"""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import rlpulse

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rlpulse"
CARD_FOLDERS = ("schemas", "producers", "rules", "streams")

# Each part and the parts it may import (besides itself). The order is the layering.
ALLOWED: dict[str, set[str]] = {
    "exceptions": set(),
    "oncelog": set(),
    "settings": {"exceptions"},
    "schemas": {"exceptions", "settings"},
    "rules": {"exceptions", "settings", "schemas"},
    "transport": {"exceptions", "settings", "schemas", "oncelog"},
    "producers": {"exceptions", "settings", "schemas", "oncelog", "transport"},
    "streams": {"exceptions", "settings", "schemas", "oncelog", "transport", "rules", "producers"},
    "ops": {"exceptions", "settings", "schemas", "transport", "rules"},
    "offline": {"exceptions", "settings", "schemas", "rules", "producers", "streams"},
    "local": {"exceptions", "settings", "schemas", "transport", "producers"},
    "cli": {
        "exceptions",
        "settings",
        "schemas",
        "rules",
        "transport",
        "producers",
        "streams",
        "ops",
        "offline",
        "local",
    },
}


def part_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "rlpulse" or len(parts) < 2:
        return None
    return parts[1]


def module_files() -> list[Path]:
    return sorted(path for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts)


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("name", CARD_FOLDERS)
def test_card_folders_are_links_to_the_real_packages(name: str) -> None:
    link = ROOT / name
    assert link.is_symlink(), f"{name}/ must be a link to rlpulse/{name}"
    assert link.resolve() == (PACKAGE / name).resolve()
    assert not (PACKAGE / name).is_symlink()


@pytest.mark.parametrize("name", CARD_FOLDERS)
def test_a_bare_import_from_the_repository_root_fails(name: str) -> None:
    """With the repo root on sys.path (pytest, `python -m` there, IDE roots), no second copy."""
    result = subprocess.run(
        [sys.executable, "-c", f"import {name}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 1
    assert f"import rlpulse.{name}, not {name}" in result.stderr


def test_every_module_loads_under_one_name_and_one_path() -> None:
    for info in pkgutil.walk_packages(rlpulse.__path__, "rlpulse."):
        if info.name == "rlpulse.__main__":
            continue  # runs the command line
        if ".integrations." in info.name and info.name.rsplit(".", 1)[1] in {
            "verl",
            "verl_plugin",
            "verl_trainer",
            "hf",
            "torch_dist",
        }:
            continue  # they import verl/torch/transformers; their tests load them
        importlib.import_module(info.name)
    loaded = {name: module for name, module in sys.modules.items() if name.startswith("rlpulse")}
    assert not [name for name in sys.modules if name.split(".")[0] in CARD_FOLDERS]
    for name, module in loaded.items():
        file = getattr(module, "__file__", None)
        if file is None:
            continue
        path = Path(file)
        assert path == path.resolve(), f"{name} was loaded through a link: {path}"
        assert PACKAGE in path.parents, f"{name} comes from {path}"


def test_parts_import_only_downwards() -> None:
    problems = []
    for path in module_files():
        relative = path.relative_to(ROOT).with_suffix("")
        importer = part_of(".".join(relative.parts))
        if importer is None or importer in {"__init__", "__main__"}:
            continue
        assert importer in ALLOWED, f"{path}: part {importer!r} is not in the layering table"
        for module in imported_modules(path):
            imported = part_of(module)
            if imported is None or imported == importer:
                continue
            if imported not in ALLOWED[importer]:
                problems.append(f"{relative}: rlpulse.{importer} imports {module}")
    assert problems == []


def test_the_layering_table_has_no_cycle() -> None:
    seen: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(part: str) -> None:
        state = seen.get(part)
        assert state != 1, f"cycle through {part}"
        if state == 2:
            return
        seen[part] = 1
        for other in ALLOWED[part]:
            visit(other)
        seen[part] = 2

    for part in ALLOWED:
        visit(part)
