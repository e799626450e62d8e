"""Every program the tests look up or run comes from the README's set-up line (or the base system).

The suite fails a missing binary with the command that installs it, never skips; so a program a
test needs that the README's ``apt-get install`` line leaves out makes CI on a fresh machine
red. This test reads the tests' source (the ``ast`` of every file under ``tests/``, and the
local services' lookups in ``rlpulse/local/``) for

- the argument of every ``shutil.which``, and of every helper that passes its parameter to
  ``shutil.which`` (``binary("prometheus")``, ``run("promtool", ...)``);
- the program of every argv list handed to ``subprocess`` or built as a command (``["bash",
  "-c", ...]``, ``[*AS_A_HOST, ...]``, ``command = ["runuser", ...]``);
- every package an ``apt-get install ...`` message names,

and fails on a program :data:`PROVIDERS` does not place, or on a Debian package that the README's
line does not install.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.unit.test_readme import ROOT, setup_section

BASE = "base"
"""On every Debian machine before anything is installed (essential and required packages)."""

PYTHON = "python"
"""The interpreter running the suite, or a console script the ``dev`` extra installs."""

CLONE = "clone"
"""Wherever the repository was cloned (the suite reads its history: an older release)."""

PROVIDERS: dict[str, str] = {
    # Debian packages the README's line installs (tests/README.md says which test uses each).
    "java": "openjdk-17-jdk-headless",
    "javac": "openjdk-17-jdk-headless",
    "mvn": "maven",
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "prometheus-alertmanager": "prometheus-alertmanager",
    "amtool": "prometheus-alertmanager",
    "docker-compose": "docker-compose",
    "chromium": "chromium",
    "faketime": "faketime",
    "systemd-analyze": "systemd",
    # The base system: coreutils, util-linux, bash, dash.
    "bash": BASE,
    "sh": BASE,
    "env": BASE,
    "mount": BASE,
    "runuser": BASE,
    "unshare": BASE,
    "python": PYTHON,
    "git": CLONE,
}
"""Where each program a test looks up or runs comes from."""

SUBPROCESS_CALLS = {"run", "Popen", "check_call", "check_output", "call", "create_subprocess_exec"}
COMMAND_NAMES = {"command", "argv", "cmd"}
PROGRAM = re.compile(r"^/?[\w.+-]+(?:/[\w.+-]+)*$")
APT_INSTALL = re.compile(r"apt-get install((?:\s+-[-\w]+)*)((?:\s+[a-z0-9][a-z0-9.+-]+)+)")


@dataclass(frozen=True)
class Use:
    """One program or package a source file names, and where."""

    name: str
    where: str


def readme_packages() -> set[str]:
    """The packages of the README's one ``apt-get install`` line."""
    (line,) = re.findall(r"`(apt-get [^`]+)`", setup_section())
    (install,) = APT_INSTALL.findall(line)
    return set(install[1].split())


def sources() -> Iterator[Path]:
    """The tests' Python files, and the modules that find the local services' programs."""
    yield from sorted((ROOT / "tests").rglob("*.py"))
    yield from sorted((ROOT / "rlpulse" / "local").glob("*.py"))


