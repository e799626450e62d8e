"""verl's real PPO trainers build the ``Tracking`` that the rlpulse backend binds to.

The command tests of ``test_verl.py`` act on a stand-in trainer. Here verl 0.9.1's own
trainers run on the CPU, with verl's own ``ppo_trainer`` config (a tiny GRPO run on one
GPU, a tokenizer and model config made on the spot, no weights), the plugin installed and
``trainer.logger=[console,rlpulse]``, as far as verl gets without a GPU:

- The trainer is built by verl's own task runner: ``TaskRunnerV1.run`` of ``main_ppo.py``
  (the default, ``trainer.use_v1=true``) and the legacy ``TaskRunner.run`` of
  ``main_ppo_v0.py``, run in this process (the class under ``@ray.remote``, which Ray keeps
  in ``__ray_metadata__``) so that the trainer can be looked at. On a Ray cluster without
  GPUs both stop when they start the workers: ``ResourcePoolManager.create_resource_pool()``
  (``v1/trainer_base.py:231`` in ``PPOTrainer._setup``, ``ray_trainer.py:779`` in
  ``RayPPOTrainer.init_workers``) raises ``ValueError: Total available GPUs 0 is less than
  total desired GPUs 1`` (``single_controller/ray/base.py:240``). Declaring a GPU to Ray
  only moves the wall: the worker then fails in ``torch.distributed.init_process_group``
  (``utils/distributed.py:93``: "ProcessGroupNCCL is only supported with GPUs"), and
  rollout needs an inference server (vllm or sglang) after that.
- The test then calls the real ``fit()`` on that trainer. v1: first the one step of
  ``_setup()`` past the wall that ``fit()`` reads before its first step,
  ``_load_checkpoint()`` (for a fresh run it only sets ``global_steps = 0``), and
  TransferQueue is started again as ``TaskRunnerV1.run`` did (its ``finally`` closed it).
  v1 ``fit()`` builds the ``Tracking`` (``trainer_base.py:423``), starts step 1 and stops
  where verl hands the batch to the agent loop manager for generation
  (``_submit_batch_to_rollout``, ``trainer_base.py:1511``): ``fit()`` takes that manager as
  its argument, and the one given here records the batch and raises, as there is no LLM
  server to generate with. Legacy ``fit()`` builds the ``Tracking`` as a local variable
  (``ray_trainer.py:1419``) and stops at ``ray_trainer.py:1430``,
  ``self.checkpoint_manager.update_weights(...)``: ``AttributeError``, the checkpoint
  manager is built by ``init_workers()``. The legacy trainer has no ``global_steps`` yet
  when its ``Tracking`` is built (``fit()`` sets it on the next line), so the integration
  must not require one to bind the trainer.
- Who called ``Tracking(...)`` is observed with a profile hook (``sys.setprofile``); it
  changes nothing. Neither verl nor rlpulse is patched.
- No step of verl's ends on the CPU, so what the end of each step of ``fit()`` does,
  ``self.logger.log(data=metrics, step=self.global_steps)`` and then ``global_steps += 1``,
  is done by the test on the ``Tracking`` verl built, until the ``stop`` published before
  the run (to the real broker) has reached the trainer.
"""

from __future__ import annotations

import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import numpy as np
import pytest

from rlpulse.archive.catalog import query_archive
from rlpulse.local.archiver_process import ArchiverProcess
from rlpulse.ops.commands import action, operator_command, publish_command
from rlpulse.producers.integrations import verl as integration
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import CommandAck, TrainerEvent
from rlpulse.schemas.topics import Topics
from tests.integration.test_run_end import run_ends
from tests.integration.topic_reader import read_many_until, read_until
from tests.kafka import settings_at
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow]

WORDS = ["<pad>", "<eos>", "<unk>", "user", "assistant", ":", "what", "is", "one", "plus", "two"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)
PROMPTS = ["what is one plus one", "what is one plus two", "what is two plus two", "what is two"]
TRAIN_BATCH = 2
EPOCHS = 50
STEP_METRICS = {"actor/pg_loss": -0.25, "critic/score/mean": 0.5, "timing_s/step": 1.0}
GPU_WALL = "Total available GPUs 0 is less than total desired GPUs 1"


