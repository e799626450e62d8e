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


def test_send_parses_parameters_by_their_kind_and_checks_them_as_the_trainer_does() -> None:
    code, err = control("send", "run-a", "scale_rollout_batch", "factor=2", "min=8")
    assert code == 1
    assert "factor 2 grows the batch without a bound: give max" in err
    code, err = control("send", "run-a", "scale_rollout_batch", "factor=0.5", "max=2.5")
    assert "max must be a whole number, got 2.5" in err
    code, err = control("send", "run-a", "set", "key=lr", "value=NaN")
    assert code == 1 and "value must be finite" in err
    code, err = control("send", "run-a", "stpo")
    assert code == 1 and "unknown action; known: stop, checkpoint, alert" in err
    code, err = control("send", "run-a", "set", "key")
    assert code == 1 and "parameter 'key': expected NAME=VALUE" in err