def _text(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _program(text: str | None) -> str | None:
    if text is None or text.startswith("-") or not PROGRAM.match(text):
        return None
    return os.path.basename(text)


def _looks_like_argv(node: ast.expr | None) -> bool:
    """A returned list is taken for a command line when it starts as one: a path, or a flag."""
    if not isinstance(node, ast.List | ast.Tuple) or len(node.elts) < 2:
        return False
    first, second = _text(node.elts[0]), _text(node.elts[1])
    return (first or "").startswith("/") or (second or "").startswith("-")


def _command_line(node: ast.AST) -> ast.expr | None:
    """The list a ``return`` or a ``command = ...`` builds as a command line, if it is one."""
    if isinstance(node, ast.Return) and _looks_like_argv(node.value):
        return node.value
    if isinstance(node, ast.Assign) and any(
        isinstance(target, ast.Name) and target.id in COMMAND_NAMES for target in node.targets
    ):
        return node.value
    return None


def _called(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def _is_which(node: ast.Call) -> bool:
    func = node.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "which"
        and isinstance(func.value, ast.Name)
        and func.value.id == "shutil"
    )


class SourceFile:
    """One file's lookups, argv lists, apt-get messages and helpers wrapping ``shutil.which``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path.relative_to(ROOT))
        self.tree = ast.parse(path.read_text(), filename=self.name)
        self.constants = self._module_sequences()
        self.wrappers = self._which_wrappers()

    def _where(self, node: ast.AST) -> str:
        return f"{self.name}:{getattr(node, 'lineno', 0)}"

    def _module_sequences(self) -> dict[str, ast.List | ast.Tuple]:
        found: dict[str, ast.List | ast.Tuple] = {}
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.List | ast.Tuple):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = node.value
        return found

    def _which_wrappers(self) -> dict[str, slice]:
        """Functions passing a parameter to ``shutil.which``: name -> the arguments it takes."""
        wrappers: dict[str, slice] = {}
        for function in ast.walk(self.tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            names = [a.arg for a in function.args.args]
            varargs = function.args.vararg.arg if function.args.vararg else None
            looked_up = {
                inner.args[0].id
                for inner in ast.walk(function)
                if isinstance(inner, ast.Call)
                and _is_which(inner)
                and inner.args
                and isinstance(inner.args[0], ast.Name)
            }
            for index, name in enumerate(names):
                if name in looked_up:
                    wrappers[function.name] = slice(index, index + 1)
            if varargs is not None and any(
                isinstance(node, ast.For)
                and isinstance(node.iter, ast.Name)
                and node.iter.id == varargs
                and isinstance(node.target, ast.Name)
                and node.target.id in looked_up
                for node in ast.walk(function)
            ):
                wrappers[function.name] = slice(len(names), None)
        return wrappers

    def _argv_program(self, argv: ast.expr) -> str | None:
        if not isinstance(argv, ast.List | ast.Tuple) or not argv.elts:
            return None
        first = argv.elts[0]
        if isinstance(first, ast.Starred) and isinstance(first.value, ast.Name):
            spliced = self.constants.get(first.value.id)
            return self._argv_program(spliced) if spliced is not None else None
        return _program(_text(first))

    def programs(self, wrappers: dict[str, slice]) -> Iterator[Use]:
        """Programs this file looks up or runs; ``wrappers`` adds helpers it imports."""
        known = {**wrappers, **self.wrappers}
        for node in ast.walk(self.tree):
            for text in self._named(node, known):
                if program := _program(text):
                    yield Use(program, self._where(node))

    def _named(self, node: ast.AST, known: dict[str, slice]) -> Iterator[str | None]:
        """What ``node`` looks up or runs, as it is written (a name, a path, or nothing)."""
        if isinstance(node, ast.Call):
            name = _called(node)
            if _is_which(node) and node.args:
                yield _text(node.args[0])
            if name in SUBPROCESS_CALLS and node.args:
                yield self._argv_program(node.args[0])
            if isinstance(node.func, ast.Name) and name in known:
                yield from map(_text, node.args[known[name]])
        elif (argv := _command_line(node)) is not None:
            yield self._argv_program(argv)

    def apt_packages(self) -> Iterator[Use]:
        """The packages each ``apt-get install`` in this file's strings names."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for _flags, packages in APT_INSTALL.findall(node.value):
                    for package in packages.split():
                        yield Use(package, self._where(node))


def scanned() -> list[SourceFile]:
    return [SourceFile(path) for path in sources()]


def imported_wrappers(files: list[SourceFile], file: SourceFile) -> dict[str, slice]:
    """The ``shutil.which`` helpers ``file`` imports by name from another scanned file."""
    by_module = {f.name.removesuffix(".py").replace("/", "."): f.wrappers for f in files}
    found: dict[str, slice] = {}
    for node in ast.walk(file.tree):
        if isinstance(node, ast.ImportFrom) and node.module in by_module:
            for alias in node.names:
                if alias.name in by_module[node.module]:
                    found[alias.asname or alias.name] = by_module[node.module][alias.name]
    return found


def test_every_program_the_tests_need_is_placed_and_installed_by_the_readme() -> None:
    files = scanned()
    uses = [use for f in files for use in f.programs(imported_wrappers(files, f))]
    found = {use.name for use in uses}
    # The scan sees what the suite is known to need; a scan that finds less is broken.
    assert {"faketime", "prometheus", "promtool", "chromium", "mvn", "bash"} <= found, found
    unplaced = sorted(f"{use.where}: {use.name}" for use in uses if use.name not in PROVIDERS)
    assert not unplaced, (
        "the tests run programs that PROVIDERS does not place (a Debian package of the "
        f"README's line, the base system or Python): {unplaced}"
    )
    packages = readme_packages()
    missing = sorted(
        f"{use.where}: {use.name} (Debian package {PROVIDERS[use.name]})"
        for use in uses
        if PROVIDERS[use.name] not in (BASE, PYTHON, CLONE) and PROVIDERS[use.name] not in packages
    )
    assert not missing, f"the README's apt-get line does not install: {missing}"


def test_every_package_a_message_names_is_in_the_readme_line() -> None:
    packages = readme_packages()
    uses = [use for f in scanned() if f.name.startswith("tests/") for use in f.apt_packages()]
    assert {use.name for use in uses} >= {"faketime", "chromium", "maven"}
    missing = sorted(f"{use.where}: {use.name}" for use in uses if use.name not in packages)
    assert not missing, (
        f"messages tell a user to install what the README's line leaves out: {missing}"
    )


def test_the_base_system_s_programs_are_here() -> None:
    """What :data:`PROVIDERS` calls the base system (or the clone's) is on PATH."""
    absent = [
        name for name, source in PROVIDERS.items() if source == BASE and not shutil.which(name)
    ]
    assert not absent