class NoRolloutEngineError(RuntimeError):
    """Raised where verl asks for rollouts: there is no LLM server on the CPU."""


class RolloutRequests:
    """The agent loop manager ``PPOTrainer.fit()`` takes; records what verl asks to generate."""

    def __init__(self) -> None:
        self.batches: list[Any] = []

    def generate_sequences(self, batch: Any) -> None:
        self.batches.append(batch)
        raise NoRolloutEngineError("no LLM server to generate rollouts with on the CPU")


@dataclass(frozen=True)
class TrackingBuilt:
    """One ``Tracking(...)`` construction: the object, the calling code and its ``self``."""

    tracking: Any
    caller: CodeType
    caller_self: Any


@contextmanager
def trackings_built() -> Iterator[list[TrackingBuilt]]:
    """Record every ``Tracking(...)`` built in this thread meanwhile, and who called it."""
    from verl.utils.tracking import Tracking

    init = Tracking.__init__.__code__
    built: list[TrackingBuilt] = []

    def observe(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code is init and frame.f_back is not None:
            caller = frame.f_back
            built.append(
                TrackingBuilt(frame.f_locals["self"], caller.f_code, caller.f_locals.get("self"))
            )

    previous = sys.getprofile()
    sys.setprofile(observe)
    try:
        yield built
    finally:
        sys.setprofile(previous)


@pytest.fixture(scope="module")
def verl_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tokenizer and model config (no weights) and train/val parquet files for verl."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config

    root = tmp_path_factory.mktemp("verl-inputs")
    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(root / "model")
    Qwen2Config(
        vocab_size=len(WORDS),
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        architectures=["Qwen2ForCausalLM"],
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=1,
    ).save_pretrained(root / "model")
    rows = [
        {
            "data_source": "tiny",
            "prompt": [{"role": "user", "content": prompt}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "two"},
            "extra_info": {"index": index},
        }
        for index, prompt in enumerate(PROMPTS)
    ]
    pq.write_table(pa.Table.from_pylist(rows), root / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:TRAIN_BATCH]), root / "val.parquet")
    return root


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """A Ray cluster of this machine's 2 CPUs and no GPU, started for these tests."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def verl_config(
    inputs: Path, run_dir: Path, run_id: str, bootstrap: str, topics: Topics, *, use_v1: bool
) -> Any:
    """verl's ``ppo_trainer`` config with these overrides, checked as ``main_ppo.main()`` does."""
    import verl
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    overrides = [
        f"actor_rollout_ref.model.path={inputs / 'model'}",
        f"critic.model.path={inputs / 'model'}",
        "algorithm.adv_estimator=grpo",
        f"data.train_files={inputs / 'train.parquet'}",
        f"data.val_files={inputs / 'val.parquet'}",
        f"data.train_batch_size={TRAIN_BATCH}",
        "data.max_prompt_length=16",
        "data.max_response_length=4",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={TRAIN_BATCH}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"trainer.total_epochs={EPOCHS}",
        "trainer.val_before_train=false",
        f"trainer.use_v1={str(use_v1).lower()}",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}",
        "trainer.project_name=rlpulse-tests",
        f"trainer.experiment_name={run_id}",
        f"trainer.logger=[console,{integration.BACKEND}]",
        f"+rlpulse.bootstrap='{bootstrap}'",
        f"+rlpulse.prefix={topics.prefix}",
        f"+rlpulse.settings.producer.spool_dir={run_dir / 'spool'}",
    ]
    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    auto_set_device(config)
    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )
    return config


def publish_stop(bootstrap: str, topics: Topics, run_id: str) -> str:
    """Publish a ``stop`` for ``run_id`` before its run starts; returns the command id."""
    command = operator_command(run_id, [action("stop")])
    publish_command(settings_at(bootstrap, topics), command)
    return command["command_id"]


def log_steps_until_stopped(tracking: Any, trainer: Any, first_step: int) -> int:
    """Do what the end of each step of verl's ``fit()`` does, until a stop reached the trainer.

    A step ends with ``self.logger.log(data=metrics, step=self.global_steps)`` and then
    ``global_steps += 1``. Returns the step whose log applied the stop.
    """
    planned = trainer.total_training_steps
    deadline = time.monotonic() + 60.0
    step = first_step
    while True:
        trainer.global_steps = step
        tracking.log(data=STEP_METRICS, step=step)
        if trainer.total_training_steps != planned:
            return step
        assert time.monotonic() < deadline, "the stop published before the run never applied"
        step += 1
        time.sleep(0.05)


