"""Each setting has one help text: a CLI option that stands for a setting shows the
setting's own description, the one ``rlpulse config show`` and the docs use."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import pytest
import typer
import typer.main

from rlpulse.cli import app
from rlpulse.cli.common import (
    SettingOption,
    command_options,
    command_settings,
    setting_description,
    setting_option,
)


def commands(group: typer.Typer, path: tuple[str, ...] = ()) -> Iterator[tuple[str, object]]:
    """(command path, callback) of every command of ``group`` and its sub-groups."""
    for command in group.registered_commands:
        assert command.callback is not None
        name = command.name or command.callback.__name__.replace("_", "-")
        yield " ".join(("rlpulse", *path, name)), command.callback
    for sub in group.registered_groups:
        assert sub.typer_instance is not None and sub.name is not None
        yield from commands(sub.typer_instance, (*path, sub.name))


def click_command(group: typer.Typer, path: str) -> Any:
    """The command (typer's click) that ``PATH`` names in ``group``."""
    command: Any = typer.main.get_command(group)
    for part in path.split()[1:] if isinstance(command, typer.core.TyperGroup) else []:
        command = command.commands[part]
    return command


def disagreements(group: typer.Typer) -> tuple[int, list[str]]:
    """How many setting options ``group`` has, and each whose help is not its setting's."""
    checked, found = 0, []
    for path, callback in commands(group):
        params = {p.name: p for p in click_command(group, path).params}
        for name, option in command_options(callback).items():
            if not isinstance(option, SettingOption):
                continue  # an old spelling: hidden
            dotted = option.setting
            description = setting_description(dotted)
            shown = params[name].help or ""
            if not description or not shown.startswith(description):
                found.append(
                    f"{path} {name}: help {shown!r} does not begin with the description of "
                    f"{dotted}: {description!r}"
                )
            checked += 1
    return checked, found


def test_every_setting_option_shows_its_settings_description() -> None:
    checked, found = disagreements(app)
    assert found == []
    assert checked >= 40  # the worker's, exporter's, archiver's ... options were found


def test_a_help_of_its_own_is_caught() -> None:
    drifted = typer.Typer()
    option = setting_option("exporter.port")
    option.help = "Port of the metrics page."  # written again by hand, and drifted

    def serve(port: int | None = None) -> None:
        """A command whose option was given a help text of its own."""

    serve.__annotations__["port"] = Annotated[int | None, option]  # not a postponed string
    drifted.command()(serve)

    assert disagreements(drifted) == (
        1,
        ["rlpulse serve port: help 'Port of the metrics page.' does not begin with the "
         "description of exporter.port: 'Port of /metrics.'"],
    )  # fmt: skip


def test_a_flag_and_its_old_spelling_set_the_setting_and_the_new_one_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlpulse.cli.worker import worker

    monkeypatch.delenv("RLPULSE_CONFIG", raising=False)
    monkeypatch.delenv("RLPULSE_WORKER__GRACE_S", raising=False)
    old = command_settings(worker, {"grace": 5.0, "startup_timeout": 9.0, "config": None})
    assert (old.worker.grace_s, old.worker.startup_timeout_s) == (5.0, 9.0)
    both = command_settings(worker, {"grace_s": 0.5, "grace": 5.0, "config": None})
    assert both.worker.grace_s == 0.5
