"""Rule evaluation benchmark: StepSummaries evaluated per second.

Loads the four shipped presets into one rule set (ids prefixed by preset, about 40
rules) and feeds synthetic summaries that carry every metric those rules read,
through ``RuleEngine.evaluate`` with the run state round-tripped through JSON after
every summary, as the worker's faust table does. The baseline, measured in the same
run on the same summaries, is the two seed rules alone.

Prints one JSON object per line.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from rlpulse.rules import RuleEngine, RuleSet, load_preset
from rlpulse.rules.loader import list_presets
from rlpulse.schemas.records import MetricStats, StepSummary


def all_presets() -> RuleSet:
    rules = []
    for name in list_presets():
        for rule in load_preset(name).rules:
            rules.append(rule.model_copy(update={"id": f"{name}.{rule.id}"}))
    return RuleSet(version=1, rules=rules)


def stats(value: float, ranks: int) -> MetricStats:
    return {
        "count": ranks,
        "sum": value * ranks,
        "mean": value,
        "std": 0.1,
        "min": value - 0.1,
        "max": value + 0.1,
        "min_rank": 0,
        "max_rank": ranks - 1,
        "non_finite": 0,
    }


def summaries(ruleset: RuleSet, runs: int, steps: int, ranks: int) -> list[StepSummary]:
    rng = random.Random(1)
    names = sorted({name for rule in ruleset.rules for name in rule.metrics})
    out: list[StepSummary] = []
    for step in range(steps):
        for run in range(runs):
            metrics = {name: stats(rng.uniform(0.0, 1.0), ranks) for name in names}
            out.append(
                {
                    "summary_id": f"{run}-{step}",
                    "run_id": f"run-{run}",
                    "attempt": 0,
                    "stage": "trainer",
                    "step": step,
                    "revision": 1,
                    "world_size": ranks,
                    "ranks_reported": list(range(ranks)),
                    "missing_ranks": [],
                    "metrics": metrics,
                    "tags": {},
                    "last_rank": ranks - 1,
                    "last_rank_lag_ns": 0,
                    "closed_by": "complete",
                    "first_event_ns": 0,
                    "last_event_ns": 0,
                    "emitted_ns": 0,
                }
            )
    return out


def measure(ruleset: RuleSet, inputs: list[StepSummary]) -> dict[str, Any]:
    engine = RuleEngine(ruleset)
    states: dict[str, str] = {}
    commands = 0
    started = time.perf_counter()
    for summary in inputs:
        key = f"{summary['run_id']}|{summary['attempt']}"
        raw = states.get(key)
        state, issued = engine.evaluate(json.loads(raw) if raw else None, summary, 0)
        states[key] = json.dumps(state)
        commands += len(issued)
    elapsed = time.perf_counter() - started
    return {
        "rules": len(ruleset.rules),
        "summaries": len(inputs),
        "seconds": round(elapsed, 3),
        "summaries_per_s": round(len(inputs) / elapsed, 1),
        "commands": commands,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--ranks", type=int, default=8)
    args = parser.parse_args()
    presets = all_presets()
    inputs = summaries(presets, args.runs, args.steps, args.ranks)
    load = {"runs": args.runs, "steps": args.steps, "metrics": len(inputs[0]["metrics"])}
    baseline = measure(load_preset("seed"), inputs)
    print(json.dumps({"bench": "rules", "name": "seed_rules", **baseline, "load": load}))
    full = measure(presets, inputs)
    print(json.dumps({"bench": "rules", "name": "four_presets", **full, "load": load}))
    ratio = full["summaries_per_s"] / baseline["summaries_per_s"]
    print(
        json.dumps(
            {"bench": "rules", "name": "ratio_four_presets_vs_seed", "ratio": round(ratio, 3)}
        )
    )


if __name__ == "__main__":
    main()
