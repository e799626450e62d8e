"""One data-parallel rank of a verl actor update on the CPU (``test_verl_workers.py`` runs two).

``python -m tests.integration.verl_rank MODEL_DIR OUT_JSON RUN_JSON`` with torchrun's
variables set (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). The process does
what a verl worker and its driver do, with verl's real code: it makes the gloo group,
imports verl (which loads the modules of ``VERL_USE_EXTERNAL_MODULES``: the CPU harness and
rlpulse's plugin), builds ``ActorRolloutRefWorker(role="actor")`` from verl's own
``ppo_trainer`` config, ``init_model()``, then for each step calls verl's
``RayPPOTrainer._update_actor`` on a trainer whose worker group is this rank's worker: the
same driver code, the same worker method, without Ray in between. Its half of each step's
batch differs from the other rank's, so their metrics differ.

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
    ]


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
    }
    return DataProto.from_single_dict({name: value[rows] for name, value in tensors.items()})


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
    verl_workers.bind_trainer(trainer, run["run_id"], 0, run["settings"])

    steps = []
    for step in range(1, STEPS + 1):
        trainer.global_steps = step
        captured.clear()
        output = RayPPOTrainer._update_actor(trainer, step_batch(step, rank, world_size))
        driver = {k: plain(v) for k, v in rename_dict(output.meta_info["metrics"]).items()}
        logging.getLogger(engine_workers.__file__).warning("rank %d finished step %d", rank, step)
        steps.append({"step": step, "local": list(captured), "driver": driver})
    result = {"rank": rank, "pid": os.getpid(), "steps": steps, "failures": verl_workers.failures}
    Path(out_path).write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:4])
