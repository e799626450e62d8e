"""verl: the ``rlpulse`` Tracking backend against real verl code, and commands on its trainer.

verl 0.9.1 and its import chain come from the ``integrations`` extra of pyproject.toml. verl's
trainer needs GPUs and an inference engine, so the command tests drive verl's real
``Tracking`` from the ``fit()`` of a stand-in trainer that has the attributes verl's v1
``PPOTrainer`` has and loops the way its ``fit()`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

from rlpulse.ops.commands import action, operator_command, publish_command
from rlpulse.producers.integrations import verl as integration
from rlpulse.producers.integrations import verl_env
from rlpulse.producers.integrations.canonical import TRL_NAMES, VERL_NAMES, canonical_metrics
from rlpulse.producers.integrations.commands import resize_batch
from rlpulse.producers.integrations.exceptions import ActionRejectedError, VerlSettingsError
from rlpulse.producers.integrations.verl_trainer import VerlTrainerActions, batch_unit
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import Action, CommandAck, TrainerEvent
from rlpulse.schemas.topics import Topics
from tests.integration.test_run_end import run_ends
from tests.integration.topic_reader import read_until
from tests.kafka import settings_at

STEP_METRICS: dict[str, Any] = {
    "actor/kl_loss": 0.12,
    "actor/pg_loss": -0.3,
    "critic/score/mean": 0.75,
    "response_length/mean": 212.0,
    "prompt_length/mean": 80,
    "timing_s/step": 31.5,
    "training/global_step": 1,
    "val-core/gsm8k/acc": "n/a",  # not a number: left out
}


def verl_config(local_dir: str = "/ckpt/run") -> DictConfig:
    """The keys of verl 0.9.1's ppo_trainer.yaml that the actions read."""
    return OmegaConf.create(
        {
            "data": {"train_batch_size": 64, "gen_batch_size": None},
            "actor_rollout_ref": {
                "actor": {"ppo_mini_batch_size": 16, "use_dynamic_bsz": False, "strategy": "fsdp"},
                "rollout": {"n": 4},
            },
            "critic": {"ppo_mini_batch_size": 16},
            "trainer": {"n_gpus_per_node": 8, "nnodes": 1, "default_local_dir": local_dir},
        }
    )


class SavedCheckpoints:
    """A ``trainer.checkpoint_callback_class``: remembers the steps it was called for."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_save(self, trainer: Any, global_step: int, checkpoint_dir: str, **_: Any) -> None:
        self.steps.append(global_step)


class StandInTrainer:
    """What the actions use of verl's v1 ``PPOTrainer``; ``fit()`` loops like verl's does."""

    trainer_mode = "sync"
    parameter_sync_step = 1
    use_critic = False

    def __init__(self, config: DictConfig, total_training_steps: int = 1000) -> None:
        self.config = config
        self.global_steps = 0
        self.total_training_steps = total_training_steps
        self.train_dataloader = SimpleNamespace(batch_size=int(config.data.train_batch_size))
        self.replay_buffer = SimpleNamespace(train_batch_size=int(config.data.train_batch_size))
        self.checkpoint_callback = SavedCheckpoints()
        self.saved = self.checkpoint_callback
        self.logger: Any = None

    def _save_checkpoint(self) -> None:
        """Like verl's: write global_step_<N>, then call the checkpoint callback."""
        directory = Path(self.config.trainer.default_local_dir) / f"global_step_{self.global_steps}"
        directory.mkdir(parents=True, exist_ok=True)
        self.checkpoint_callback.on_save(
            self, global_step=self.global_steps, checkpoint_dir=str(directory)
        )

    def fit(
        self,
        project: str,
        experiment: str,
        rlpulse: dict[str, Any],
        metrics: Callable[[int], dict[str, Any]] = lambda _step: STEP_METRICS,
        step_s: float = 0.05,
    ) -> None:
        """verl's v1 loop: build Tracking, log at the end of each step, stop past the total."""
        from verl.utils.tracking import Tracking

        self.logger = Tracking(
            project_name=project,
            experiment_name=experiment,
            default_backend=["console", "rlpulse"],
            config={"trainer": {"project_name": project}, "rlpulse": rlpulse},
        )
        self.global_steps += 1  # from the step it resumed at, 0 for a fresh run
        while self.global_steps <= self.total_training_steps:
            self.logger.log(data=metrics(self.global_steps), step=self.global_steps)
            self.global_steps += 1
            time.sleep(step_s)
        self.logger.finish()


