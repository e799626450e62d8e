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
import inspect
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Final, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.models import OptionInfo

from rlpulse.exceptions import RlpulseError
from rlpulse.settings import Settings, explain, load_settings

__all__ = [
    "LOCAL_CONTROL_SKIPS",
    "Bootstrap",
    "ConfigFile",
    "Prefix",
    "StartupTimeoutAlias",
    "alias",
    "command_options",
    "command_settings",
    "default_note",
    "err",
    "fail",
    "in_force",
    "one_line_errors",
    "out",
    "say",
    "setting_option",
    "settings",
    "state_dir_option",
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


class SettingOption(OptionInfo):
    """A typer option that stands for a setting: :func:`setting_option` makes them."""

    setting: str
    """The setting's dotted name (``worker.grace_s``)."""


def setting_option(
    dotted: str,
    *param_decls: str,
    shown: Callable[[Settings], object] | None = None,
    unset: str = "unset",
    note: str = "",
    **kwargs: Any,
) -> SettingOption:
    """A ``typer.Option`` standing for setting ``dotted``.

    Its help is the setting's own description (one text for the flag, ``rlpulse config
    show`` and the docs), then ``note`` (how the flag is written: units, repeating), then
    :func:`in_force`.
    """
    text = " ".join(part for part in (setting_description(dotted), note) if part)
    made = typer.Option(
        *param_decls, help=f"{text} {in_force(dotted, shown, unset)}", show_default=False, **kwargs
    )
    option = SettingOption.__new__(SettingOption)
    option.__dict__.update(vars(made))
    option.setting = dotted
    return option


def setting_description(dotted: str) -> str:
    """The description of setting ``dotted`` (``worker.grace_s``) in :class:`Settings`."""
    model: Any = Settings
    *sections, name = dotted.split(".")
    for section in sections:
        model = model.model_fields[section].annotation
    return str(model.model_fields[name].description or "")


def default_note(text: str) -> str:
    """``[default: text]`` for a help text, where the default is not a setting's value."""
    return escape(f"[default: {text}]")


class AliasOption(OptionInfo):
    """A hidden option that keeps a renamed flag's old spelling: :func:`alias` makes them."""

    of: str
    """The parameter (a :class:`SettingOption`) it is the old spelling of."""


def alias(old: str, of: str) -> AliasOption:
    """A hidden ``typer.Option`` that keeps the spelling ``old`` of parameter ``of`` working."""
    made = typer.Option(old, hidden=True, show_default=False)
    option = AliasOption.__new__(AliasOption)
    option.__dict__.update(vars(made))
    option.of = of
    return option


def command_settings(
    command: Callable[..., Any],
    values: Mapping[str, Any],
    *,
    without: frozenset[str] = frozenset(),
) -> Settings:
    """The settings for ``command`` called with ``values`` (its ``locals()``).

    Each of its parameters made by :func:`setting_option` sets its setting (``None``: not
    given; then an :func:`alias` of it may); its ``config`` parameter names the file.
    """
    options = command_options(command)
    flags = {
        option.setting: values.get(name)
        for name, option in options.items()
        if isinstance(option, SettingOption)
    }
    for name, option in options.items():
        if isinstance(option, AliasOption) and values.get(name) is not None:
            target = options[option.of]
            assert isinstance(target, SettingOption)
            if flags.get(target.setting) is None:
                flags[target.setting] = values[name]
    return settings(values.get("config"), flags, without=without)


@functools.cache
def command_options(command: Callable[..., Any]) -> dict[str, SettingOption | AliasOption]:
    """``command``'s parameters that stand for settings (or old spellings of them), by name."""
    hints = typing.get_type_hints(inspect.unwrap(command), include_extras=True)
    return {
        name: extra
        for name, hint in hints.items()
        for extra in getattr(hint, "__metadata__", ())
        if isinstance(extra, SettingOption | AliasOption)
    }


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
        shown=_bootstrap_in_use,
    ),
]
Prefix = Annotated[str | None, setting_option("prefix")]
StartupTimeoutAlias = Annotated[float | None, alias("--startup-timeout", of="startup_timeout_s")]
"""``--startup-timeout``, the old spelling of ``--startup-timeout-s``."""

LOCAL_CONTROL_SKIPS: Final = frozenset({"security"})
"""What the commands that control a local process (``rlpulse broker``, ``rlpulse search``) do
not read: the broker's Kafka clients use its own admin credentials
(:meth:`~rlpulse.local.broker.LocalBroker.client_settings`), the search node has none."""


def state_dir_option(holder: str, subdir: str) -> OptionInfo:
    """The ``--state-dir`` option of a local process: where ``holder`` keeps its state.

    Its default, shown in the help, is the directory ``subdir`` of the ``home`` setting.
    """
    option: OptionInfo = typer.Option(
        help=f"Where {holder} keeps its state. "
        + in_force("home", shown=lambda chosen: chosen.home / subdir)
    )
    return option


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
