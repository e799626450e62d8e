"""``rlpulse rules ...``: work with rules files from the shell.

Each command is a thin wrapper: it parses its arguments and hands them to a function that
does the work and returns the exit code.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Final

import typer

from rlpulse.rules.exceptions import RulesFileError
from rlpulse.rules.loader import load_rules

rules_app = typer.Typer(no_args_is_help=True)

RULES_SUFFIXES: Final = (".yaml", ".yml")
"""The files a directory argument stands for."""


@rules_app.callback()
def rules() -> None:
    """Work with rules files."""  # a callback makes this a group even with one command


@rules_app.command("check")
def check(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Rules files, or directories (their *.yaml and *.yml files).",
            metavar="PATH...",
            show_default=False,
        ),
    ],
) -> None:
    """Validate rules files and report every problem, each with its file, line and column.

    Problems go to stderr, 'ok: FILE (N rules)' to stdout. Exits 1 if any file is bad.
    """
    raise typer.Exit(check_rules_files(paths))


@rules_app.command("publish")
def publish(
    path: Annotated[Path, typer.Argument(help="The rules file.", exists=True, dir_okay=False)],
    bootstrap: Annotated[
        str | None, typer.Option(help="Kafka bootstrap servers (default: as `rlpulse worker`).")
    ] = None,
    prefix: Annotated[str, typer.Option(help="Topic prefix.")] = "rlpulse",
) -> None:
    """Validate a rules file and publish it to every worker through the rules topic.

    A file with problems is refused (exit 1) and nothing is published.
    """
    raise typer.Exit(publish_rules_file(path, bootstrap, prefix))


def publish_rules_file(path: Path, bootstrap: str | None, prefix: str) -> int:
    """Publish ``path`` to the rules topic; print the outcome; return the exit code."""
    from rlpulse.config import resolve_bootstrap
    from rlpulse.producers.config import ProducerConfig
    from rlpulse.rules_publish import publish_rules

    config = ProducerConfig(bootstrap_servers=resolve_bootstrap(bootstrap), topic_prefix=prefix)
    try:
        ruleset = publish_rules(path, config)
    except RulesFileError as exc:
        for problem in exc.problems:
            typer.echo(str(problem), err=True)
        typer.echo(f"not published: {path} has problems", err=True)
        return 1
    except TimeoutError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 1
    typer.echo(f"published {path} ({len(ruleset.rules)} rules) to {config.topics.rules}")
    return 0


def check_rules_files(paths: Sequence[Path]) -> int:
    """Validate every rules file named by ``paths``; print the outcome; return the exit code.

    Plain lines, never wrapped, so that editors and ``grep`` can use them.
    """
    failed = False
    for path, trouble in _expand(paths):
        if trouble is not None:
            typer.echo(f"{path}: {trouble}", err=True)
            failed = True
            continue
        try:
            ruleset = load_rules(path)
        except RulesFileError as exc:
            for problem in exc.problems:
                typer.echo(str(problem), err=True)
            failed = True
        except OSError as exc:
            typer.echo(f"{path}: cannot read: {exc.strerror or exc}", err=True)
            failed = True
        else:
            count = len(ruleset.rules)
            typer.echo(f"ok: {path} ({count} rule{'' if count == 1 else 's'})")
    return 1 if failed else 0


def _expand(paths: Iterable[Path]) -> Iterator[tuple[Path, str | None]]:
    """Yield each file to check, with why it cannot be checked (``None`` if it can)."""
    for path in paths:
        if not path.is_dir():
            yield path, None if path.exists() else "no such file or directory"
            continue
        files = sorted(
            entry
            for entry in path.iterdir()
            if entry.suffix in RULES_SUFFIXES and not entry.is_dir()
        )
        if not files:
            yield path, f"no rules files ({', '.join('*' + s for s in RULES_SUFFIXES)}) in it"
        yield from ((file, None) for file in files)
