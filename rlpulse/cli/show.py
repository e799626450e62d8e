"""``rlpulse show RUN --step N``: one step's whole context from the archive.

Times of events and log records are on the brokers' clock (each host's corrected by the
offset its agent measured, which a line says per host), and log records come in that order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from rlpulse.cli.common import ConfigFile, Prefix, fail, one_line_errors, out
from rlpulse.cli.reading import ArchiveRoot, open_for
from rlpulse.cli.render import cell, print_rows

if TYPE_CHECKING:
    from rlpulse.offline.drilldown import StepContext
    from rlpulse.offline.step_samples import StepSamples


@one_line_errors
def show(
    run_id: Annotated[str, typer.Argument(help="The run.")],
    step: Annotated[int | None, typer.Option(help="The step.")] = None,
    stacks: Annotated[
        bool,
        typer.Option(
            "--stacks",
            help="The ranks' stacks of the newest capture, grouped by where their training "
            "loops are (instead of a step).",
        ),
    ] = False,
    every_rank: Annotated[
        bool, typer.Option("--all", help="With --stacks: every rank's stacks too.")
    ] = False,
    samples: Annotated[
        bool,
        typer.Option(
            "--samples",
            help="With --step: the step's rollout samples (the reward histogram over all of "
            "them, the chosen texts best first) instead of its context.",
        ),
    ] = False,
    margin: Annotated[
        float, typer.Option(help="Seconds of log records before and after the step's events.")
    ] = 2.0,
    archive: ArchiveRoot = None,
    prefix: Prefix = None,
    config: ConfigFile = None,
) -> None:
    """Show a step: summaries, every rank's metrics, log records, commands, acks, verdicts.

    With --samples: the step's rollout samples (reward histogram, chosen texts).

    With --stacks: the ranks' stacks of the run's newest capture (capture_stacks), grouped.
    """
    from rlpulse.offline.drilldown import step_context

    if stacks:
        _show_stacks(run_id, every_rank, archive, prefix, config)
        return
    if step is None:
        raise typer.BadParameter("give --step N, or --stacks", param_hint="--step")
    con, root = open_for(config, prefix, archive)
    try:
        if samples:
            from rlpulse.offline.step_samples import step_samples

            parts = step_samples(con, run_id, step)
            if not parts:
                raise fail(
                    f"the archive at {root} has no rollout samples of step {step} of {run_id}"
                )
            _print_samples(run_id, step, parts)
            return
        context = step_context(con, run_id, step, margin)
    finally:
        con.close()
    _print(context, margin)


def _metric_text(metrics: Any) -> str:
    return ", ".join(f"{name}={cell(value)}" for name, value in sorted((metrics or {}).items()))


def _print(context: StepContext, margin: float) -> None:
    from rlpulse.offline.diagnose import utc_text

    out.print(f"[bold]run {context.run_id}, step {context.step}[/]")
    if context.window_ns is not None:
        low, high = context.window_ns
        out.print(
            f"events from {utc_text(low)} to {utc_text(high)} "
            f"({(high - low) / 1e6:.1f} ms); log records within {margin:g} s of them",
            highlight=False,
        )
    offsets = context.host_offsets()
    if offsets:
        out.print(
            "times on the brokers' clock; host clocks behind it: "
            + ", ".join(
                f"{host} {'unknown (its own time)' if ns is None else f'{ns / 1e6:.1f} ms'}"
                for host, ns in offsets.items()
            ),
            highlight=False,
        )
    for summary in context.summaries.dicts():
        stats = summary.pop("metrics") or {}
        out.print(
            f"\n[bold]summary[/] stage {summary['stage']} revision {summary['revision']}: "
            f"{len(summary['ranks_reported'])}/{summary['world_size']} ranks, "
            f"missing {summary['missing_ranks'] or 'none'}, closed by {summary['closed_by']}, "
            f"last rank {summary['last_rank']} ({cell(summary['last_rank_lag_ms'])} ms behind), "
            f"stragglers {summary['stragglers'] or 'none'}",
            highlight=False,
        )
        print_rows(
            ["metric", "mean", "std", "min", "min_rank", "max", "max_rank", "count"],
            [
                [name, s["mean"], s["std"], s["min"], s["min_rank"], s["max"], s["max_rank"],
                 s["count"]]
                for name, s in sorted(stats.items())
            ],
        )  # fmt: skip
    print_rows(
        ["stage", "rank", "host", "pid", "time", "metrics"],
        [
            [r["stage"], r["rank"], r["hostname"], r["pid"], r["time"], _metric_text(r["metrics"])]
            for r in context.metrics.dicts()
        ],
        title="metrics of every rank",
    )
    out.print(f"\n[bold]log records[/] ({len(context.logs.rows)})")
    for record in context.logs.dicts():
        trace = f" trace={record['trace_id']}" if record["trace_id"] else ""
        out.print(
            f"{cell(record['time'])} {record['level']:<8} {record['hostname']} "
            f"rank {record['rank']} pid {record['pid']} step {record['step']} "
            f"{record['logger']}{trace}: {record['message']}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        if record["exception"]:
            out.print("    " + record["exception"].replace("\n", "\n    "), markup=False)
    print_rows(context.commands.columns, context.commands.rows, title="commands")
    print_rows(context.acks.columns, context.acks.rows, title="acks")
    print_rows(context.verdicts.columns, context.verdicts.rows, title="verdicts")


_BAR: Final = 40
"""Characters of the longest bar of the printed histogram."""


def _print_samples(run_id: str, step: int, parts: list[StepSamples]) -> None:
    for part in parts:
        shares = ", ".join(f"{name} {share:.1%}" for name, share in part.shares.items())
        out.print(
            f"[bold]run {run_id}, step {step}: {part.count} {part.split} samples[/]"
            + (f" ({shares})" if shares else ""),
            highlight=False,
        )
        most = max(part.counts, default=0)
        for low, high, count in zip(part.edges, part.edges[1:], part.counts, strict=False):
            bar = "#" * (round(_BAR * count / most) if most else 0)
            out.print(f"  reward {low:>9.4g} .. {high:<9.4g} {count:>6} {bar}", highlight=False)
        out.print(f"\n[bold]chosen texts[/] ({len(part.texts)}, best reward first)")
        for text in part.texts:
            scores = ", ".join(f"{k}={cell(v)}" for k, v in sorted((text["scores"] or {}).items()))
            out.print(
                f"\n[bold]rank {text['rank']} sample {text['sample_index']}[/] reward "
                f"{cell(text['reward'])} ({', '.join(text['chosen'])}); group {text['group']}, "
                f"data source {text['data_source']}; {text['response_length']} long"
                f"{', truncated' if text['truncated'] else ''}, repetition "
                f"{cell(text['repetition'])}" + (f"; {scores}" if scores else ""),
                highlight=False,
            )
            if text["prompt"] is not None:
                out.print(f"  prompt: {text['prompt']}", markup=False, soft_wrap=True)
            out.print(f"  response: {response_text(text)}", markup=False, soft_wrap=True)
            if text["ground_truth"] is not None:
                out.print(f"  ground truth: {text['ground_truth']}", markup=False, soft_wrap=True)


def response_text(text: dict[str, Any]) -> str:
    """A chosen sample's response as sent: its head, the cut marked, its tail."""
    head, tail = text["response_head"], text["response_tail"]
    if not tail:
        return str(head)
    cut = text["response_chars"] - len(head) - len(tail)
    return f"{head} [... {cut} characters cut ...] {tail}"


