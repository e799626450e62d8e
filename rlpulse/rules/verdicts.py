"""Verdicts: whether a rule's applied command achieved what the rule's ``expect`` says.

Pure, like the evaluator: functions over a run attempt's state
(:class:`~rlpulse.rules.state.RunState`, key ``checks``), so the worker keeps the checks in
its changelog-backed rule-state table and the backtest in a dict. A check lives from its
command to its verdict:

1. **Issued.** When the rule engine issues an enforced command of a rule with ``expect``,
   :func:`open_check` stores a :class:`Check` under the command id: the expectation as it
   was then (a reload does not change it), the metric, the issued step.
2. **Observed.** Each summary the engine evaluates (revision 1, each step once) goes to
   :func:`observe`: a check of that stage records the step's value, reduced across ranks as
   the expectation says, for the steps after the issued step.
3. **Acknowledged.** The trainer's ack goes to :func:`acknowledge`: ``applied`` fixes the
   applied step; ``noop``, ``rejected`` and ``failed`` decide ``unknown`` at once (nothing
   was changed whose effect could be checked). An ack that arrives before its command's
   check exists (a worker replaying after a crash may read the acks before the events) is
   kept (:data:`EARLY_ACKS_KEPT` per run attempt) and used when the check opens.
4. **Ended.** The run attempt's ``run_end`` (:func:`end_attempt`) decides every open check
   ``unknown``.

The decision, once the applied step ``a`` is known, looks at the values of steps after ``a``
only: at each step ``s`` up to ``a + within_steps`` the expectation's value (with
``over_steps``, the statistic of the last ``window`` values after ``a``, once there are that
many) is tested. ``effective`` at the first ``s`` where ``when`` holds; ``ineffective``
once a summary of the stage at or past ``a + within_steps`` was seen and at least one value
was tested; ``unknown`` if none was (the metric stopped arriving). It depends on the recorded
values and ``a`` only, never on when the ack arrived among the summaries, so the worker and
the backtest decide alike. A verdict's id is derived from its command's id.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from typing import Any, Final, TypedDict, cast

from rlpulse.rules.arith import WINDOW_STATS
from rlpulse.rules.model import (
    Rule,
    format_number,
    metric_names,
    parse_condition,
    reduction_of,
)
from rlpulse.rules.state import RunState
from rlpulse.schemas.records import (
    ActionVerdict,
    CommandAck,
    ControlCommand,
    MetricStats,
    StepSummary,
    VerdictKind,
)

__all__ = [
    "EARLY_ACKS_KEPT",
    "UNACKED_STEPS_KEPT",
    "VERDICT_NAMESPACE",
    "Check",
    "acknowledge",
    "describe",
    "end_attempt",
    "observe",
    "open_check",
    "verdict_id",
]

VERDICT_NAMESPACE: Final = uuid.UUID("3b0d8c5e-6a41-5f27-9c1e-8d4b2f7a6e10")
"""uuid5 namespace of verdict ids (from the command id)."""

UNACKED_STEPS_KEPT: Final = 1000
"""Values a check records while its command is not acknowledged; past them it is ``unknown``."""

EARLY_ACKS_KEPT: Final = 64
"""Acks kept per run attempt for commands whose check does not exist yet."""


class Check(TypedDict):
    """One command's expectation, waiting for its verdict (JSON-serialisable)."""

    command_id: str
    rule_id: str
    rule_version: str
    stage: str  # the command's stage
    watch: str  # the stage the expectation reads
    issued_step: int
    metrics: list[str]  # the names it may read, in order of preference
    bound: str | None  # the one it reads, once a summary carried one
    reduction: str  # the MetricStats field: mean, min, max, sum or std
    stat: str | None  # over_steps.stat, or None for the step's value
    window: int  # over_steps.window, or 1
    when: str
    within_steps: int
    applied_at_step: int | None
    ack: AckSeen | None  # the trainer's ack, once it came
    last_step: int  # the last step of ``watch`` observed
    values: list[list[float]]  # [step, value] of the steps after the issued step


class AckSeen(TypedDict):
    """What a check keeps of its command's ack."""

    status: str
    applied_at_step: int | None
    detail: dict[str, str]


def verdict_id(command_id: str) -> str:
    """The id of the verdict on ``command_id``: one per command, the same on a re-run."""
    return str(uuid.uuid5(VERDICT_NAMESPACE, command_id))