def acks_for(bootstrap: str, topics: Topics, run_id: str) -> list[CommandAck]:
    return read_until(
        bootstrap,
        topics.acks,
        default_codec().decode_ack,
        lambda found: len(found) >= 1,
        keep=lambda ack: ack["run_id"] == run_id,
    )


def run_events(bootstrap: str, topics: Topics, run_id: str) -> list[TrainerEvent]:
    """The run's events up to its ``run_end``."""
    return read_until(
        bootstrap,
        topics.events,
        default_codec().decode_event,
        lambda found: any(event["kind"] == "run_end" for event in found),
        keep=lambda event: event["run_id"] == run_id,
    )


def undecorated(actor_class: Any) -> Any:
    """The class that ``@ray.remote`` made ``actor_class`` of (Ray keeps it in its metadata)."""
    return actor_class.__ray_metadata__.modified_class.__ray_actor_class__


def frame_local(tb: Any, code: CodeType, name: str) -> Any:
    """Variable ``name`` of the frame running ``code`` in traceback ``tb``."""
    frames = [frame for frame, _ in traceback.walk_tb(tb) if frame.f_code is code]
    assert frames, f"{code.co_name} is not in the traceback"
    return frames[-1].f_locals[name]


@pytest.mark.broker
def test_v1_trainer_fit_builds_the_tracking_that_commands_act_on(
    kafka_bootstrap: str,
    topics: Topics,
    ray_cluster: None,
    verl_inputs: Path,
    tmp_path: Path,
) -> None:
    import transfer_queue as tq
    from verl.trainer.main_ppo import TaskRunnerV1
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.utils.tracking import Tracking

    integration.install()
    run_id = f"verl-v1-{uuid.uuid4().hex[:8]}"
    stop_id = publish_stop(kafka_bootstrap, topics, run_id)
    config = verl_config(verl_inputs, tmp_path, run_id, kafka_bootstrap, topics, use_v1=True)

    runner = undecorated(TaskRunnerV1)()
    with pytest.raises(ValueError, match=GPU_WALL):
        runner.run(config)
    trainer = runner.trainer
    assert type(trainer) is PPOTrainerSync
    assert trainer.total_training_steps == len(PROMPTS) // TRAIN_BATCH * EPOCHS
    trainer._load_checkpoint()
    assert trainer.global_steps == 0

    rollouts = RolloutRequests()
    tq.init(config.transfer_queue)
    try:
        with trackings_built() as built, pytest.raises(NoRolloutEngineError):
            trainer.fit(rollouts)
    finally:
        tq.close()

    # fit() built one Tracking itself, kept it as trainer.logger, and ran into step 1.
    assert [(b.caller, b.caller_self) for b in built] == [(PPOTrainer.fit.__code__, trainer)]
    tracking = built[0].tracking
    assert isinstance(tracking, Tracking) and trainer.logger is tracking
    assert trainer.global_steps == 1
    assert [len(batch) for batch in rollouts.batches] == [TRAIN_BATCH]
    assert "raw_prompt" in rollouts.batches[0]
    # The rlpulse backend it built acts on that trainer, as verl's v1 trainer.
    backend = tracking.logger[integration.BACKEND]
    assert isinstance(backend, integration.RlpulseBackend)
    assert backend.actions is not None and backend.actions.trainer is trainer
    assert backend.actions.is_v1

    stopped_at = log_steps_until_stopped(tracking, trainer, first_step=trainer.global_steps)
    assert trainer.total_training_steps == stopped_at  # the v1 loop ends after this step
    tracking.finish(exit_code=0)  # what TaskRunnerV1.run does when fit() returns
    tracking.finish()  # and what Tracking.__del__ does later

    (ack,) = acks_for(kafka_bootstrap, topics, run_id)
    assert (ack["command_id"], ack["status"]) == (stop_id, "applied")
    assert ack["applied_at_step"] == stopped_at
    assert ack["detail"] == {"stop.status": "applied", "stop.last_step": str(stopped_at)}
    events = run_events(kafka_bootstrap, topics, run_id)
    assert (events[0]["kind"], events[0]["step"]) == ("run_start", 0)
    assert (events[-1]["kind"], events[-1]["step"]) == ("run_end", stopped_at)
    assert all(event["tags"] == {"framework": "verl"} for event in events)
    assert run_ends(kafka_bootstrap, topics, run_id) == [
        (0, 0, f"stopped by command {stop_id} (operator)")
    ]


