"""What signing and checking a ControlCommand costs, per command.

The worker signs each command it issues; a trainer with a key verifies each one and, with
or without a key, checks its contents. Measured on the seed rules' kl-guard command
(checkpoint + stop) and on an unstable-reward command (scale_rollout_batch). The baseline,
measured in the same run on the same commands, is what every command costs anyway: encoding
it (worker) and decoding it (trainer).

Prints one JSON object per line.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial

from rlpulse.producers.control.screening import command_problem
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import ControlCommand
from rlpulse.schemas.signing import sign, signature_problem
from rlpulse.settings import CommandLimits

KEY = b"benchmark-key-benchmark-key-0123456789"


def sample_commands() -> list[ControlCommand]:
    base: ControlCommand = {
        "command_id": "6f1c2b8e-1d2a-5b3c-9e4f-0a1b2c3d4e5f",
        "run_id": "ppo-7b-run-42",
        "attempt": 0,
        "stage": "actor",
        "step": 52,
        "origin": "rule",
        "rule_id": "kl-guard",
        "rule_version": "3b1f0c2a9d8e",
        "dry_run": False,
        "actions": [
            {"type": "checkpoint", "params": {"tag": "kl_violation"}},
            {"type": "stop", "params": {}},
        ],
        "reason": "kl_divergence 0.5 > 0.3 for 3 consecutive steps (50, 51, 52); mean over 8",
        "evidence": {"step_50": 0.5, "step_51": 0.5, "step_52": 0.5, "threshold": 0.3},
        "issued_ns": time.time_ns(),
    }
    scale: ControlCommand = {
        **base,
        "rule_id": "unstable-reward",
        "actions": [{"type": "scale_rollout_batch", "params": {"factor": 2.0, "max": 256}}],
    }
    return [base, scale]


def per_command_us(work: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        work()
    return (time.perf_counter() - start) / repeat * 1e6


def measure(command: ControlCommand, repeat: int) -> dict[str, float]:
    """Microseconds per command of each step, and of the baselines."""
    codec = default_codec()
    limits = CommandLimits()
    wire = codec.encode("ControlCommand", command)
    decoded = codec.decode_command(codec.encode("ControlCommand", sign(command, KEY, codec)))

    def sign_and_encode() -> bytes:
        return codec.encode("ControlCommand", sign(command, KEY, codec))

    return {
        "worker_encode_baseline_us": per_command_us(
            partial(codec.encode, "ControlCommand", command), repeat
        ),
        "worker_sign_and_encode_us": per_command_us(sign_and_encode, repeat),
        "trainer_decode_baseline_us": per_command_us(partial(codec.decode_command, wire), repeat),
        "trainer_verify_us": per_command_us(
            partial(signature_problem, decoded, KEY, codec), repeat
        ),
        "trainer_check_contents_us": per_command_us(
            partial(command_problem, decoded, limits), repeat
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=20_000)
    args = parser.parse_args()
    for command in sample_commands():
        measured = measure(command, args.repeat)
        checks = measured["trainer_verify_us"] + measured["trainer_check_contents_us"]
        print(
            json.dumps(
                {
                    "benchmark": "command_checks",
                    "command": command["rule_id"],
                    "repeat": args.repeat,
                    **{name: round(value, 2) for name, value in measured.items()},
                    "sign_over_encode": round(
                        measured["worker_sign_and_encode_us"]
                        / measured["worker_encode_baseline_us"],
                        2,
                    ),
                    "checks_over_decode": round(checks / measured["trainer_decode_baseline_us"], 2),
                }
            )
        )


if __name__ == "__main__":
    main()