def open_check(state: RunState, rule: Rule, metric: str, command: ControlCommand) -> None:
    """Store the check of ``command``, which ``rule`` issued on ``metric`` (its bound name).

    Nothing for a rule without ``expect`` or a dry-run command (never applied). An ack kept
    from before is applied to the new check at once (its verdict then comes with the next
    summary of its stage, or at the ack's own decision).
    """
    expect = rule.expect
    if expect is None or command["dry_run"]:
        return
    names = [metric] if expect.metric is None else list(metric_names(expect.metric))
    over = expect.over_steps
    check: Check = {
        "command_id": command["command_id"],
        "rule_id": rule.id,
        "rule_version": rule.version,
        "stage": command["stage"],
        "watch": expect.stage or command["stage"],
        "issued_step": command["step"],
        "metrics": names,
        "bound": names[0] if len(names) == 1 else None,
        "reduction": reduction_of(expect.across_ranks or rule.across_ranks, expect.when),
        "stat": None if over is None else over.stat,
        "window": 1 if over is None else over.window,
        "when": str(expect.when),
        "within_steps": expect.within_steps,
        "applied_at_step": None,
        "ack": None,
        "last_step": command["step"],
        "values": [],
    }
    early = state.get("early_acks", {}).pop(check["command_id"], None)
    if early is not None:
        _take_ack(check, early)
    state.setdefault("checks", {})[check["command_id"]] = check


def observe(state: RunState, summary: StepSummary, now_ns: int) -> list[ActionVerdict]:
    """Record ``summary``'s values in the checks of its stage; return the verdicts it decides.

    Only revision 1 counts, and each step once per check (a replayed summary changes
    nothing).
    """
    checks: dict[str, Check] | None = state.get("checks")
    if not checks or summary["revision"] != 1:
        return []
    verdicts: list[ActionVerdict] = []
    step, metrics = summary["step"], summary["metrics"]
    for command_id, check in list(checks.items()):
        if check["watch"] != summary["stage"] or step <= check["last_step"]:
            continue
        check["last_step"] = step
        if check["bound"] is None:
            check["bound"] = next((name for name in check["metrics"] if name in metrics), None)
        stats: MetricStats | None = metrics.get(check["bound"]) if check["bound"] else None
        if stats is not None:
            check["values"].append(
                [step, float(cast(Mapping[str, Any], stats)[check["reduction"]])]
            )
        verdict = _decide(state, check, now_ns)
        unacked = check["ack"] is None and len(check["values"]) > UNACKED_STEPS_KEPT
        if verdict is None and unacked:
            verdict = _verdict(
                state, check, "unknown", now_ns, step=step,
                reason=f"no ack of the command within {UNACKED_STEPS_KEPT} values of "
                f"{check['bound'] or check['metrics'][0]} after it was issued",
            )  # fmt: skip
        if verdict is not None:
            del checks[command_id]
            verdicts.append(verdict)
    return verdicts


def acknowledge(state: RunState, ack: CommandAck, now_ns: int) -> list[ActionVerdict]:
    """Apply the trainer's ack to its command's check; return the verdict it decides, if any.

    A repeated ack changes nothing; an ack of a command without a check (yet) is kept for
    :func:`open_check`, the last :data:`EARLY_ACKS_KEPT` of them.
    """
    seen: AckSeen = {
        "status": ack["status"],
        "applied_at_step": ack["applied_at_step"],
        "detail": dict(ack["detail"]),
    }
    check: Check | None = state.get("checks", {}).get(ack["command_id"])
    if check is None:
        early = state.setdefault("early_acks", {})
        early[ack["command_id"]] = seen
        for stale in list(early)[:-EARLY_ACKS_KEPT]:
            del early[stale]
        return []
    if check["ack"] is not None:
        return []
    _take_ack(check, seen)
    verdict = _decide(state, check, now_ns)
    if verdict is None:
        return []
    del state["checks"][ack["command_id"]]
    return [verdict]


def end_attempt(state: RunState, now_ns: int) -> list[ActionVerdict]:
    """The run attempt ended (``run_end``): every open check is decided ``unknown``."""
    checks: dict[str, Check] | None = state.get("checks")
    if not checks:
        return []
    verdicts = []
    for check in checks.values():
        verdict = _decide(state, check, now_ns)
        if verdict is None:
            window = (
                f"before {check['within_steps']} steps had passed after its applied step "
                f"{check['applied_at_step']}"
                if check["applied_at_step"] is not None
                else "before the trainer acknowledged the command as applied"
            )
            verdict = _verdict(
                state, check, "unknown", now_ns, step=None,
                reason=f"the run attempt ended at step {check['last_step']} {window}",
            )  # fmt: skip
        verdicts.append(verdict)
    checks.clear()
    return verdicts


