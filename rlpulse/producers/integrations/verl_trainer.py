"""The ``stop``, ``checkpoint`` and ``scale_rollout_batch`` actions on verl's PPO trainer.

Written against verl 0.9.1 (the ``integrations`` extra of pyproject.toml). The trainer is the
object whose ``fit()`` builds verl's ``Tracking``: ``PPOTrainer`` of
``verl/trainer/ppo/v1/trainer_base.py`` (the default, ``trainer.use_v1=true``; it has a
``trainer_mode``) or the legacy ``RayPPOTrainer`` of ``verl/trainer/ppo/ray_trainer.py``.
Actions run on the driver between two steps: in ``fit()``, ``self.logger.log(data=metrics,
step=self.global_steps)`` is the last thing a step does before ``global_steps += 1``.

- ``stop``: sets ``trainer.total_training_steps`` to the current step. The v1 loop
  (``while ... self.global_steps <= self.total_training_steps``) then ends before the next
  step and ``fit()`` returns through ``on_train_end()``; the legacy loop computes
  ``is_last_step`` at the top of each step, so it runs one more step as its last one
  (final checkpoint if ``trainer.save_freq > 0``, final validation if ``test_freq > 0``).
- ``checkpoint``: verl's own ``trainer._save_checkpoint()``, which writes
  ``{trainer.default_local_dir}/global_step_{N}`` (actor, critic, ``data.pt``) and
  ``latest_checkpointed_iteration.txt``, and calls ``trainer.checkpoint_callback_class``.
- ``scale_rollout_batch``: the v1 ``sync`` trainer reads ``data.train_batch_size`` again
  at every step (``PPOTrainer.step`` and ``_next_train_batch``), fetching it in whole
  dataloader batches (``data.gen_batch_size``, else the initial ``data.train_batch_size``,
  the batch size the dataloader was built with). So the new size is written to the
  trainer's config, ``data.gen_batch_size`` is pinned to the dataloader's batch size, and
  the size is kept a multiple of :func:`batch_unit`. The legacy trainer iterates a
  dataloader built with the old size, and the async modes fix the size at start
  (``separate_async`` asserts ``train_batch_size == parameter_sync_step *
  ppo_mini_batch_size``): those are acked ``rejected`` with the reason.
"""

from __future__ import annotations

import math
import os
from typing import Any

from rlpulse.producers.integrations.commands import (
    ActionHandler,
    ActionResult,
    alert,
    resize_batch,
)
from rlpulse.producers.integrations.exceptions import ActionRejectedError
from rlpulse.schemas.records import Action

# What both trainers have when their fit() builds the Tracking. Not ``global_steps``: the
# legacy ``RayPPOTrainer.fit`` sets it (``self.global_steps = 0``) only after that; the
# actions read it when they run, between steps.
_TRAINER_ATTRIBUTES = ("config", "total_training_steps", "_save_checkpoint")
_MEGATRON_PARALLEL = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
)


def is_verl_trainer(candidate: object) -> bool:
    """Whether ``candidate`` is a verl PPO trainer, as its ``fit()`` builds the ``Tracking``."""
    return all(hasattr(candidate, name) for name in _TRAINER_ATTRIBUTES)


