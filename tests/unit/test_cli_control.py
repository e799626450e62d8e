"""``rlpulse control``: a command the trainer would reject is not sent."""

from __future__ import annotations

from typer.testing import CliRunner

from rlpulse.cli import app

NOWHERE = ["--bootstrap", "127.0.0.1:1", "--prefix", "unit"]


def control(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["control", *args, *NOWHERE])
    return result.exit_code, result.stderr


def test_a_growing_scale_without_max_is_not_sent() -> None:
    code, err = control("scale", "run-a", "--factor", "2")
    assert code == 1
    assert err.startswith("error: not sent: the trainer would reject it: action 1")
    assert "factor 2 grows the batch without a bound: give max" in err
    assert "could not publish" not in err  # refused before any broker was asked


def test_the_trainer_side_limits_are_the_ones_checked() -> None:
    code, err = control("scale", "run-a", "--factor", "100", "--max", "64")
    assert code == 1
    assert "factor 100 is outside [0.0625, 16] (commands.scale_factor_min/max)" in err
    code, err = control("checkpoint", "run-a", "--tag", "../elsewhere")
    assert code == 1
    assert "must not start with '.'" in err