# -- the rlpulse block and the batch arithmetic (no broker, no verl trainer) ------------


def test_metrics_are_split_into_stages_by_prefix() -> None:
    settings = integration.VerlSettings.model_validate(
        {"stages": {"reward": ["critic/score/"], "rollout": []}}
    )
    assert settings.split(STEP_METRICS) == {
        # verl's names as logged, and the seed's names for them (canonical.VERL_NAMES)
        "actor": {
            "actor/kl_loss": 0.12,
            "actor/pg_loss": -0.3,
            "kl_divergence": 0.12,
            "actor_loss": -0.3,
        },
        "reward": {"critic/score/mean": 0.75},
        "rollout": {"reward_mean": 0.75},
        "trainer": {
            "response_length/mean": 212.0,
            "prompt_length/mean": 80.0,
            "timing_s/step": 31.5,
            "training/global_step": 1.0,
        },
    }
    default = integration.VerlSettings().split(STEP_METRICS)
    assert set(default) == {"actor", "critic", "rollout", "trainer"}
    assert default["rollout"] == {
        "response_length/mean": 212.0,
        "prompt_length/mean": 80.0,
        "reward_mean": 0.75,
    }
    verl_only = integration.VerlSettings(seed_names=False).split(STEP_METRICS)
    assert verl_only["rollout"] == {"response_length/mean": 212.0, "prompt_length/mean": 80.0}
    assert verl_only["actor"] == {"actor/kl_loss": 0.12, "actor/pg_loss": -0.3}


def test_a_name_logged_as_the_seeds_own_is_not_overwritten() -> None:
    logged = {"actor/kl_loss": 0.12, "kl_divergence": 0.2, "perf/throughput": 900.0}
    assert canonical_metrics(logged, VERL_NAMES) == {
        "trainer": {"throughput_tokens_per_sec": 900.0}
    }
    assert canonical_metrics({"actor/reward_kl_penalty": 0.4}, VERL_NAMES) == {
        "actor": {"kl_divergence": 0.4}
    }
    assert canonical_metrics({"reward": 1.5, "kl": 0.1, "loss": 0.3}, TRL_NAMES) == {
        "rollout": {"reward_mean": 1.5},
        "actor": {"kl_divergence": 0.1, "actor_loss": 0.3},
    }


def test_a_bad_rlpulse_block_names_the_key() -> None:
    with pytest.raises(VerlSettingsError, match="bootstrap_server"):
        integration.VerlSettings.from_verl_config({"rlpulse": {"bootstrap_server": "x:9092"}})
    settings = integration.VerlSettings.from_verl_config(
        {"rlpulse": {"settings": {"producer": {"linger": 1}}}}
    )
    with pytest.raises(VerlSettingsError, match=r"producer\.linger"):
        settings.rlpulse_settings()


@pytest.mark.parametrize(
    ("current", "params", "unit", "expected"),
    [
        (64, {"factor": 2, "max": 256}, 16, (128, 128)),
        (192, {"factor": 2, "max": 256}, 16, (256, 256)),
        (64, {"factor": 1.5}, 32, (96, 96)),
        (64, {"factor": 1.4}, 32, (90, 64)),  # rounded down to the unit: unchanged
        (64, {"factor": 0.1, "min": 8}, 16, (8, 16)),  # below the unit: the unit
        (64, {"factor": 3, "max": 200}, 48, (192, 192)),
    ],
)
def test_resize_keeps_a_multiple_of_the_unit(
    current: int, params: dict[str, float], unit: int, expected: tuple[int, int]
) -> None:
    resize = resize_batch(current, params, unit)
    assert (resize.requested, resize.new) == expected
    assert resize.result().status == ("noop" if resize.new == current else "applied")


