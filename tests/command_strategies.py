"""Hypothesis strategies for ControlCommands with random actions and parameters.

Half plausible, half absurd: known and unknown action types, known and unknown parameter
names, values of every wire type (null, booleans, 64-bit integers, doubles with NaN and
infinities, text of any length). Every command they draw is encodable as a ControlCommand.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from hypothesis import strategies as st

from rlpulse.producers.integrations.commands import ActionResult, alert, resize_batch
from rlpulse.schemas.actions import ACTIONS
from rlpulse.schemas.records import Action, ControlCommand, ParamValue

KNOWN_TYPES = ACTIONS.names
PARAM_NAMES = sorted({name for action in ACTIONS for name in action.param_names})

characters = st.characters(exclude_categories=["Cs"])  # surrogates are not UTF-8
text = st.text(characters, max_size=40)
long_text = st.text(characters, min_size=1000, max_size=1100)
values: st.SearchStrategy[ParamValue] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=-3, max_value=300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0.01, max_value=20),
    text,
    st.sampled_from(["info", "warning", "critical", "kl", "../etc", ".hidden", "a/b"]),
    long_text,
)
params = st.dictionaries(st.one_of(st.sampled_from(PARAM_NAMES), text), values, max_size=4)
random_actions: st.SearchStrategy[Action] = st.builds(
    lambda kind, given: {"type": kind, "params": given},
    st.one_of(st.sampled_from(KNOWN_TYPES), text),
    params,
)


def _action(kind: str, **given: ParamValue) -> Action:
    return {"type": kind, "params": {k: v for k, v in given.items() if v is not None}}


sizes = st.none() | st.integers(min_value=-2, max_value=400)
plausible_actions: st.SearchStrategy[Action] = st.one_of(
    st.just(_action("stop")),
    st.builds(
        lambda tag: _action("checkpoint", tag=tag),
        st.none() | st.sampled_from(["kl", "best", "kl violation", "../up", ""]),
    ),
    st.builds(
        lambda factor, low, high: _action("scale_rollout_batch", factor=factor, min=low, max=high),
        st.floats(min_value=0.01, max_value=20) | st.sampled_from([0.5, 2.0, 2]),
        sizes,
        sizes,
    ),
    st.builds(
        lambda key, value: {"type": "set", "params": {"key": key, "value": value}},
        st.sampled_from(["lr", "clip", ""]),
        values,
    ),
    st.builds(
        lambda message, severity: _action("alert", message=message, severity=severity),
        st.sampled_from(["noisy", "look at it", ""]),
        st.none() | st.sampled_from(["info", "warning", "critical", "doom"]),
    ),
)
"""Actions of the known types with parameters near what rules and operators send."""

actions = st.one_of(plausible_actions, random_actions)


@st.composite
def commands(draw: st.DrawFn, run_id: str) -> ControlCommand:
    """A command for ``run_id`` (attempt 0, not dry-run): 0 to 4 plausible actions, or up to 20
    of any kind."""
    return {
        "command_id": str(uuid.uuid4()),
        "run_id": run_id,
        "attempt": 0,
        "stage": draw(st.sampled_from(["rollout", "actor", "operator"])),
        "step": draw(st.integers(min_value=-1, max_value=10**6)),
        "origin": draw(st.sampled_from(["rule", "operator"])),
        "rule_id": draw(st.none() | text),
        "rule_version": None,
        "dry_run": False,
        "actions": draw(st.lists(plausible_actions, max_size=4) | st.lists(actions, max_size=20)),
        "reason": draw(text),
        "evidence": draw(st.dictionaries(text, st.floats(allow_nan=True), max_size=3)),
        "issued_ns": time.time_ns(),
    }


class ToyTrainer:
    """What a hand-written loop does with each action: the handlers of ``apply_command``."""

    def __init__(self) -> None:
        self.batch_size = 64
        self.stopped = False
        self.checkpoints = 0
        self.config: dict[str, Any] = {}

    def handlers(self) -> dict[str, Any]:
        return {
            "stop": self.stop,
            "checkpoint": self.checkpoint,
            "scale_rollout_batch": self.scale,
            "set": self.set,
            "alert": alert,
        }

    def stop(self, action: Action) -> ActionResult:
        self.stopped = True
        return ActionResult("applied")

    def checkpoint(self, action: Action) -> ActionResult:
        self.checkpoints += 1
        return ActionResult("applied", {"tag": str(action["params"].get("tag"))})

    def scale(self, action: Action) -> ActionResult:
        resize = resize_batch(self.batch_size, action["params"], unit=8)
        self.batch_size = resize.new
        return resize.result()

    def set(self, action: Action) -> ActionResult:
        self.config[str(action["params"]["key"])] = action["params"]["value"]
        return ActionResult("applied")
