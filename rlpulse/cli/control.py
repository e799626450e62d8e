"""``rlpulse control stop|checkpoint|scale|send|stacks RUN``: act on a run by hand.

``send`` takes any action of the action contract (:mod:`rlpulse.schemas.actions`) with its
parameters as ``NAME=VALUE``; the others are shortcuts for the common ones.

A command the run's trainer would refuse (the checks of
:mod:`rlpulse.producers.control.screening`, with this side's ``commands.*`` limits) is not sent.
A sent command is followed to its answer: the command waits up to ``--wait`` seconds for
the run's ack and prints it (status, step, detail). Exit status: 0 applied or noop (or
sent, with ``--no-wait``), 1 rejected, failed or not sent, 2 no ack within the wait.

``stacks`` is answered by the run's host agents, not its trainer: it waits for the ranks'
stacks on the logs topic, prints the ranks grouped by where their training loops are
(:mod:`rlpulse.ops.stacks`), and exits 2 when no agent answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from rlpulse.cli.common import (
    Bootstrap,
    ConfigFile,
    Prefix,
    fail,
    one_line_errors,
    out,
    say,
    settings,
)
from rlpulse.offline.stacks import describe_groups, group_ranks
from rlpulse.ops.acks import AckWatch, describe_ack
from rlpulse.ops.commands import action, operator_command, publish_command
from rlpulse.ops.stacks import StackWatch
from rlpulse.producers.control.screening import command_problem
from rlpulse.schemas import actions as action_contract
from rlpulse.schemas.actions import ParamKind
from rlpulse.schemas.records import Action, ParamValue
from rlpulse.schemas.topics import Topics

control_app = typer.Typer(
    help="Act on a run by hand: publish an operator ControlCommand and wait for its ack.",
    no_args_is_help=True,
)

EXIT_NO_ACK = 2
"""Exit status when the run did not ack within ``--wait``."""

Attempt = Annotated[int, typer.Option(help="The run attempt the command is for.")]
Reason = Annotated[str | None, typer.Option(help="Why; shown to whoever reads the command.")]
Wait = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0,
        help="Seconds to wait for the run's ack (trainers ack at their next step); "
        "no ack by then exits with status 2.",
    ),
]
NoWait = Annotated[
    bool,
    typer.Option(
        "--no-wait", help="Exit once the broker has the command; do not wait for the ack."
    ),
]


def _send(
    run_id: str,
    actions: list[Action],
    bootstrap: str | None,
    prefix: str | None,
    config: Path | None,
    attempt: int,
    reason: str | None,
    wait_s: float,
    no_wait: bool,
) -> None:
    chosen = settings(config, {"bootstrap": bootstrap, "prefix": prefix})
    command = operator_command(run_id, actions, attempt=attempt, reason=reason)
    problem = command_problem(command, chosen.commands)
    if problem is not None:
        raise fail(f"not sent: the trainer would reject it: {problem}")
    watch = None if no_wait else AckWatch(chosen)  # opened first: an early ack is not missed
    try:
        publish_command(chosen, command)
        out.print(
            f"sent {command['command_id']} to {run_id} (attempt {attempt}): {command['reason']}",
            soft_wrap=True,
        )
        if watch is None:
            return
        say(f"waiting up to {wait_s:g} s for the ack of run {run_id}")
        ack = watch.wait(command["command_id"], wait_s)
    finally:
        if watch is not None:
            watch.close()
    if ack is None:
        control = Topics(chosen.prefix).control
        fail(
            f"no ack from run {run_id} (attempt {attempt}) within {wait_s:g} s: no trainer of "
            f"that run attempt reads {control}, or its step takes longer than --wait; the "
            f"command stays on {control} for a trainer that starts within "
            "producer.control_lookback_s"
        )
        raise typer.Exit(EXIT_NO_ACK)
    answer = f"run {run_id} acked {command['command_id']}: {describe_ack(ack)}"
    if ack["status"] in ("rejected", "failed"):
        raise fail(answer)
    out.print(answer, soft_wrap=True)


@control_app.command("stop")
@one_line_errors
def control_stop(
    run_id: Annotated[str, typer.Argument(help="The run to stop.")],
    checkpoint: Annotated[bool, typer.Option(help="Save a checkpoint before stopping.")] = True,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    attempt: Attempt = 0,
    reason: Reason = None,
    wait: Wait = 120.0,
    no_wait: NoWait = False,
    config: ConfigFile = None,
) -> None:
    """Stop a run at its next step (after a checkpoint unless --no-checkpoint)."""
    actions = [action("checkpoint", tag="operator_stop")] if checkpoint else []
    _send(
        run_id, [*actions, action("stop")], bootstrap, prefix, config, attempt, reason, wait,
        no_wait,
    )  # fmt: skip


@control_app.command("checkpoint")
@one_line_errors
def control_checkpoint(
    run_id: Annotated[str, typer.Argument(help="The run to checkpoint.")],
    tag: Annotated[str, typer.Option(help="Tag of the checkpoint.")] = "operator",
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    attempt: Attempt = 0,
    reason: Reason = None,
    wait: Wait = 120.0,
    no_wait: NoWait = False,
    config: ConfigFile = None,
) -> None:
    """Save a checkpoint at the run's next step."""
    _send(
        run_id, [action("checkpoint", tag=tag)], bootstrap, prefix, config, attempt, reason,
        wait, no_wait,
    )  # fmt: skip


