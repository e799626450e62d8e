"""``rlpulse rules check|backtest|publish``: work with rules files from the shell.

Wherever a rules file is asked for, a preset name (``seed``, ``verl``, ``trl``,
``openrlhf``) works too, unless a file of that name exists.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Annotated, Final

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlpulse.cli.common import (
    Bootstrap,
    ConfigFile,
    Prefix,
    default_note,
    fail,
    one_line_errors,
    settings,
)
from rlpulse.offline.backtest import (
    BacktestResult,
    InputFormat,
    read_acks,
    read_recording,
    run_backtest,
)
from rlpulse.rules.exceptions import PresetNotFoundError, RulesFileError
from rlpulse.rules.loader import list_presets, load_preset, load_rules, load_rules_source
from rlpulse.rules.model import RuleSet, format_number
from rlpulse.schemas.records import Action, ActionVerdict, ControlCommand
from rlpulse.settings import JoinerSettings

rules_app = typer.Typer(no_args_is_help=True)

RULES_SUFFIXES: Final = (".yaml", ".yml")
"""The files a directory argument stands for."""
_JOINER_DEFAULTS: Final = JoinerSettings()


@rules_app.callback()
def rules() -> None:
    """Check, backtest and publish rules files."""  # a callback makes this a group


@rules_app.command("schema")
def schema(
    output: Annotated[
        Path | None,
        typer.Option(help="Write it to this file (else print it)", dir_okay=False),
    ] = None,
    check: Annotated[
        bool, typer.Option("--check", help="Only say whether OUTPUT differs from it (exit 1).")
    ] = False,
) -> None:
    """The JSON Schema of rules files, for editors that complete and explain their keys."""
    from rlpulse.rules import schema as rules_schema

    if check:
        if output is None:
            raise fail("--check needs --output: the file to compare")
        if not output.is_file():
            raise fail(f"{output} does not exist; run `rlpulse rules schema --output {output}`")
        if rules_schema.is_stale(output):
            raise fail(f"{output} is stale; run `rlpulse rules schema --output {output}`")
        return
    if output is None:
        typer.echo(rules_schema.schema_text(), nl=False)
        return
    try:
        output.write_text(rules_schema.schema_text(), encoding="utf-8")
    except OSError as exc:
        raise fail(f"cannot write {output}: {exc.strerror or exc}") from None
    typer.echo(f"wrote {output}")


@rules_app.command("check")
def check(
    paths: Annotated[
        list[Path],
        typer.Argument(
            help="Rules files, directories (their *.yaml and *.yml files) or preset names.",
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
@one_line_errors
def publish(
    source: Annotated[
        str, typer.Argument(help="The rules file, or a preset name.", metavar="PATH")
    ],
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    config: ConfigFile = None,
) -> None:
    """Validate a rules file (or preset) and publish it to every worker through the rules topic.

    A file with problems is refused (exit 1) and nothing is published.
    """
    from rlpulse.ops.rules import publish_rules
    from rlpulse.schemas.topics import Topics

    path = Path(source)
    trouble = "a directory; publish one rules file" if path.is_dir() else _not_found(path)
    if trouble is not None:
        typer.echo(f"{path}: {trouble}", err=True)
        raise typer.Exit(1)
    chosen = settings(config, {"bootstrap": bootstrap, "prefix": prefix})
    try:
        ruleset = publish_rules(source, chosen)
    except RulesFileError as exc:
        raise refuse_rules(exc, f"not published: {path} has problems") from None
    typer.echo(f"published {path} ({len(ruleset.rules)} rules) to {Topics(chosen.prefix).rules}")


@rules_app.command("backtest")
@one_line_errors
def backtest(
    rules_source: Annotated[
        str, typer.Option("--rules", help="A rules file or a preset name.", show_default=False)
    ],
    events: Annotated[
        Path,
        typer.Option(
            "--events",
            help="rlpulse JSON Lines, verl's file-backend JSON Lines, or per-rank files "
            "(trainer_rank0.jsonl, ...): their directory, or one of them.",
            exists=True,
        ),
    ],
    json_output: Annotated[
        bool, typer.Option("--json", help="One ControlCommand (JSON) per line instead of tables.")
    ] = False,
    grace_s: Annotated[
        float, typer.Option("--grace-s", help="Seconds to wait for missing ranks.")
    ] = _JOINER_DEFAULTS.grace_s,
    late_window_s: Annotated[
        float,
        typer.Option("--late-window-s", help="Seconds a closed step accepts late events."),
    ] = _JOINER_DEFAULTS.late_window_s,
    run: Annotated[
        str | None,
        typer.Option(
            help="Play only this run; also the run id of per-rank lines without a run_id, "
            "and of a verl file. " + default_note("the directory's name; the verl file's name")
        ),
    ] = None,
    input_format: Annotated[
        InputFormat, typer.Option("--format", help="Input format.")
    ] = InputFormat.AUTO,
    acks: Annotated[
        Path | None,
        typer.Option(
            "--acks",
            help="The run's CommandAcks (JSON Lines) for the verdicts of rules with expect. "
            + default_note("each command applied at the step after the one it was issued for"),
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            "--until",
            help="The recording's end (ISO 8601 time, or seconds since the epoch): silence "
            "rules watch the runs up to then. " + default_note("its last event"),
        ),
    ] = None,
) -> None:
    """Play recorded events through the worker's step pipeline; print the commands issued.

    Prints a table of commands per run (step, stage, rule, actions, verdict, reason), or with
    --json one ControlCommand per line: the records the worker would have published, ids
    included. Unreadable lines and refused events are reported on stderr with file:line and
    skipped; a recording that yields no event at all is an error (exit 1).
    """
    try:
        joiner = JoinerSettings(grace_s=grace_s, late_window_s=late_window_s)
        until_ns = None if until is None else _time_ns(until)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    try:
        ruleset = load_rules_source(rules_source)
        recording = read_recording(events, run=run, input_format=input_format)
        given = None if acks is None else read_acks(acks)
        result = run_backtest(ruleset, recording, joiner, given, until_ns)
    except (RulesFileError, PresetNotFoundError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(1) from None
    except (OSError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    if result.events == 0:
        typer.echo(f"error: {_nothing_read(events, result)}", err=True)
        raise typer.Exit(1)
    if json_output:
        for command in result.commands:
            typer.echo(json.dumps(command))
    else:
        print_commands(result, Console(highlight=False))
    for problem in (*result.malformed, *result.rejected):
        typer.echo(f"{problem}; skipped", err=True)
    for error in result.rule_errors:
        typer.echo(f"rule engine failed on summary {error}", err=True)
    typer.echo(
        f"{result.events} events, {result.summaries} step summaries, "
        f"{len(result.commands)} commands, {len(result.verdicts)} verdicts; "
        f"{len(result.malformed)} malformed lines skipped, "
        f"{len(result.rejected)} events rejected, {result.duplicates} duplicates dropped",
        err=True,
    )


def refuse_rules(exc: RulesFileError, outcome: str) -> typer.Exit:
    """Print each problem of ``exc`` as ``rules check`` does, then ``outcome``; the exit to raise.

    Plain lines on stderr (no markup: ``[rule-id]`` stays), status 1.
    """
    for problem in exc.problems:
        typer.echo(str(problem), err=True)
    typer.echo(outcome, err=True)
    return typer.Exit(1)


def _nothing_read(events: Path, result: BacktestResult) -> str:
    """Why a recording gave no events, in one line."""
    skipped = [*result.malformed, *result.rejected]
    if not skipped:
        return f"no events read from {events}: it holds no lines"
    lines = "line" if len(skipped) == 1 else "lines"
    return f"no events read from {events}: {len(skipped)} {lines} skipped, the first: {skipped[0]}"


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
            ruleset = _load(path)
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


def _load(path: Path) -> RuleSet:
    return load_rules(path) if path.exists() else load_preset(str(path))


def _not_found(path: Path) -> str | None:
    """Why ``path`` names no rules (neither a file nor a preset), or ``None`` if it does."""
    presets = list_presets()
    if path.exists() or str(path) in presets:
        return None
    return f"no such file or directory, nor a preset ({', '.join(presets)})"


def _expand(paths: Iterable[Path]) -> Iterator[tuple[Path, str | None]]:
    """Yield each file to check, with why it cannot be checked (``None`` if it can)."""
    for path in paths:
        if not path.exists():
            yield path, _not_found(path)
            continue
        if not path.is_dir():
            yield path, None
            continue
        files = sorted(
            entry
            for entry in path.iterdir()
            if entry.suffix in RULES_SUFFIXES and not entry.is_dir()
        )
        if not files:
            yield path, f"no rules files ({', '.join('*' + s for s in RULES_SUFFIXES)}) in it"
        yield from ((file, None) for file in files)


def print_commands(result: BacktestResult, console: Console) -> None:
    """One table per run of the commands a backtest issued (or 'no rule fired')."""
    verdicts = {verdict["command_id"]: verdict for verdict in result.verdicts}
    by_run: dict[str, list[ControlCommand]] = {run: [] for run in result.runs}
    for command in result.commands:
        by_run.setdefault(command["run_id"], []).append(command)
    for run, commands in by_run.items():
        if not commands:
            console.print(Text(f"run {run}: no rule fired"))
            continue
        table = Table(
            title=Text(f"run {run}: {len(commands)} commands"), title_justify="left", expand=True
        )
        for name in ("attempt", "step"):
            table.add_column(name, justify="right")
        table.add_column("stage", overflow="fold")
        table.add_column("rule", no_wrap=True)
        table.add_column("actions", overflow="fold", ratio=2)
        table.add_column("verdict", overflow="fold")
        table.add_column("reason", overflow="fold", ratio=3)
        for command in commands:
            rule = (command["rule_id"] or "") + (" (dry run)" if command["dry_run"] else "")
            verdict = verdicts.get(command["command_id"])
            table.add_row(
                str(command["attempt"]),
                str(command["step"]),
                Text(command["stage"]),
                Text(rule),
                Text("\n".join(map(_action_text, command["actions"]))),
                Text("" if verdict is None else _verdict_text(verdict)),
                Text(command["reason"]),
            )
        console.print(table)


def _verdict_text(verdict: ActionVerdict) -> str:
    """``ineffective at 31``, ``effective at 26``, ``unknown``."""
    step = verdict["decided_at_step"]
    return verdict["verdict"] if step is None else f"{verdict['verdict']} at {step}"


def _action_text(action: Action) -> str:
    """``checkpoint(tag=kl_violation)``, ``stop``, ``scale_rollout_batch(factor=2, max=256)``."""
    params = ", ".join(
        f"{key}={format_number(value) if isinstance(value, float) else value}"
        for key, value in action["params"].items()
    )
    return f"{action['type']}({params})" if params else action["type"]


def _time_ns(text: str) -> int:
    """``--until``: seconds since the epoch, or an ISO 8601 time (UTC unless it says)."""
    try:
        return round(float(text) * 1e9)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--until {text!r}: expected an ISO 8601 time or seconds since the epoch"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return round(moment.timestamp() * 1e9)