@pytest.mark.parametrize(
    ("params", "unit", "reason"),
    [
        ({"factor": 0}, 1, "factor must be a number > 0"),
        ({}, 1, "'factor' is missing"),
        ({"factor": "2"}, 1, "must be a finite number"),
        ({"factor": 2, "min": 300, "max": 256}, 1, "above max"),
        ({"factor": 2, "max": 40}, 48, "no multiple of 48"),
    ],
)
def test_resize_rejects_what_cannot_be_applied(
    params: dict[str, Any], unit: int, reason: str
) -> None:
    with pytest.raises(ActionRejectedError, match=reason):
        resize_batch(64, params, unit)


def test_batch_unit_follows_verl_constraints() -> None:
    unit, factors = batch_unit(
        verl_config(), loader_batch=32, parameter_sync_step=1, use_critic=True
    )
    # 8 GPUs and rollout.n=4: train_batch_size * 4 % 8 == 0 needs a multiple of 2.
    assert factors["data-parallel minimum / rollout.n"] == 2
    assert unit == 32
    megatron = verl_config()
    megatron.actor_rollout_ref.actor.strategy = "megatron"
    megatron.actor_rollout_ref.actor.megatron = {"tensor_model_parallel_size": 2}
    megatron.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 3
    megatron.actor_rollout_ref.rollout.n = 1
    unit, _ = batch_unit(megatron, loader_batch=16, parameter_sync_step=3, use_critic=False)
    assert unit == 48  # lcm(16, mini-batch 16, sync step 3, dp 4 x micro 3 = 12)


def scale(factor: float, **limits: float) -> Action:
    return action("scale_rollout_batch", factor=factor, **limits)


def test_scaling_rewrites_the_batch_size_verl_reads_each_step() -> None:
    trainer = StandInTrainer(verl_config())
    trainer.global_steps = 7
    result = VerlTrainerActions(trainer).scale_rollout_batch(scale(2, max=256))
    assert result.status == "applied"
    assert result.detail["old"] == "64" and result.detail["new"] == "128"
    assert result.detail["from_step"] == "8"
    assert trainer.config.data.train_batch_size == 128
    assert trainer.config.data.gen_batch_size == 64  # the dataloader keeps its batch size
    assert trainer.replay_buffer.train_batch_size == 128


def test_scaling_is_rejected_where_verl_cannot_change_the_batch() -> None:
    legacy = SimpleNamespace(config=verl_config())
    with pytest.raises(ActionRejectedError, match="legacy RayPPOTrainer"):
        VerlTrainerActions(legacy).scale_rollout_batch(scale(2))
    separate = StandInTrainer(verl_config())
    separate.trainer_mode = "separate_async"
    with pytest.raises(ActionRejectedError, match="trainer_mode=separate_async"):
        VerlTrainerActions(separate).scale_rollout_batch(scale(2))
    assert separate.config.data.train_batch_size == 64


def test_stop_ends_the_v1_loop_after_this_step_and_legacy_after_one_more() -> None:
    v1 = StandInTrainer(verl_config())
    v1.global_steps = 5
    actions = VerlTrainerActions(v1)
    assert actions.stop(action("stop")).detail == {"last_step": "5"}
    assert v1.total_training_steps == 5 and actions.last_step == 5
    legacy = SimpleNamespace(global_steps=5, total_training_steps=100)
    actions = VerlTrainerActions(legacy)
    actions.stop(action("stop"))
    assert legacy.total_training_steps == 5 and actions.last_step == 6


