"""What every ``rlpulse`` command shares: consoles, option types, settings, one-line errors.

Options that stand for a setting default to ``None`` ("not given") and are passed to
:func:`settings` under their dotted name, so an unset flag falls back to the environment,
the config file and the default (:mod:`rlpulse.settings`). Errors rlpulse raises on purpose
(:class:`~rlpulse.exceptions.RlpulseError`) end a command with one line and status 1,
never a traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from rlpulse.exceptions import RlpulseError
from rlpulse.settings import Settings, load_settings

__all__ = [
    "Bootstrap",
    "ConfigFile",
    "LogLevel",
    "Prefix",
    "StartupTimeout",
    "err",
    "fail",
    "one_line_errors",
    "out",
    "say",
    "settings",
]

P = ParamSpec("P")
R = TypeVar("R")

err = Console(stderr=True)
out = Console()

ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="A YAML settings file (default: $RLPULSE_CONFIG); flags and RLPULSE_* win over it.",
        dir_okay=False,
    ),
]
Bootstrap = Annotated[
    str | None,
    typer.Option(
        help="Kafka bootstrap servers (default: $RLPULSE_BOOTSTRAP, else the local broker)."
    ),
]
Prefix = Annotated[str | None, typer.Option(help="Topic prefix (default: rlpulse).")]
StartupTimeout = Annotated[
    float | None,
    typer.Option(help="Seconds start-up waits for Kafka to be ready (default: 120)."),
]
LogLevel = Annotated[
    str | None, typer.Option(help="debug, info, warning or error (default: warning).")
]


def say(message: str) -> None:
    """A progress line on stderr, dimmed."""
    err.print(f"[dim]{message}[/]", highlight=False)


def fail(message: str) -> typer.Exit:
    """Print ``error: message`` on stderr; return the exit to raise (status 1).

    ``message`` is text, not markup: ``[rule-id]`` and ``[x]`` are printed as they are.
    """
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(1)


def settings(
    config_file: Path | None,
    flags: Mapping[str, Any] | None = None,
    *,
    without: frozenset[str] = frozenset(),
) -> Settings:
    """The settings for a command: ``flags`` (dotted names, ``None`` = not given) over the rest.

    ``without``: top-level settings the command does not use, left at their defaults.
    """
    try:
        return load_settings(flags, config_file, without=without)
    except RlpulseError as exc:
        raise fail(str(exc)) from None


def one_line_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Turn an :class:`RlpulseError` escaping ``command`` into one line and exit status 1."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except RlpulseError as exc:
            raise fail(str(exc)) from None

    return run
