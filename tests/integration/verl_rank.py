"""One data-parallel rank of verl's critic and actor updates on the CPU (two in the test).

``python -m tests.integration.verl_rank MODEL_DIR OUT_JSON RUN_JSON`` with torchrun's
variables set (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). The process does
what a verl worker and its driver do, with verl's real code: it makes the gloo group,
imports verl (which loads the modules of ``VERL_USE_EXTERNAL_MODULES``: the CPU harness and
rlpulse's plugin), builds ``ActorRolloutRefWorker(role="actor")`` from verl's own
``ppo_trainer`` config, ``init_model()``, and the critic (a value-model ``TrainingWorker``)
as ``RayPPOTrainer.init_workers`` does, then for each step calls verl's
``RayPPOTrainer._update_critic`` and ``_update_actor`` on a trainer whose worker groups are
this rank's workers: the same driver code, the same worker methods, without Ray between.
Its half of each step's batch differs from the other rank's, so their metrics differ.

Independently of rlpulse, it records what this rank handed to
``allgather_dict_into_dict`` (its own values, before verl gathers them) and the dict the
driver code returned, and writes them to OUT_JSON with its pid.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

STEPS = 2
BATCH = 8  # both ranks' rows of a step
PROMPT, RESPONSE = 4, 4
MINI_BATCH = 4  # verl's ppo_mini_batch_size (global): 2 mini-batches per rank and step


def overrides(model_dir: str) -> list[str]:
    """verl's ppo_trainer config for a tiny eager fp32 FSDP2 actor on the CPU."""
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "+actor_rollout_ref.model.load_tokenizer=False",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
        "actor_rollout_ref.actor.use_torch_compile=False",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={MINI_BATCH}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.n=1",
        f"critic.model.path={model_dir}",
        "critic.model.use_remove_padding=False",
        "critic.model.enable_gradient_checkpointing=False",
        "+critic.model.override_config.attn_implementation=eager",
        "+critic.model.load_tokenizer=False",
        "critic.strategy=fsdp2",
        "critic.fsdp.dtype=float32",
        "critic.fsdp.use_torch_compile=False",
        "critic.ppo_micro_batch_size_per_gpu=1",
    ]


class Ready:
    """What ``_update_critic`` calls ``.get()`` on: Ray's future of a non-blocking call.

    ``TrainingWorker.train_mini_batch`` is registered ``blocking=False``, so through a Ray
    worker group it returns a future; called in this process its result is there already.
    """

    def __init__(self, result: Any) -> None:
        self.result = result

    def get(self) -> Any:
        """The worker's result."""
        return self.result


class CriticGroup:
    """The critic's worker group in this process: the worker, and futures that are ready."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def train_mini_batch(self, data: Any) -> Ready:
        """verl's ``TrainingWorker.train_mini_batch`` on this rank's share."""
        return Ready(self.worker.train_mini_batch(data))


def critic_worker(config: Any) -> Any:
    """The critic as ``RayPPOTrainer.init_workers`` builds it: a value-model TrainingWorker."""
    from functools import partial

    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import TrainingWorkerConfig
    from verl.workers.engine_workers import TrainingWorker
    from verl.workers.utils.losses import value_loss

    critic = omega_conf_to_dataclass(config.critic)
    engine = critic.engine
    engine.infer_max_token_len_per_gpu = critic.ppo_infer_max_token_len_per_gpu
    engine.max_token_len_per_gpu = critic.ppo_max_token_len_per_gpu
    worker = TrainingWorker(
        config=TrainingWorkerConfig(
            model_type="value_model",
            model_config=critic.model,
            engine_config=engine,
            optimizer_config=critic.optim,
            checkpoint_config=critic.checkpoint,
        )
    )
    worker.reset()
    worker.set_loss_fn(partial(value_loss, config=critic))
    return worker


def step_batch(step: int, rank: int, world_size: int) -> Any:
    """This rank's rows of the step's batch, padded as verl's rollout leaves them."""
    from verl import DataProto

    generator = torch.Generator().manual_seed(step)
    prompts = torch.randint(0, 128, (BATCH, PROMPT), generator=generator)
    responses = torch.randint(0, 128, (BATCH, RESPONSE), generator=generator)
    input_ids = torch.cat([prompts, responses], dim=1)
    rows = slice(rank * BATCH // world_size, (rank + 1) * BATCH // world_size)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "position_ids": torch.arange(PROMPT + RESPONSE).expand(BATCH, -1).clone(),
        "response_mask": torch.ones(BATCH, RESPONSE),
        "old_log_probs": -3 * torch.rand(BATCH, RESPONSE, generator=generator),
        "advantages": torch.randn(BATCH, RESPONSE, generator=generator),
        "values": torch.randn(BATCH, RESPONSE, generator=generator),
        "returns": torch.randn(BATCH, RESPONSE, generator=generator),
    }
    batch = DataProto.from_single_dict({name: value[rows] for name, value in tensors.items()})
    batch.meta_info["temperature"] = 1.0  # RayPPOTrainer.fit sets it before the updates
    return batch


def plain(value: Any) -> Any:
    """A captured metric value as JSON: a verl ``Metric`` as its aggregation and values."""
    if hasattr(value, "aggregation") and hasattr(value, "values"):
        return {"aggregation": value.aggregation.value, "values": [float(v) for v in value.values]}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return float(value)


def main(model_dir: str, out_path: str, run_path: str) -> None:
    """Run the steps; write what this rank saw to ``out_path``."""
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    import verl  # loads VERL_USE_EXTERNAL_MODULES
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.py_functional import rename_dict
    from verl.workers import engine_workers

    from rlpulse.producers.integrations import verl_workers

    captured: list[dict[str, Any]] = []
    gather = engine_workers.allgather_dict_into_dict

    def allgather_dict_into_dict(data: dict[str, Any], group: Any = None) -> dict[str, Any]:
        captured.append({name: plain(value) for name, value in data.items()})
        gathered: dict[str, Any] = gather(data=data, group=group)
        return gathered

    engine_workers.allgather_dict_into_dict = allgather_dict_into_dict

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides(model_dir))
    worker = engine_workers.ActorRolloutRefWorker(config.actor_rollout_ref, role="actor")
    worker.init_model()

    # The driver's part: what RayPPOTrainer.__init__/fit leave on the trainer that
    # _update_actor reads, and the run its rlpulse Tracking bound it to.
    run = json.loads(Path(run_path).read_text())
    trainer = object.__new__(RayPPOTrainer)
    trainer.config = config
    trainer.distillation_config = None
    trainer.actor_rollout_wg = worker
    trainer.critic_wg = CriticGroup(critic_worker(config))
    verl_workers.bind_trainer(trainer, run["run_id"], 0, run["settings"])

    steps = []
    for step in range(1, STEPS + 1):
        trainer.global_steps = step
        captured.clear()
        roles = {}
        for role, update in (
            ("critic", RayPPOTrainer._update_critic),
            ("actor", RayPPOTrainer._update_actor),
        ):  # the order of RayPPOTrainer.fit
            captured.clear()
            output = update(trainer, step_batch(step, rank, world_size))
            driver = {k: plain(v) for k, v in rename_dict(output.meta_info["metrics"]).items()}
            roles[role] = {"local": list(captured), "driver": driver}
        logging.getLogger(engine_workers.__file__).warning("rank %d finished step %d", rank, step)
        steps.append({"step": step, **roles})
    result = {"rank": rank, "pid": os.getpid(), "steps": steps, "failures": verl_workers.failures}
    Path(out_path).write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
