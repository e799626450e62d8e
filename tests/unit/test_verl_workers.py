"""verl_workers without a broker: a rank's reduction, names, the context, the import hook."""

from __future__ import annotations

import importlib
import logging
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from verl import DataProto
from verl.utils import tensordict_utils as tu
from verl.utils.metric.utils import AggregationType, Metric, reduce_metrics

from rlpulse.producers.integrations import verl_workers
from rlpulse.producers.integrations.after_import import when_imported
from rlpulse.producers.integrations.verl_workers import (
    CONTEXT_KEY,
    RunContext,
    driver_names,
    rank_values,
    reduce_rank,
    take_context,
)


def metric(aggregation: AggregationType, values: list[float]) -> Metric:
    found = Metric(aggregation)
    found.extend(values)
    return found


def test_a_rank_is_reduced_as_verl_reduces_the_gathered_lists() -> None:
    minibatches = [
        {
            "actor/pg_clipfrac": metric(AggregationType.MEAN, [0.25, 0.5]),
            "actor/pg_loss": metric(AggregationType.SUM, [0.125, 0.25]),
            "kl_coef": [0.001, 0.001],
            "perf/max_memory_allocated_gb": 3.0 + i,
            "note": "not a number",
        }
        for i in range(2)
    ]
    collected: dict[str, list[float]] = {}
    for m in minibatches:
        rank_values(m, collected)
    reduced = reduce_rank(collected)
    # verl's driver, had this been the only rank: aggregate_dp per mini-batch, reduce_metrics.
    single = {
        "actor/pg_clipfrac": [Metric.aggregate_dp([m["actor/pg_clipfrac"]]) for m in minibatches],
        "actor/pg_loss": [Metric.aggregate_dp([m["actor/pg_loss"]]) for m in minibatches],
        "kl_coef": [v for m in minibatches for v in m["kl_coef"]],
        "perf/max_memory_allocated_gb": [m["perf/max_memory_allocated_gb"] for m in minibatches],
    }
    assert reduced == pytest.approx(
        {k: float(v) for k, v in reduce_metrics(single).items()}, rel=1e-12
    )
    assert reduced["perf/max_memory_allocated_gb"] == 4.0  # "max" in the name: the max


def test_names_are_the_drivers() -> None:
    named = driver_names({"actor/pg_loss": 1.0, "loss": 2.0, "mfu": 0.5}, "actor")
    assert named == {"actor/pg_loss": 1.0, "actor/loss": 2.0, "perf/mfu/actor": 0.5}
    assert driver_names({"critic/vf_loss": 1.0, "grad_norm": 3.0}, "critic") == {
        "critic/vf_loss": 1.0,
        "critic/grad_norm": 3.0,
    }


def test_the_context_travels_in_a_batch_and_is_taken_out() -> None:
    context = RunContext("run-a", 2, 17, {"prefix": "p", "producer": {"linger_ms": 1}})
    assert RunContext.from_value(context.to_value()) == context
    assert RunContext.from_value({"run_id": "x"}) is None
    assert RunContext.from_value(None) is None

    batch = DataProto.from_single_dict({"x": torch.zeros(4, 1)})
    batch.meta_info[CONTEXT_KEY] = context.to_value()
    tensors = batch.to_tensordict()  # what the legacy driver hands the workers
    assert take_context(tensors) == context
    assert CONTEXT_KEY not in tensors
    assert take_context(tensors) is None
    assert take_context(batch) == context  # a DataProto (meta_info)
    assert CONTEXT_KEY not in batch.meta_info
    plain = tu.get_tensordict(tensor_dict={"x": torch.zeros(2)})
    assert take_context(plain) is None


def test_the_driver_hook_sends_a_bound_trainers_step_only_during_the_call() -> None:
    seen: list[Any] = []

    def update(trainer: Any, batch: DataProto) -> str:
        seen.append(dict(batch.meta_info))
        return "verl's result"

    class Trainer:
        global_steps = 5

    hooked = verl_workers._with_context(update, lambda batch: batch.meta_info)
    trainer, batch = Trainer(), DataProto(meta_info={})
    assert hooked(trainer, batch) == "verl's result"
    assert seen[-1] == {}  # not bound: nothing sent
    verl_workers.bind_trainer(trainer, "run-b", 1, {"prefix": "q"})
    assert hooked(trainer, batch) == "verl's result"
    assert RunContext.from_value(seen[-1][CONTEXT_KEY]) == RunContext(
        "run-b", 1, 5, {"prefix": "q"}
    )
    assert CONTEXT_KEY not in batch.meta_info
    verl_workers.unbind_trainer(trainer)


