"""The ids of rule-issued commands: deterministic, so a re-run issues the same ones."""

from __future__ import annotations

import uuid
from typing import Final

from rlpulse.rules.model import Rule

__all__ = ["COMMAND_NAMESPACE", "command_id"]

COMMAND_NAMESPACE: Final = uuid.UUID("6f1c2a57-93e4-5d0b-8a3e-7c52d1b0e9f4")
"""uuid5 namespace of the ids of rule-issued commands."""


def command_id(run_id: str, attempt: int, stage: str, rule: Rule, step: int) -> str:
    """Deterministic id of the command ``rule`` issues at ``step``: a re-run issues the same."""
    name = "\x1f".join((run_id, str(attempt), stage, rule.id, rule.version, str(step)))
    return str(uuid.uuid5(COMMAND_NAMESPACE, name))
