"""Commands a person sends to a run from the shell: ``rlpulse control stop|checkpoint|scale``."""

from __future__ import annotations

import getpass
import socket
import time
import uuid

from rlpulse.ops.publish import publish_one
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import Action, ControlCommand, ParamValue
from rlpulse.schemas.signing import sign
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings

__all__ = ["OPERATOR_STAGE", "action", "operator_command", "publish_command"]

OPERATOR_STAGE = "operator"


def operator_command(
    run_id: str,
    actions: list[Action],
    *,
    attempt: int = 0,
    reason: str | None = None,
    step: int = -1,
) -> ControlCommand:
    """A ``ControlCommand`` with origin ``operator``; ``step=-1`` means "at the next step"."""
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    kinds = ", ".join(action["type"] for action in actions)
    return {
        "command_id": str(uuid.uuid4()),
        "run_id": run_id,
        "attempt": attempt,
        "stage": OPERATOR_STAGE,
        "step": step,
        "origin": "operator",
        "rule_id": None,
        "rule_version": None,
        "dry_run": False,
        "actions": actions,
        "reason": f"{kinds} requested by {who}" + (f": {reason}" if reason else ""),
        "evidence": {},
        "issued_ns": time.time_ns(),
    }


def action(kind: str, **params: ParamValue) -> Action:
    """One action, leaving out parameters that were not given."""
    return {"type": kind, "params": {k: v for k, v in params.items() if v is not None}}


def publish_command(settings: Settings, command: ControlCommand) -> None:
    """Write ``command`` to the control topic and wait until the broker confirms it.

    With ``security.control_signing_key`` set, the command is signed first.
    """
    key = settings.security.signing_key()
    if key is not None:
        command = sign(command, key)
    publish_one(
        settings,
        Topics(settings.prefix).control,
        command["run_id"].encode(),
        default_codec().encode("ControlCommand", command),
        client="operator",
    )