def batch_unit(
    config: Any, *, loader_batch: int, parameter_sync_step: int, use_critic: bool
) -> tuple[int, dict[str, int]]:
    """What ``data.train_batch_size`` must stay a multiple of: the unit and its factors.

    - the dataloader batch: prompts are fetched in whole dataloader batches;
    - ``actor_rollout_ref.actor.ppo_mini_batch_size`` (and ``critic.``'s with a critic):
      the update runs whole mini-batches. verl's mini-batch size is global (the workers
      divide ``ppo_mini_batch_size * rollout.n`` by their data-parallel size), so whole
      global mini-batches keep every data-parallel rank's share whole;
    - ``trainer.v1.<mode>.parameter_sync_step``: ``PPOTrainer.step`` asserts it divides
      the batch;
    - the data-parallel minimum of ``verl.utils.config.validate_config`` (without
      ``use_dynamic_bsz``): ``train_batch_size * rollout.n`` divisible by the GPU count
      (Megatron: data-parallel size x ``ppo_micro_batch_size_per_gpu``).
    """
    from omegaconf import OmegaConf

    def number(key: str, default: int | None = None) -> int | None:
        value = OmegaConf.select(config, key, default=default)
        return None if value is None else int(value)

    factors: dict[str, int] = {"dataloader batch size": loader_batch}
    keys = ["actor_rollout_ref.actor.ppo_mini_batch_size"]
    if use_critic:
        keys.append("critic.ppo_mini_batch_size")
    for key in keys:
        size = number(key)
        if size:
            factors[key] = size
    factors["parameter_sync_step"] = parameter_sync_step
    if not OmegaConf.select(config, "actor_rollout_ref.actor.use_dynamic_bsz", default=False):
        gpus = (number("trainer.n_gpus_per_node", 1) or 1) * (number("trainer.nnodes", 1) or 1)
        minimal = gpus
        if OmegaConf.select(config, "actor_rollout_ref.actor.strategy") == "megatron":
            parallel = math.prod(
                number(f"actor_rollout_ref.actor.megatron.{name}", 1) or 1
                for name in _MEGATRON_PARALLEL
            )
            micro = number("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 1) or 1
            minimal = max(1, gpus // parallel) * micro
        samples = number("actor_rollout_ref.rollout.n", 1) or 1
        factors["data-parallel minimum / rollout.n"] = minimal // math.gcd(minimal, samples)
    return math.lcm(*factors.values()), factors


class VerlTrainerActions:
    """Applies actions to one verl trainer, between its steps (see the module docs)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.last_step: int | None = None
        """The last step the run takes, once a ``stop`` was applied."""

    @property
    def is_v1(self) -> bool:
        """Whether the trainer is verl's v1 ``PPOTrainer`` (it has a ``trainer_mode``)."""
        return hasattr(self.trainer, "trainer_mode")

    def handlers(self) -> dict[str, ActionHandler]:
        """The action types this trainer supports, for :func:`~.commands.apply_command`."""
        return {
            "stop": self.stop,
            "checkpoint": self.checkpoint,
            "scale_rollout_batch": self.scale_rollout_batch,
            "alert": alert,
        }

    def stop(self, action: Action) -> ActionResult:
        """End the run at the step boundary after the current step (one more step on v0)."""
        step = int(self.trainer.global_steps)
        self.trainer.total_training_steps = step
        self.last_step = step if self.is_v1 else step + 1
        return ActionResult("applied", {"last_step": str(self.last_step)})

    def checkpoint(self, action: Action) -> ActionResult:
        """Save with verl's ``_save_checkpoint()``; the detail names the directory."""
        self.trainer._save_checkpoint()
        directory = os.path.join(
            str(self.trainer.config.trainer.default_local_dir),
            f"global_step_{self.trainer.global_steps}",
        )
        detail = {"path": directory}
        tag = action["params"].get("tag")
        if tag is not None:
            detail["tag"] = str(tag)
        return ActionResult("applied", detail)

    def scale_rollout_batch(self, action: Action) -> ActionResult:
        """Change ``data.train_batch_size`` from the next step on (v1 ``sync`` mode only)."""
        from omegaconf import open_dict

        trainer = self.trainer
        if not self.is_v1:
            raise ActionRejectedError(
                "the legacy RayPPOTrainer (trainer.use_v1=false) iterates a dataloader built "
                "with data.train_batch_size; its batch size cannot change during the run"
            )
        mode = str(trainer.trainer_mode)
        if mode != "sync":
            raise ActionRejectedError(
                f"trainer.v1.trainer_mode={mode}: only the sync trainer reads "
                "data.train_batch_size again at every step"
            )
        data = trainer.config.data
        current = int(data.train_batch_size)
        loader_batch = int(trainer.train_dataloader.batch_size)
        unit, factors = batch_unit(
            trainer.config,
            loader_batch=loader_batch,
            parameter_sync_step=int(getattr(trainer, "parameter_sync_step", 1)),
            use_critic=bool(getattr(trainer, "use_critic", False)),
        )
        resize = resize_batch(current, action["params"], unit)
        if resize.new != current:
            with open_dict(trainer.config):
                data.train_batch_size = resize.new
                if data.get("gen_batch_size") is None:
                    data.gen_batch_size = loader_batch
            replay_buffer = getattr(trainer, "replay_buffer", None)
            has_size = getattr(replay_buffer, "train_batch_size", None) is not None
            if replay_buffer is not None and has_size:
                replay_buffer.train_batch_size = resize.new
        return resize.result(
            key="data.train_batch_size",
            from_step=str(int(trainer.global_steps) + 1),
            unit_factors=", ".join(f"{name}={value}" for name, value in factors.items()),
        )