def describe(check: Check) -> str:
    """The expectation in words.

    ``var of reward_mean over 5 steps (mean over ranks) <= 0.5 within 10 steps``.
    """
    metric = check["bound"] or check["metrics"][0]
    value = metric if check["stat"] is None else (
        f"{check['stat']} of {metric} over {check['window']} steps"
    )  # fmt: skip
    where = f" in stage {check['watch']}" if check["watch"] != check["stage"] else ""
    return (
        f"{value} ({check['reduction']} over ranks){where} {check['when']} "
        f"within {check['within_steps']} steps"
    )


# -- deciding --------------------------------------------------------------------------------


def _take_ack(check: Check, seen: AckSeen) -> None:
    check["ack"] = seen
    applied = seen["applied_at_step"]
    if seen["status"] == "applied" and applied is not None:
        check["applied_at_step"] = applied
        check["values"] = [point for point in check["values"] if point[0] > applied]


def _decide(state: RunState, check: Check, now_ns: int) -> ActionVerdict | None:
    """The verdict the recorded values give, or None while the window is still open."""
    ack = check["ack"]
    applied = check["applied_at_step"]
    if ack is not None and applied is None:
        detail = ack["detail"]
        said = f" ({', '.join(f'{k}: {v}' for k, v in sorted(detail.items()))})" if detail else ""
        return _verdict(
            state, check, "unknown", now_ns, step=None,
            reason=f"the command was not applied: the trainer acknowledged it "
            f"{ack['status']}{said}",
        )  # fmt: skip
    if applied is None:
        return None
    deadline = applied + check["within_steps"]
    after = [(int(step), value) for step, value in check["values"] if applied < step <= deadline]
    when = parse_condition(check["when"])
    window, stat = check["window"], check["stat"]
    tested: list[tuple[int, float]] = []
    for index in range(window - 1, len(after)):
        step = after[index][0]
        if stat is None:
            value = after[index][1]
        else:
            points = after[index - window + 1 : index + 1]
            value = WINDOW_STATS[stat]([float(s) for s, _ in points], [v for _, v in points])
        tested.append((step, value))
        if when.holds(value):
            return _verdict(
                state, check, "effective", now_ns, step=step, value=value, tested=tested,
                reason=f"{describe(check)}: {_show(value)} {when} at step {step}, "
                f"{step - applied} step(s) after it was applied at step {applied}",
            )  # fmt: skip
    if check["last_step"] < deadline:
        return None
    span = f"steps {applied + 1}..{deadline}"
    if not tested:
        seen = len(after)
        need = f"; the window needs {window}" if window > 1 else ""
        return _verdict(
            state, check, "unknown", now_ns, step=deadline,
            reason=f"{check['bound'] or check['metrics'][0]} was reported in {seen} of "
            f"{span} after the applied step {applied}{need}: nothing to check",
        )  # fmt: skip
    last_step, last = tested[-1]
    return _verdict(
        state, check, "ineffective", now_ns, step=deadline, value=last, tested=tested,
        reason=f"{describe(check)}: not met in {span} after it was applied at step {applied}; "
        f"{len(tested)} value(s) checked, the last {_show(last)} at step {last_step}",
    )  # fmt: skip


def _verdict(
    state: RunState,
    check: Check,
    kind: VerdictKind,
    now_ns: int,
    *,
    step: int | None,
    reason: str,
    value: float | None = None,
    tested: list[tuple[int, float]] | None = None,
) -> ActionVerdict:
    return {
        "verdict_id": verdict_id(check["command_id"]),
        "command_id": check["command_id"],
        "run_id": state["run_id"],
        "attempt": state["attempt"],
        "stage": check["stage"],
        "rule_id": check["rule_id"],
        "rule_version": check["rule_version"],
        "verdict": kind,
        "expectation": describe(check),
        "issued_step": check["issued_step"],
        "applied_at_step": check["applied_at_step"],
        "decided_at_step": step,
        "value": value,
        "evidence": {f"step_{s}": v for s, v in (tested or [])},
        "reason": reason,
        "emitted_ns": now_ns,
    }


def _show(value: float) -> str:
    return f"{value:.6g}" if math.isfinite(value) else format_number(value)