def test_trouble_in_the_driver_hook_never_reaches_verl(caplog: pytest.LogCaptureFixture) -> None:
    class Trainer:
        global_steps = 1

    def broken_holder(batch: object) -> dict[str, object]:
        raise RuntimeError("no meta_info here")

    trainer = Trainer()
    verl_workers.bind_trainer(trainer, "run-c", 0)
    hooked = verl_workers._with_context(lambda _t, batch: batch, broken_holder)
    before = verl_workers.failures.get("passing the step to the workers", 0)
    with caplog.at_level(logging.WARNING):
        assert hooked(trainer, "the batch") == "the batch"
        assert hooked(trainer, "the batch") == "the batch"
    assert verl_workers.failures["passing the step to the workers"] == before + 2
    verl_workers.unbind_trainer(trainer)


def test_a_patch_runs_when_its_module_is_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"rlpulse_probe_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls: list[str] = []

    def patch(module: Any) -> None:
        calls.append("patched")
        module.VALUE = 2

    def broken(module: Any) -> None:
        raise ValueError("a broken patch")

    when_imported(name, patch)
    when_imported(name, broken)
    assert calls == []
    with caplog.at_level(logging.WARNING):
        module = importlib.import_module(name)
    assert (module.VALUE, calls) == (2, ["patched"])
    assert any("could not patch" in r.getMessage() for r in caplog.records)
    when_imported(name, patch)  # already imported: at once
    assert calls == ["patched", "patched"]
    sys.modules.pop(name, None)


def test_the_plugin_hooks_verls_workers_and_trainers() -> None:
    from verl.trainer.ppo import ray_trainer
    from verl.trainer.ppo.v1 import trainer_base
    from verl.workers import engine_workers

    import rlpulse.producers.integrations.verl_plugin  # noqa: F401 -- what verl imports

    for hooked in (
        engine_workers.TrainingWorker.train_mini_batch,
        ray_trainer.RayPPOTrainer._update_actor,
        ray_trainer.RayPPOTrainer._update_critic,
        trainer_base.PPOTrainer._update_actor,
        trainer_base.PPOTrainer._update_critic,
    ):
        assert getattr(hooked, "_rlpulse", False), hooked
    # verl's dispatch registration survives the wrapping (Ray worker groups find it by it).
    from verl.single_controller.base.decorator import MAGIC_ATTR

    assert hasattr(engine_workers.TrainingWorker.train_mini_batch, MAGIC_ATTR)


def test_the_driver_binds_its_trainer_unless_rank_metrics_are_off(tmp_path: Path) -> None:
    from rlpulse.producers import RunLink
    from rlpulse.producers.caller.logging_handler import EventHandler
    from rlpulse.producers.integrations.verl import VerlSettings
    from rlpulse.settings import ProducerSettings, Settings

    class Trainer:
        global_steps = 3

    block = VerlSettings.from_verl_config({"rlpulse": {"prefix": "p", "rank_metrics": False}})
    assert block.overrides() == {"prefix": "p"}
    assert VerlSettings().rank_metrics is True
    link = RunLink(
        "run-d", settings=Settings(producer=ProducerSettings(spool_dir=tmp_path))
    )  # no I/O yet
    root = logging.getLogger()
    for rank_metrics, bound in ((False, None), (True, RunContext("run-d", 0, 3, {"prefix": "p"}))):
        trainer = Trainer()
        verl_workers.driver_started(trainer, link, block.overrides(), rank_metrics=rank_metrics)
        handlers = [h for h in root.handlers if isinstance(h, EventHandler) and h.sink is link]
        assert len(handlers) == 1 and handlers[0].stage == "driver"
        assert verl_workers.context_of(trainer) == bound
        verl_workers.driver_finished(trainer, link)
        assert not [h for h in root.handlers if getattr(h, "sink", None) is link]
        assert verl_workers.context_of(trainer) is None
    link.close()