def _show_stacks(
    run_id: str, every_rank: bool, archive: Any, prefix: str | None, config: Any
) -> None:
    from rlpulse.offline.stacks import (
        CAPTURE_QUERY,
        capture_parameters,
        describe_groups,
        group_ranks,
        newest_capture,
    )

    con, root = open_for(config, prefix, archive)
    try:
        cursor = con.execute(CAPTURE_QUERY, capture_parameters(run_id))
        names = [column[0] for column in cursor.description or ()]
        found = newest_capture([dict(zip(names, row, strict=True)) for row in cursor.fetchall()])
    finally:
        con.close()
    if found is None:
        raise fail(
            f"no stacks of run {run_id} in the archive at {root}: none was captured "
            f"(rlpulse control stacks {run_id}), or the archiver has not written them yet"
        )
    command_id, ranks = found
    hosts = len({rank.host for rank in ranks})
    out.print(
        f"stacks of run {run_id} (command {command_id}): {len(ranks)} rank(s) on {hosts} host(s)",
        soft_wrap=True,
    )
    for line in describe_groups(group_ranks(ranks)):
        out.print(f"  {line}", soft_wrap=True, markup=False)
    if every_rank:
        for rank in ranks:
            out.print(f"\nrank {rank.rank} (pid {rank.pid} on {rank.host}, step {rank.step}):")
            out.print(rank.dump or f"  process {rank.outcome}", soft_wrap=True, markup=False)
