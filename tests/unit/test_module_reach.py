"""Every module the wheel ships is reached from an entry point or the public API.

The roots are the console script and plugin entry points in pyproject.toml, ``python -m
rlpulse``, the public API (``rlpulse.producers``, and each module of its integrations, which
users import by name: docs/integrations.md), and the modules the package itself names as text
(``python -m rlpulse.local.worker_process`` for a child process, a module handed to
importlib). From them the walk follows every import (also those inside functions: the
command line imports lazily) and fails on a packaged module that nothing reaches: code that
ships but that only tests use, or that nothing uses at all, belongs in ``tests/`` or nowhere.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rlpulse"
MODULE_NAME = re.compile(r"^rlpulse(\.[a-z_][a-z0-9_]*)+$")


def packaged_modules() -> dict[str, Path]:
    """Each module of the package, by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def roots(modules: dict[str, Path]) -> set[str]:
    """The entry points, the public API and the modules the package names as text."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    named = {target.split(":")[0] for target in project.get("scripts", {}).values()}
    for group in project.get("entry-points", {}).values():
        named |= {target.split(":")[0] for target in group.values()}
    named |= {"rlpulse.__main__", "rlpulse.producers"}
    named |= {name for name in modules if name.startswith("rlpulse.producers.integrations")}
    for path in modules.values():
        for node in ast.walk(ast.parse(path.read_text())):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and MODULE_NAME.match(text) and text in modules:
                named.add(text)
    return named


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            for end in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b too
                prefix = ".".join(parts[:end])
                if prefix in modules:
                    found.add(prefix)
    return found


def unreached(modules: dict[str, Path]) -> list[str]:
    """The modules of ``modules`` that nothing reaches from the roots."""
    seen: set[str] = set()
    todo = sorted(roots(modules))
    while todo:
        name = todo.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        todo += sorted(imports_of(name, modules[name], modules) - seen)
    return sorted(set(modules) - seen)


def test_every_packaged_module_is_reached_from_an_entry_point_or_the_public_api() -> None:
    assert unreached(packaged_modules()) == []


def test_a_module_only_tests_import_is_found(tmp_path: Path) -> None:
    harness = tmp_path / "harness.py"
    harness.write_text("from rlpulse.settings import Settings\n")
    modules = {**packaged_modules(), "rlpulse.local.harness": harness}
    assert unreached(modules) == ["rlpulse.local.harness"]
