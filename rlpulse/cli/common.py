"""What every ``rlpulse`` command shares: consoles, option types, settings, one-line errors.

Options that stand for a setting default to ``None`` ("not given") and are passed to
:func:`settings` under their dotted name, so an unset flag falls back to the environment,
the config file and the default (:mod:`rlpulse.settings`). Their help ends with the value in
force when the command line is loaded -- ``[default: 12.0, from env RLPULSE_WORKER__GRACE_S]``
-- from the environment and ``$RLPULSE_CONFIG`` (:func:`setting_option`); every help writes
its default as ``[default: ...]``. Errors rlpulse raises on purpose
(:class:`~rlpulse.exceptions.RlpulseError`) end a command with one line and status 1,
never a traceback.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Final, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from rlpulse.exceptions import RlpulseError
from rlpulse.settings import Settings, explain, load_settings

__all__ = [
    "LOG_LEVEL_HELP",
    "STARTUP_HELP",
    "Bootstrap",
    "ConfigFile",
    "Prefix",
    "StartupTimeoutAlias",
    "alias",
    "default_note",
    "either",
    "err",
    "fail",
    "in_force",
    "one_line_errors",
    "out",
    "say",
    "setting_option",
    "settings",
]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

err = Console(stderr=True)
out = Console()


@functools.cache
def _in_force() -> tuple[Settings, dict[str, str]]:
    """The settings the environment and $RLPULSE_CONFIG make, and their sources (for help).

    Settings that cannot be loaded leave the help with the declared defaults; the command
    itself then reports what is wrong.
    """
    try:
        return load_settings(), explain(validate=False)
    except RlpulseError:
        return Settings.model_construct(), {}


def in_force(
    dotted: str, shown: Callable[[Settings], object] | None = None, unset: str = "unset"
) -> str:
    """``[default: VALUE]`` for a help text: the value of setting ``dotted`` in force now.

    ``shown`` derives the value instead (``bootstrap`` -> the address clients use); ``unset``
    stands for ``None``. A value that is not the declared default names its source.
    """
    chosen, origins = _in_force()
    value = (
        shown(chosen) if shown is not None else functools.reduce(getattr, dotted.split("."), chosen)
    )
    if value is None or value == []:
        text = unset
    elif isinstance(value, list | tuple):
        text = ", ".join(map(str, value))
    else:
        text = str(value)
    origin = origins.get(dotted, "default")
    note = "" if origin == "default" else f", from {origin}"
    return escape(f"[default: {text}{note}]")


def setting_option(
    dotted: str,
    text: str,
    *param_decls: str,
    shown: Callable[[Settings], object] | None = None,
    unset: str = "unset",
    **kwargs: Any,
) -> Any:
    """A ``typer.Option`` standing for setting ``dotted``: help ``text``, then :func:`in_force`."""
    shown_text = f"{text} {in_force(dotted, shown, unset)}"
    return typer.Option(*param_decls, help=shown_text, show_default=False, **kwargs)


def default_note(text: str) -> str:
    """``[default: text]`` for a help text, where the default is not a setting's value."""
    return escape(f"[default: {text}]")


def alias(old: str) -> Any:
    """A hidden ``typer.Option`` that keeps the spelling ``old`` of a renamed flag working."""
    return typer.Option(old, hidden=True, show_default=False)


def either(value: T | None, old_spelling: T | None) -> T | None:
    """A flag's value under its name, else under its old spelling (see :func:`alias`)."""
    return value if value is not None else old_spelling


def _bootstrap_in_use(chosen: Settings) -> str:
    from rlpulse.transport.bootstrap import bootstrap_servers

    return bootstrap_servers(chosen)


ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="A YAML settings file; flags and RLPULSE_* win over it. "
        + default_note("$RLPULSE_CONFIG"),
        dir_okay=False,
    ),
]
Bootstrap = Annotated[
    str | None,
    setting_option(
        "bootstrap",
        "Kafka bootstrap servers; unset: the local broker, else port broker.port on 127.0.0.1.",
        shown=_bootstrap_in_use,
    ),
]
Prefix = Annotated[str | None, setting_option("prefix", "Topic prefix.")]
STARTUP_HELP: Final = "Seconds start-up waits for Kafka to be ready."
LOG_LEVEL_HELP: Final = "debug, info, warning or error."
StartupTimeoutAlias = Annotated[float | None, alias("--startup-timeout")]
"""``--startup-timeout``, the old spelling of ``--startup-timeout-s``."""


def say(message: str) -> None:
    """A progress line on stderr, dimmed (one line, however long: a pipe has no width)."""
    err.print(f"[dim]{escape(message)}[/]", highlight=False, soft_wrap=True)


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
