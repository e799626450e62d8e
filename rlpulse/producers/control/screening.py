"""The trainer's check of a command's contents before the training loop sees it.

A command that reaches a trainer was validated where it was made (a rules file, the
``rlpulse control`` command line), but the trainer does not take that on trust: whatever
wrote the control topic, :func:`command_problem` refuses an action it does not know,
parameters it does not know or of the wrong type, a scale factor outside
``commands.scale_factor_min..scale_factor_max``, batch bounds below 1 or above
``commands.max_batch_size``, a growing factor without an upper bound, more than
``commands.max_actions`` actions, and text parameters that are too long or (a checkpoint
tag) could name another directory. The control client acks such a command ``rejected``
with the reason and never returns it (:class:`~rlpulse.producers.control.client.ControlClient`).

The actions, their parameters and bounds are those of the action contract
(:mod:`rlpulse.schemas.actions`); a trainer logs an alert without a severity as a warning.
"""

from __future__ import annotations

from rlpulse.schemas import actions as action_contract
from rlpulse.schemas.actions import ActionContracts
from rlpulse.schemas.records import Action, ControlCommand
from rlpulse.settings import CommandLimits

__all__ = ["action_problem", "command_problem"]


def command_problem(
    command: ControlCommand, limits: CommandLimits, actions: ActionContracts | None = None
) -> str | None:
    """Why the trainer must not apply ``command``, or None when its contents are sound.

    ``actions``: the actions a trainer knows (default: the contract's ``ACTIONS``).
    """
    if not command["actions"]:
        return "it has no actions"
    if len(command["actions"]) > limits.max_actions:
        return (
            f"it has {len(command['actions'])} actions, more than commands.max_actions "
            f"({limits.max_actions})"
        )
    for index, action in enumerate(command["actions"]):
        problem = action_problem(action, limits, actions)
        if problem is not None:
            return f"action {index + 1} ({action['type']!r:.80}): {problem}"
    return None


def action_problem(
    action: Action, limits: CommandLimits, actions: ActionContracts | None = None
) -> str | None:
    """Why one action is unsound, or None."""
    known = action_contract.ACTIONS if actions is None else actions
    if action["type"] not in known:
        return f"unknown action; known: {', '.join(known.names)}"
    return known[action["type"]].problem(action["params"], limits)