def test_the_launcher_adds_the_plugin_to_verls_module_list_once() -> None:
    plugin = verl_env.PLUGIN_MODULE
    assert verl_env.with_plugin("") == plugin
    assert verl_env.with_plugin("my.plugin") == f"my.plugin,{plugin}"
    assert verl_env.with_plugin(f"{plugin},x") == f"{plugin},x"


# -- verl's Tracking with the rlpulse backend, against the broker --------------------------


def rlpulse_block(run_id: str, bootstrap: str, topics: Topics) -> dict[str, Any]:
    return {"run_id": run_id, "bootstrap": bootstrap, "prefix": topics.prefix}


def events_of(bootstrap: str, topics: Topics, run_id: str, want: int) -> list[TrainerEvent]:
    codec = default_codec()
    return read_until(
        bootstrap,
        topics.events,
        codec.decode_event,
        lambda found: len(found) >= want,
        keep=lambda event: event["run_id"] == run_id,
    )


def acks_of(bootstrap: str, topics: Topics, run_id: str, want: int) -> list[CommandAck]:
    codec = default_codec()
    return read_until(
        bootstrap,
        topics.acks,
        codec.decode_ack,
        lambda found: len(found) >= want,
        keep=lambda ack: ack["run_id"] == run_id,
    )


@pytest.mark.broker
def test_tracking_publishes_each_step_by_stage(kafka_bootstrap: str, topics: Topics) -> None:
    from verl.utils.tracking import Tracking

    integration.install()
    tracking = Tracking(
        project_name="rlpulse-tests",
        experiment_name="exp",
        default_backend=["console", "rlpulse"],
        config={
            "rlpulse": {
                "run_id": "verl-run",
                "bootstrap": kafka_bootstrap,
                "prefix": topics.prefix,
                "tags": {"model": "qwen"},
            }
        },
    )
    for step in (1, 2):
        tracking.log(data={**STEP_METRICS, "training/global_step": step}, step=step)
    tracking.finish()
    tracking.finish()  # again, as Tracking.__del__ does: the run ended once

    events = events_of(kafka_bootstrap, topics, "verl-run", 2 + 2 * 4)
    assert [e["kind"] for e in (events[0], events[-1])] == ["run_start", "run_end"]
    assert run_ends(kafka_bootstrap, topics, "verl-run") == [(0, 0, "training finished")]
    metrics = [e for e in events if e["kind"] == "metrics"]
    assert {(e["stage"], e["step"]) for e in metrics} == {
        (stage, step) for stage in ("actor", "critic", "rollout", "trainer") for step in (1, 2)
    }
    assert {(e["rank"], e["world_size"], e["attempt"]) for e in metrics} == {(0, 1, 0)}
    assert all(e["tags"] == {"framework": "verl", "model": "qwen"} for e in metrics)
    actor = next(e for e in metrics if e["stage"] == "actor" and e["step"] == 2)
    assert actor["metrics"] == {
        "actor/kl_loss": 0.12,
        "actor/pg_loss": -0.3,
        "kl_divergence": 0.12,
        "actor_loss": -0.3,
    }
    trainer = next(e for e in metrics if e["stage"] == "trainer" and e["step"] == 2)
    assert trainer["metrics"]["training/global_step"] == 2.0
    assert "val-core/gsm8k/acc" not in trainer["metrics"]


