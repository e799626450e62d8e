"""Run a command as an ordinary user with nothing but Python: a home and a PATH of its own.

As root (CI), the command runs as ``nobody`` in a private mount namespace, where the
directories that keep this interpreter from other users (``/root``, mode 0700, holds a
pyenv Python) are replaced by a world-readable tmpfs with only the interpreter's own
directories bound back in; nothing outside the namespace changes. As anyone else, the
command runs as that user, who is already not root. Either way its environment is exactly
the one given, and PATH names one directory holding only a ``python`` that starts this
interpreter (and its virtualenv, if any).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
USER = "nobody"


@dataclass(frozen=True)
class OrdinaryUser:
    """Where the user's files are: ``base`` (ours), ``home`` and ``repo`` (the user's)."""

    base: Path
    home: Path
    repo: Path
    bin_dir: Path

    def environment(self, **extra: str) -> dict[str, str]:
        """The whole environment of a command: HOME, PATH, PYTHONPATH, a fresh RLPULSE_HOME."""
        return {
            "HOME": str(self.home),
            "PATH": str(self.bin_dir),
            "PYTHONPATH": str(self.repo),
            "RLPULSE_HOME": str(self.home / ".cache" / "rlpulse"),
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "COLUMNS": "200",
            **extra,
        }

    def run(
        self, *argv: str, env: Mapping[str, str], timeout_s: float = 600.0
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as the user with exactly ``env``, in the user's home."""
        return subprocess.run(
            _as_user(list(argv), env, self.base),
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )


@contextlib.contextmanager
def ordinary_user() -> Iterator[OrdinaryUser]:
    """A fresh home, a copy of the repository and a PATH of only ``python``; cleaned up after.

    Processes the user left behind (an agent waiting out its idle time) are killed at the end.
    """
    base = Path(tempfile.mkdtemp(prefix="rlpulse-user-", dir="/tmp"))
    base.chmod(0o755)
    home = base / "home"
    repo = home / "rlpulse"
    shutil.copytree(
        ROOT / "rlpulse", repo / "rlpulse", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, repo / name)
    bin_dir = base / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    if os.geteuid() == 0:
        account = pwd.getpwnam(USER)
        for path in (home, *home.rglob("*")):
            os.chown(path, account.pw_uid, account.pw_gid, follow_symlinks=False)
    try:
        yield OrdinaryUser(base, home, repo, bin_dir)
    finally:
        _kill_left_behind(home)
        shutil.rmtree(base, ignore_errors=True)


def _as_user(argv: list[str], env: Mapping[str, str], base: Path) -> list[str]:
    assignments = [f"{key}={value}" for key, value in env.items()]
    if os.geteuid() != 0:
        return ["env", "-i", *assignments, *argv]
    lines = ["set -e"]
    for number, (hidden, inside) in enumerate(sorted(_hidden_directories().items())):
        stash = base / f"stash-{number}"
        stash.mkdir(exist_ok=True)
        lines += [
            f"mount --bind {shlex.quote(str(hidden))} {shlex.quote(str(stash))}",
            f"mount -t tmpfs -o mode=755 tmpfs {shlex.quote(str(hidden))}",
        ]
        for path in inside:
            relative = path.relative_to(hidden)
            lines += [
                f"mkdir -p {shlex.quote(str(path))}",
                f"mount --bind {shlex.quote(str(stash / relative))} {shlex.quote(str(path))}",
            ]
    command = ["runuser", "-u", USER, "--", "/usr/bin/env", "-i", *assignments, *argv]
    lines.append("exec " + shlex.join(command))
    script = "\n".join(lines)
    return ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script]


def _hidden_directories() -> dict[Path, list[Path]]:
    """The topmost directory others cannot enter above each of the interpreter's directories.

    Each maps to the interpreter's directories under it (the prefixes and site-packages).
    """
    wanted = {Path(sys.base_prefix), Path(sys.prefix), *map(Path, site.getsitepackages())}
    resolved = sorted({path.resolve() for path in wanted if path.exists()})
    kept = [p for p in resolved if not any(o != p and o in p.parents for o in resolved)]
    hidden: dict[Path, list[Path]] = {}
    for path in kept:
        for ancestor in reversed(path.parents):
            if ancestor != Path("/") and not ancestor.stat().st_mode & 0o001:
                hidden.setdefault(ancestor, []).append(path)
                break
    return hidden


def _kill_left_behind(home: Path) -> None:
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("HOME") == str(home):
                process.kill()