@pytest.mark.broker
def test_legacy_trainer_fit_builds_the_tracking_that_commands_act_on(
    kafka_bootstrap: str,
    topics: Topics,
    ray_cluster: None,
    verl_inputs: Path,
    tmp_path: Path,
) -> None:
    from verl.trainer.main_ppo_v0 import TaskRunner
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.tracking import Tracking

    integration.install()
    run_id = f"verl-v0-{uuid.uuid4().hex[:8]}"
    stop_id = publish_stop(kafka_bootstrap, topics, run_id)
    config = verl_config(verl_inputs, tmp_path, run_id, kafka_bootstrap, topics, use_v1=False)

    runner_class = undecorated(TaskRunner)
    with pytest.raises(ValueError, match=GPU_WALL) as stopped:
        runner_class().run(config)
    trainer = frame_local(stopped.tb, runner_class.run.__code__, "trainer")
    del stopped
    assert type(trainer) is RayPPOTrainer
    assert trainer.total_training_steps == len(PROMPTS) // TRAIN_BATCH * EPOCHS

    with (
        trackings_built() as built,
        pytest.raises(AttributeError, match="'NoneType' object has no attribute 'update_weights'"),
    ):
        trainer.fit()

    # fit() built one Tracking itself (a local variable there), then set global_steps = 0.
    assert [(b.caller, b.caller_self) for b in built] == [(RayPPOTrainer.fit.__code__, trainer)]
    tracking = built[0].tracking
    assert isinstance(tracking, Tracking)
    assert trainer.global_steps == 0
    backend = tracking.logger[integration.BACKEND]
    assert isinstance(backend, integration.RlpulseBackend)
    assert backend.actions is not None and backend.actions.trainer is trainer
    assert not backend.actions.is_v1

    stopped_at = log_steps_until_stopped(tracking, trainer, first_step=1)
    assert trainer.total_training_steps == stopped_at
    # The legacy loop runs one more step, its last (is_last_step); the stop is acked there.
    trainer.global_steps = stopped_at + 1
    tracking.log(data=STEP_METRICS, step=stopped_at + 1)
    tracking.finish()  # what its __del__ does: the legacy fit() never calls finish()

    (ack,) = acks_for(kafka_bootstrap, topics, run_id)
    assert (ack["command_id"], ack["status"]) == (stop_id, "applied")
    assert ack["applied_at_step"] == stopped_at + 1
    assert ack["detail"] == {"stop.status": "applied", "stop.last_step": str(stopped_at + 1)}
    events = run_events(kafka_bootstrap, topics, run_id)
    assert (events[0]["kind"], events[0]["step"]) == ("run_start", 0)
    assert (events[-1]["kind"], events[-1]["step"]) == ("run_end", stopped_at + 1)
    assert run_ends(kafka_bootstrap, topics, run_id) == [
        (0, 0, f"stopped by command {stop_id} (operator)")
    ]