@pytest.mark.broker
def test_commands_act_on_the_trainer_whose_fit_built_the_tracking(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    integration.install()
    run_id = f"verl-{uuid.uuid4().hex[:8]}"
    settings = settings_at(kafka_bootstrap, topics)
    grow = operator_command(run_id, [scale(2, max=256), action("alert", message="noisy")])
    shrink = operator_command(run_id, [scale(0.3, max=50)])  # no multiple of 64 up to 50
    stop = operator_command(run_id, [action("checkpoint", tag="kl"), action("stop")])
    for command in (grow, shrink, stop):
        publish_command(settings, command)

    trainer = StandInTrainer(verl_config(str(tmp_path)))
    trainer.fit("rlpulse-tests", "exp", rlpulse_block(run_id, kafka_bootstrap, topics))

    acks = {a["command_id"]: a for a in acks_of(kafka_bootstrap, topics, run_id, 3)}
    last_step = trainer.global_steps - 1
    checkpoint = tmp_path / f"global_step_{last_step}"
    assert trainer.total_training_steps == last_step < 100
    assert acks[stop["command_id"]]["status"] == "applied"
    assert acks[stop["command_id"]]["applied_at_step"] == last_step
    assert acks[stop["command_id"]]["detail"] == {
        "checkpoint.status": "applied",
        "checkpoint.path": str(checkpoint),
        "checkpoint.tag": "kl",
        "stop.status": "applied",
        "stop.last_step": str(last_step),
    }
    assert trainer.saved.steps == [last_step]
    attempt = json.loads((checkpoint / "rlpulse_attempt.json").read_text())
    assert attempt == {"run_id": run_id, "attempt": 0}
    grown = acks[grow["command_id"]]
    assert grown["status"] == "applied"
    assert grown["detail"]["scale_rollout_batch.new"] == "128"
    assert grown["detail"]["alert.status"] == "noop"
    assert acks[shrink["command_id"]]["status"] == "rejected"
    assert "no multiple of 64" in acks[shrink["command_id"]]["detail"]["scale_rollout_batch.reason"]
    assert trainer.config.data.train_batch_size == 128
    assert run_ends(kafka_bootstrap, topics, run_id) == [
        (0, 0, f"stopped by command {stop['command_id']} (operator)")
    ]


@pytest.mark.broker
def test_verl_loads_the_plugin_in_a_fresh_process(kafka_bootstrap: str, topics: Topics) -> None:
    """What happens in each Ray worker: verl imports the plugin named in its env variable."""
    script = textwrap.dedent(
        f"""
        from verl.utils.tracking import Tracking
        tracking = Tracking("p", "plugin-run", ["rlpulse"], config={{"rlpulse": {{
            "bootstrap": {kafka_bootstrap!r}, "prefix": {topics.prefix!r}}}}})
        tracking.log(data={{"actor/entropy": 0.5}}, step=3)
        tracking.finish()
        """
    )
    env = {**os.environ, verl_env.EXTERNAL_MODULES_ENV: verl_env.PLUGIN_MODULE}
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    events = events_of(kafka_bootstrap, topics, "plugin-run", 3)
    assert [(e["kind"], e["stage"], e["step"]) for e in events] == [
        ("run_start", "trainer", 0),
        ("metrics", "actor", 3),
        ("run_end", "trainer", 3),
    ]


@pytest.mark.broker
def test_a_trainer_that_resumed_starts_a_new_attempt(
    kafka_bootstrap: str, topics: Topics, tmp_path: Path
) -> None:
    integration.install()
    (tmp_path / "global_step_4").mkdir()
    trainer = StandInTrainer(verl_config(str(tmp_path)), total_training_steps=6)
    trainer.global_steps = 4  # what verl's _load_checkpoint() left
    trainer.fit("rlpulse-tests", "exp", rlpulse_block("resumed", kafka_bootstrap, topics))

    events = events_of(kafka_bootstrap, topics, "resumed", 2 + 2 * 4)
    assert {(e["attempt"], e["step"]) for e in events if e["kind"] == "metrics"} == {(1, 5), (1, 6)}
    assert events[0]["kind"] == "run_start" and events[0]["step"] == 4
    recorded = json.loads((tmp_path / "global_step_4" / "rlpulse_attempt.json").read_text())
    assert recorded == {"run_id": "resumed", "attempt": 1}
