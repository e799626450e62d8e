"""The layout of docs/design.md holds: one name per module, and layers that import downwards.

The layers are docs/design.md's table, read from the file: the doc is the contract.

The card's top-level folders (schemas/, producers/, rules/, streams/) are links to the real
packages under rlpulse/; importing them under their bare names must fail instead of loading
a second copy of the same files. The parts of rlpulse import each other only downwards, with
no cycle; so do the rooms of rlpulse.producers, by the doc's second table.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rlpulse
import rlpulse.exceptions

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rlpulse"
CARD_FOLDERS = ("schemas", "producers", "rules", "streams")

DESIGN = ROOT / "docs" / "design.md"


def layering_table(package: str = "rlpulse") -> dict[str, set[str]]:
    """Each part of ``package`` and the parts it may import (besides itself): docs/design.md's.

    A row names its part as `<package>.<part>`; the parts of rlpulse and the rooms of
    rlpulse.producers are two tables of the same shape.
    """
    table: dict[str, set[str]] = {}
    for line in DESIGN.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith(f"`{package}."):
            continue
        part = cells[0].strip("`").removeprefix(f"{package}.")
        if "." in part:
            continue  # a row of a deeper table
        table[part] = {name.strip() for name in cells[2].split(",")} - {"—", ""}
    return table


ALLOWED = layering_table()
PRODUCERS = PACKAGE / "producers"
ROOMS = layering_table("rlpulse.producers")


def part_of(module: str, package: str = "rlpulse") -> str | None:
    """The part of ``package`` that ``module`` belongs to (None: outside, or the package)."""
    prefix, parts = package.split("."), module.split(".")
    if parts[: len(prefix)] != prefix or len(parts) <= len(prefix):
        return None
    return parts[len(prefix)]


def module_files(root: Path = PACKAGE) -> list[Path]:
    return sorted(path for path in root.rglob("*.py") if "__pycache__" not in path.parts)


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


def import_problems(package: str, table: dict[str, set[str]]) -> list[str]:
    """Each import by a module of ``package`` of a part of it that its part's row does not name."""
    problems = []
    for path in module_files(ROOT.joinpath(*package.split("."))):
        relative = path.relative_to(ROOT).with_suffix("")
        importer = part_of(".".join(relative.parts), package)
        if importer is None or importer in {"__init__", "__main__"}:
            continue
        assert importer in table, f"{path}: {importer!r} is not in the table of {package}"
        for module in imported_modules(path):
            imported = part_of(module, package)
            if imported is None or imported == importer:
                continue
            if imported not in table[importer]:
                problems.append(f"{relative}: {package}.{importer} imports {module}")
    return problems


def test_parts_import_only_downwards() -> None:
    assert import_problems("rlpulse", ALLOWED) == []


@pytest.mark.parametrize("table", [ALLOWED, ROOMS], ids=["parts", "producer rooms"])
def test_the_layering_table_has_no_cycle(table: dict[str, set[str]]) -> None:
    seen: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(part: str) -> None:
        state = seen.get(part)
        assert state != 1, f"cycle through {part}"
        if state == 2:
            return
        seen[part] = 1
        for other in table[part]:
            visit(other)
        seen[part] = 2

    for part in table:
        visit(part)


def test_producer_rooms_import_only_the_rooms_their_row_names() -> None:
    assert import_problems("rlpulse.producers", ROOMS) == []
    through_the_face = [  # rlpulse.producers itself imports every room
        path.relative_to(ROOT)
        for path in module_files(PRODUCERS)
        if path != PRODUCERS / "__init__.py" and "rlpulse.producers" in imported_modules(path)
    ]
    assert through_the_face == []


def test_the_rooms_table_names_every_room_and_only_rooms() -> None:
    rooms = {
        path.stem
        for path in PRODUCERS.iterdir()
        if (path.is_dir() and (path / "__init__.py").exists())
        or (path.suffix == ".py" and path.stem != "__init__")
    }
    assert set(ROOMS) == rooms
    for room, allowed in ROOMS.items():
        assert allowed <= set(ROOMS), f"{room} may import an unknown room: {allowed - set(ROOMS)}"


def test_the_linter_sees_every_module_once_under_rlpulse() -> None:
    """ruff does not follow the card folders' links: each file is checked once, in rlpulse/."""
    shown = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--show-files", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    ).stdout.splitlines()
    files = {Path(line.strip()).resolve() for line in shown if line.strip().endswith(".py")}
    for module in module_files():
        assert module.resolve() in files, f"ruff does not check {module}"
    through_links = [
        line for line in shown for name in CARD_FOLDERS if line.startswith(f"{ROOT / name}/")
    ]
    assert through_links == []


def test_the_table_names_every_part_and_only_parts() -> None:
    parts = {path.stem if path.is_file() else path.name for path in PACKAGE.iterdir()}
    parts -= {"__init__", "__main__", "py", "__pycache__"}
    parts = {
        part for part in parts if (PACKAGE / part).is_dir() or (PACKAGE / f"{part}.py").exists()
    }
    assert set(ALLOWED) == parts
    for part, allowed in ALLOWED.items():
        assert allowed <= set(ALLOWED), (
            f"{part} may import an unknown part: {allowed - set(ALLOWED)}"
        )


def test_every_error_the_design_names_exists_and_is_an_rlpulse_error() -> None:
    errors = re.findall(r"`(\w+Error)`", DESIGN.read_text().split("Errors:", 1)[1].split("\n\n")[0])
    assert "StreamsError" in errors
    found = {}
    for module in ("rlpulse.exceptions", *(f"rlpulse.{p}.exceptions" for p in ALLOWED)):
        try:
            loaded = importlib.import_module(module)
        except ModuleNotFoundError:
            continue
        found.update({name: getattr(loaded, name) for name in dir(loaded)})
    for name in [name for name in errors if not hasattr(builtins, name)]:
        assert name in found, f"docs/design.md names {name}, which no exceptions module defines"
        assert issubclass(found[name], rlpulse.exceptions.RlpulseError), name


def test_every_package_opens_with_what_it_holds() -> None:
    for init in sorted(PACKAGE.rglob("__init__.py")):
        docstring = ast.get_docstring(ast.parse(init.read_text()))
        where = init.relative_to(PACKAGE.parent)
        assert docstring is not None and len(docstring.split()) >= 5, (
            f"{where} has no docstring saying what the package holds"
        )
