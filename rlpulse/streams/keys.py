"""The keys of the worker's state: one function per kind, the one place they are built.

``run|attempt`` keys a run attempt (the joiner's run index, the rule state),
``run|attempt|stage`` a stage, ``run|attempt|stage|step`` a step's group. Keys are split
from the right, so a run id may contain ``|`` and a stage may not (the validation refuses
such events).
"""

from __future__ import annotations

from rlpulse.schemas.records import TrainerEvent
from rlpulse.schemas.validation import KEY_SEPARATOR

__all__ = [
    "event_stage_key",
    "group_key",
    "run_key",
    "split_group_key",
    "split_stage_key",
    "stage_key",
    "stage_key_of",
]


def run_key(run_id: str, attempt: int) -> str:
    """The key of one run attempt."""
    return f"{run_id}{KEY_SEPARATOR}{attempt}"


def stage_key(run_id: str, attempt: int, stage: str) -> str:
    """The key of one (run, attempt, stage)."""
    return stage_key_of(run_key(run_id, attempt), stage)


def stage_key_of(rkey: str, stage: str) -> str:
    """The key of ``stage`` of the run attempt whose key is ``rkey``."""
    return f"{rkey}{KEY_SEPARATOR}{stage}"


def event_stage_key(event: TrainerEvent) -> str:
    """The stage key of an event."""
    return stage_key(event["run_id"], event["attempt"], event["stage"])


def group_key(skey: str, step: int) -> str:
    """The key of one step's group, under its stage key."""
    return f"{skey}{KEY_SEPARATOR}{step}"


def split_stage_key(skey: str) -> tuple[str, str]:
    """A stage key as (run key, stage)."""
    rkey, stage = skey.rsplit(KEY_SEPARATOR, 1)
    return rkey, stage


def split_group_key(gkey: str) -> tuple[str, int, str, int]:
    """A group key as (run id, attempt, stage, step)."""
    run_id, attempt, stage, step = gkey.rsplit(KEY_SEPARATOR, 3)
    return run_id, int(attempt), stage, int(step)