def agent_loop_fields(index: int, step: int) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """One sample as ``AgentLoopWorkerTQ._agent_loop_postprocess`` puts it into TransferQueue.

    Its key, fields and tags, with the advantages the trainer adds per token before
    ``_compute_metrics`` (GRPO: one value on every response token).
    """
    import torch
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    prompt, session = divmod(index, SESSIONS)
    response = RESPONSES[index % len(RESPONSES)]
    output = AgentLoopOutput(
        prompt_ids=[3, 5, 6, 7, 8 + prompt % 3],
        response_ids=response,
        response_mask=[1] * len(response),
        reward_score=float(index % 3) / 2,
        num_turns=2,
        metrics=AgentLoopMetrics(),
        extra_fields={
            "reward_extra_info": {"acc": float(index % 2), "pred": f"answer {index}"},
            "min_global_steps": step,
            "max_global_steps": step,
        },
    )
    uid = f"prompt-{prompt}"
    field = output.as_dict()
    field.update(
        {
            "uid": uid,
            "session_id": session,
            "data_source": "tiny" if prompt % 2 == 0 else "other",
            "reward_model": {"style": "rule", "ground_truth": "two"},
            "global_steps": step,
        }
    )
    field["loss_mask"] = field["response_mask"]
    field["advantages"] = torch.full((len(response),), 0.25 * (index - 2), dtype=torch.float32)
    field["token_level_rewards"] = field["rm_scores"]
    field["returns"] = field["advantages"].clone()
    prompt_len, response_len = field["prompts"].size(0), field["responses"].size(0)
    tags = {
        "status": "success",
        "prompt_len": prompt_len,
        "response_len": response_len,
        "seq_len": prompt_len + response_len,
        "global_steps": step,
        "min_global_steps": step,
        "max_global_steps": step,
    }
    return f"{uid}_{session}_0", field, tags


SESSIONS = 2
RESPONSES = [[9, 10, 1], [4, 4, 4, 4], [6, 7, 8, 9], [1]]
"""Token ids of the samples' responses: 4 tokens reach data.max_response_length (truncated)."""
SAMPLES = 6


def samples_of(bootstrap: str, topics: Topics, run_id: str, count: int) -> list[Any]:
    codec = default_codec()
    return read_many_until(
        bootstrap,
        topics.samples,
        codec.decode_samples,
        lambda found: len(found) >= count,
        keep=lambda sample: sample["run_id"] == run_id,
    )


def texts_of(bootstrap: str, topics: Topics, run_id: str) -> list[Any]:
    codec = default_codec()
    return read_many_until(
        bootstrap,
        topics.sample_texts,
        codec.decode_sample_texts,
        lambda found: len(found) > 0,
        keep=lambda text: text["run_id"] == run_id,
    )