@control_app.command("scale")
@one_line_errors
def control_scale(
    run_id: Annotated[str, typer.Argument(help="The run whose rollout batch to scale.")],
    factor: Annotated[float, typer.Option(help="Multiply the rollout batch by this.")],
    min_batch: Annotated[int | None, typer.Option("--min", help="Lower bound.")] = None,
    max_batch: Annotated[
        int | None, typer.Option("--max", help="Upper bound (required for a factor above 1).")
    ] = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    attempt: Attempt = 0,
    reason: Reason = None,
    wait: Wait = 120.0,
    no_wait: NoWait = False,
    config: ConfigFile = None,
) -> None:
    """Scale the rollout batch: new = clamp(round(current * factor), min, max)."""
    scale = action("scale_rollout_batch", factor=factor, min=min_batch, max=max_batch)
    _send(run_id, [scale], bootstrap, prefix, config, attempt, reason, wait, no_wait)


@control_app.command("stacks")
@one_line_errors
def control_stacks(
    run_id: Annotated[str, typer.Argument(help="The run whose ranks' stacks to take.")],
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    attempt: Attempt = 0,
    reason: Reason = None,
    wait_s: Annotated[
        float,
        typer.Option("--rank-wait", min=0.1, help="Seconds an agent waits for each rank's stacks."),
    ] = 10.0,
    wait: Annotated[
        float,
        typer.Option(
            "--wait", min=0, help="Seconds to wait for the first agent to answer; none: exit 2."
        ),
    ] = 30.0,
    show_all: Annotated[
        bool, typer.Option("--all", help="Print every rank's stacks, not only the groups.")
    ] = False,
    config: ConfigFile = None,
) -> None:
    """Take every thread's stack of each rank process of a run, from outside.

    The run's host agents signal its ranks; the ranks are printed grouped by where their
    training loops are, the smallest group first.
    """
    chosen = settings(config, {"bootstrap": bootstrap, "prefix": prefix})
    command = operator_command(
        run_id, [action("capture_stacks", wait_s=wait_s)], attempt=attempt, reason=reason
    )
    with StackWatch(chosen) as watch:
        publish_command(chosen, command)
        say(f"sent {command['command_id']}: waiting up to {wait:g} s for the agents of {run_id}")
        ranks = watch.collect(command["command_id"], wait + wait_s)
    if not ranks:
        fail(
            f"no agent answered for run {run_id} within {wait + wait_s:g} s: no host that runs "
            f"its ranks has a live agent (an unknown run, or a run that ended)"
        )
        raise typer.Exit(EXIT_NO_ACK)
    hosts = len({rank.host for rank in ranks})
    out.print(f"{len(ranks)} rank(s) of run {run_id} on {hosts} host(s):", soft_wrap=True)
    for line in describe_groups(group_ranks(ranks)):
        out.print(f"  {line}", soft_wrap=True)
    if show_all:
        for rank in ranks:
            out.print(f"\nrank {rank.rank} (pid {rank.pid} on {rank.host}, step {rank.step}):")
            out.print(rank.dump or f"  process {rank.outcome}", soft_wrap=True, markup=False)


def _param_value(kind: ParamKind | None, text: str) -> ParamValue:
    """``text`` as the value of a parameter of ``kind`` (unknown: as written); screening judges."""
    if kind in (ParamKind.NUMBER, ParamKind.WHOLE):
        for parse in (int, float):
            try:
                return parse(text)
            except ValueError:
                continue
        return text
    if kind is ParamKind.SCALAR:
        try:
            value = json.loads(text)
        except ValueError:
            return text
        return value if value is None or isinstance(value, bool | int | float | str) else text
    return text


@control_app.command("send")
@one_line_errors
def control_send(
    run_id: Annotated[str, typer.Argument(help="The run to act on.")],
    action_name: Annotated[
        str, typer.Argument(metavar="ACTION", help="An action: stop, checkpoint, alert, ...")
    ],
    params: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[NAME=VALUE]...",
            help="The action's parameters, e.g. factor=0.5 max=256 (set's value is JSON: "
            'null, true, 3, "text"; plain text is text).',
        ),
    ] = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    attempt: Attempt = 0,
    reason: Reason = None,
    wait: Wait = 120.0,
    no_wait: NoWait = False,
    config: ConfigFile = None,
) -> None:
    """Send one action of the action contract, checked as the trainer will check it."""
    known = action_contract.ACTIONS
    kinds = (
        {spec.name: spec.kind for spec in known[action_name].params} if action_name in known else {}
    )
    given: dict[str, ParamValue] = {}
    for assignment in params or []:
        name, equals, text = assignment.partition("=")
        if not equals or not name:
            raise fail(f"parameter {assignment!r}: expected NAME=VALUE, e.g. factor=0.5")
        given[name] = _param_value(kinds.get(name), text)
    _send(
        run_id,
        [{"type": action_name, "params": given}],
        bootstrap,
        prefix,
        config,
        attempt,
        reason,
        wait,
        no_wait,
    )