@pytest.mark.broker
def test_v1_captures_each_sample_from_transfer_queue_before_fit_clears_it(
    kafka_bootstrap: str,
    topics: Topics,
    ray_cluster: None,
    verl_inputs: Path,
    tmp_path: Path,
) -> None:
    """``_compute_metrics`` over a real TransferQueue: the samples leave before ``kv_clear``."""
    import transfer_queue as tq
    from transfer_queue.metadata import KVBatchMeta
    from verl.trainer.main_ppo import TaskRunnerV1
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    integration.install()
    run_id = f"verl-v1-samples-{uuid.uuid4().hex[:8]}"
    config = verl_config(verl_inputs, tmp_path, run_id, kafka_bootstrap, topics, use_v1=True)
    runner = undecorated(TaskRunnerV1)()
    with pytest.raises(ValueError, match=GPU_WALL):
        runner.run(config)
    trainer = runner.trainer
    trainer._load_checkpoint()
    tq.init(config.transfer_queue)
    try:
        with pytest.raises(NoRolloutEngineError):
            trainer.fit(RolloutRequests())
        step = trainer.global_steps
        keys, fields, tags = zip(*(agent_loop_fields(i, step) for i in range(SAMPLES)), strict=True)
        tq.kv_batch_put(
            keys=list(keys),
            fields=list_of_dict_to_tensordict(list(fields)),
            tags=list(tags),
            partition_id="train",
        )
        batch = KVBatchMeta(keys=list(keys), tags=list(tags), partition_id="train")
        batch = upsample_batch_to_divisible_size(batch, 4, trainer.tokenizer.eos_token_id)
        assert len(batch) == 8 and sum(t.get("is_padding", False) for t in batch.tags) == 2
        metrics: dict[str, Any] = {}
        trainer._compute_metrics(batch, metrics, {"step": 1.0}, global_steps=step, epoch=0)
        tq.kv_clear(keys=batch.keys, partition_id=batch.partition_id)  # fit()'s next line
        # Validation: verl decodes every validation sample itself; the capture takes those
        # texts and what _val_metrics_update gets.
        inputs = [f"what is {i} plus one" for i in range(4)]
        outputs = ["two", "three " * 5, "", "four"]
        trainer._maybe_log_val_generations(
            inputs=inputs, outputs=outputs, scores=[1.0, 0.0, 0.0, 1.0]
        )
        trainer._val_metrics_update(
            np.array(["tiny", "tiny", "other", "other"], dtype=object),
            ["v0", "v0", "v1", "v1"],
            {"reward": [1.0, 0.0, 0.0, 1.0], "acc": [1.0, 0.0, 0.0, 1.0]},
            [],
        )
        trainer.logger.finish()
    finally:
        tq.close()
    every = samples_of(kafka_bootstrap, topics, run_id, SAMPLES + 4)
    samples = sorted((s for s in every if s["split"] == "train"), key=lambda s: s["sample_index"])
    assert [s["sample_index"] for s in samples] == list(range(SAMPLES))  # no padding row
    assert {s["step"] for s in samples} == {step}
    assert [s["reward"] for s in samples] == [float(i % 3) / 2 for i in range(SAMPLES)]
    assert [s["advantage"] for s in samples] == pytest.approx(
        [0.25 * (i - 2) for i in range(SAMPLES)]
    )
    assert [s["response_length"] for s in samples] == [
        len(RESPONSES[i % len(RESPONSES)]) for i in range(SAMPLES)
    ]
    assert [s["truncated"] for s in samples] == [
        len(RESPONSES[i % len(RESPONSES)]) >= 4 for i in range(SAMPLES)
    ]
    assert all(s["prompt_length"] == 5 and s["num_turns"] == 2 for s in samples)
    assert [s["group"] for s in samples] == [f"prompt-{i // SESSIONS}" for i in range(SAMPLES)]
    assert [s["scores"] for s in samples] == [{"acc": float(i % 2)} for i in range(SAMPLES)]
    assert all(s["dropped_scores"] == ["pred"] for s in samples)
    assert {s["data_source"] for s in samples} == {"tiny", "other"}
    texts = [t for t in texts_of(kafka_bootstrap, topics, run_id) if t["split"] == "train"]
    assert {t["sample_index"] for t in texts} <= set(range(SAMPLES))
    best = max(texts, key=lambda t: t["reward"])
    assert "best" in best["chosen"] and best["response_head"]
    assert all(t["ground_truth"] == "two" for t in texts)
    events = run_events(kafka_bootstrap, topics, run_id)
    (statistics,) = [e for e in events if e["stage"] == "samples"]
    assert statistics["metrics"]["samples/count"] == SAMPLES
    assert statistics["metrics"]["samples/truncated_ratio"] == pytest.approx(
        sum(len(RESPONSES[i % len(RESPONSES)]) >= 4 for i in range(SAMPLES)) / SAMPLES
    )
    (validation,) = [e for e in events if e["stage"] == "validation_samples"]
    assert validation["metrics"]["samples/count"] == 4
    assert validation["metrics"]["samples/empty_ratio"] == 0.25
    checked = [s for s in every if s["split"] == "validation"]
    assert sorted((s["sample_index"], s["reward"], s["group"]) for s in checked) == [
        (0, 1.0, "v0"), (1, 0.0, "v0"), (2, 0.0, "v1"), (3, 1.0, "v1"),
    ]  # fmt: skip
    assert all(s["scores"] == {"acc": s["reward"]} for s in checked)
    archive = tmp_path / "archive"
    archiver = ArchiverProcess(
        kafka_bootstrap, topics.prefix, archive, tmp_path / "archiver.log",
        {"archive.roll_s": 1, "archive.audit": "false"},
    ).start()  # fmt: skip
    try:
        wait_for(
            lambda: _archived(archive, topics, run_id) == SAMPLES + 4,
            "every sample in the archive",
            timeout_s=120.0,
            every_s=0.5,
        )
    finally:
        archiver.stop()
    audit = subprocess.run(
        [sys.executable, "-m", "rlpulse", "audit", "--run", run_id, "--archive", str(archive),
         "--prefix", topics.prefix],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert " 0 lost, 0 duplicates" in " ".join(audit.stdout.split()), audit.stdout


def _archived(root: Path, topics: Topics, run_id: str) -> int:
    if not root.exists():
        return -1
    _, rows = query_archive(
        str(root), topics, "SELECT count(*) FROM samples WHERE run_id = ?", [run_id]
    )
    return int(rows[0][0])


@pytest.mark.broker
def test_legacy_trainer_captures_each_sample_from_the_step_s_dataproto(
    kafka_bootstrap: str,
    topics: Topics,
    ray_cluster: None,
    verl_inputs: Path,
    tmp_path: Path,
) -> None:
    """``compute_data_metrics(batch=...)``, called as the legacy ``fit()`` calls it."""
    import torch
    from verl import DataProto
    from verl.trainer.main_ppo_v0 import TaskRunner
    from verl.trainer.ppo import ray_trainer

    integration.install()
    run_id = f"verl-v0-samples-{uuid.uuid4().hex[:8]}"
    config = verl_config(verl_inputs, tmp_path, run_id, kafka_bootstrap, topics, use_v1=False)
    runner_class = undecorated(TaskRunner)
    with pytest.raises(ValueError, match=GPU_WALL) as stopped:
        runner_class().run(config)
    trainer = frame_local(stopped.tb, runner_class.run.__code__, "trainer")
    del stopped
    with trackings_built() as built, pytest.raises(AttributeError, match="update_weights"):
        trainer.fit()
    tracking = built[0].tracking
    trainer.global_steps = 3
    # The step's batch as fit() holds it there: left-padded prompts, right-padded responses.
    lengths = [len(RESPONSES[i % len(RESPONSES)]) for i in range(SAMPLES)]
    width, prompt_width = 4, 6
    responses = torch.zeros((SAMPLES, width), dtype=torch.int64)
    mask = torch.zeros((SAMPLES, width), dtype=torch.int64)
    scores = torch.zeros((SAMPLES, width))
    for row, length in enumerate(lengths):
        responses[row, :length] = torch.tensor(RESPONSES[row % len(RESPONSES)])
        mask[row, :length] = 1
        scores[row, length - 1] = float(row % 3) / 2
    prompts = torch.zeros((SAMPLES, prompt_width), dtype=torch.int64)
    prompts[:, 1:] = torch.tensor([3, 5, 6, 7, 8])
    attention = torch.cat([(prompts != 0).long(), mask], dim=1)
    advantages = torch.arange(SAMPLES, dtype=torch.float32)[:, None].expand(-1, width) * mask
    batch = DataProto.from_single_dict(
        {
            "prompts": prompts,
            "responses": responses,
            "response_mask": mask,
            "attention_mask": attention,
            "token_level_scores": scores,
            "token_level_rewards": scores,
            "advantages": advantages,
            "returns": advantages,
            "uid": np.array([f"prompt-{i // SESSIONS}" for i in range(SAMPLES)], dtype=object),
            "data_source": np.array(["tiny"] * SAMPLES, dtype=object),
            "reward_model": np.array([{"ground_truth": "two"}] * SAMPLES, dtype=object),
            "acc": np.array([float(i % 2) for i in range(SAMPLES)], dtype=object),
            "__num_turns__": np.array([2] * SAMPLES, dtype=np.int32),
        }
    )
    ray_trainer.compute_data_metrics(batch=batch, use_critic=False)  # as fit() calls it
    tracking.finish()
    samples = sorted(
        samples_of(kafka_bootstrap, topics, run_id, SAMPLES), key=lambda s: s["sample_index"]
    )
    assert [s["step"] for s in samples] == [3] * SAMPLES
    assert [s["reward"] for s in samples] == [float(i % 3) / 2 for i in range(SAMPLES)]
    assert [s["advantage"] for s in samples] == [float(i) for i in range(SAMPLES)]
    assert [s["response_length"] for s in samples] == lengths
    assert [s["prompt_length"] for s in samples] == [5] * SAMPLES
    assert [s["truncated"] for s in samples] == [length >= 4 for length in lengths]
    assert [s["scores"] for s in samples] == [{"acc": float(i % 2)} for i in range(SAMPLES)]
    texts = texts_of(kafka_bootstrap, topics, run_id)
    best = max(texts, key=lambda t: t["reward"])
    assert best["ground_truth"] == "two" and best["response_head"] and "best" in best["chosen"]
