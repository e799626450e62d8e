"""Per-rank metrics and log records from inside verl 0.9.1's workers.

verl's driver sees each update's metrics only after its workers averaged them across
data-parallel ranks (``TrainingWorker._postprocess_output`` gathers them with
``allgather_dict_into_dict``, ``train_mini_batch`` averages the ranks' values). This
module hooks both, in every worker process, and publishes from each data-parallel rank
its own values of the step: one event per rank per update, stage ``<role>_dp``
(``actor_dp``, ``critic_dp``), ``world_size`` the data-parallel size, tags
``{"role": <role>, "framework": "verl"}``, metric names as the driver shows them
(``actor/pg_loss``, ``actor/grad_norm``, ``critic/vf_loss``, ``perf/mfu/actor``...).
Each rank's value is reduced over its micro- and mini-batches the way the driver reduces
the gathered lists (verl's ``reduce_metrics``: the mean, or the max/min of names saying
so), so the mean of the ranks' values is the driver's number for mean-type metrics.

Which run, which step: the driver's trainer (legacy ``RayPPOTrainer`` and v1
``PPOTrainer``) puts a :class:`RunContext` into each update's batch
(``meta_info``/``extra_info`` key :data:`CONTEXT_KEY`) once its ``Tracking`` built the
``rlpulse`` backend (:func:`bind_trainer`); the worker takes it out of the batch before
verl's code sees the batch. Worker processes cannot learn the run otherwise: Ray starts
them before the driver's ``fit()`` builds its ``Tracking``, and they keep the environment
they started with. The context holds the run id, its attempt, the step and the rlpulse
settings of the verl config's ``rlpulse`` block (never secrets: those come only from the
environment, which each process reads itself). A rank publishes through one
:class:`~rlpulse.producers.caller.logger.EventLogger` per (run, attempt, role) in its process,
built with the first update (no network before), closed at exit; with it, rlpulse's
logging handler is attached to the process's root logger, so verl's own records and the
user's go to ``<prefix>.logs`` with run, rank, role, host and pid from then on (and, with
``logging.log_dir``, to ``verl_<role>_rank<N>.jsonl``). The driver's records go there too,
through the backend's link, from the ``Tracking``'s creation on.

Workers that never run ``train_mini_batch`` (rollout, reference, reward) have no per-rank
metrics there and never learn the run, so they publish nothing, records included.

Nothing here may break training: an exception in rlpulse's part of a hook is counted in
:data:`failures`, logged once, and verl's result is returned unchanged.
``+rlpulse.rank_metrics=false`` on verl's command line turns per-rank publication off (the
driver sends no context).
"""

from __future__ import annotations

import atexit
import copy
import functools
import logging
import operator
import threading
import weakref
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from rlpulse.producers.caller.logger import EventLogger
from rlpulse.producers.caller.logging_handler import EventHandler
from rlpulse.producers.integrations.after_import import when_imported
from rlpulse.schemas.validation import metric_number
from rlpulse.settings import load_settings

log = logging.getLogger(__name__)

CONTEXT_KEY = "rlpulse"
"""The key of the :class:`RunContext` in an update's batch (non-tensor data)."""
WORKERS_MODULE = "verl.workers.engine_workers"
TRAINER_MODULES = ("verl.trainer.ppo.ray_trainer", "verl.trainer.ppo.v1.trainer_base")
_COLLECTING = "_rlpulse_minibatches"
_ROLE_OF_MODEL = {"value_model": "critic"}

failures: dict[str, int] = {}
"""Exceptions rlpulse's part of a hook raised (and swallowed), by where."""


@dataclass(frozen=True)
class RunContext:
    """What a worker needs to publish one update: the run, its attempt, the driver's step."""

    run_id: str
    attempt: int
    step: int
    settings: dict[str, Any] = field(default_factory=dict)
    """Settings overrides (dotted or nested names) from the verl config's ``rlpulse`` block."""

    def to_value(self) -> dict[str, Any]:
        """The plain dict that travels in the batch."""
        return {
            "run_id": self.run_id,
            "attempt": self.attempt,
            "step": self.step,
            "settings": dict(self.settings),
        }

    @classmethod
    def from_value(cls, value: object) -> RunContext | None:
        """The context a batch carried (``to_value``'s dict, maybe wrapped), else None."""
        value = getattr(value, "data", value)  # tensordict's NonTensorData
        if not isinstance(value, Mapping):
            return None
        run_id, attempt, step = value.get("run_id"), value.get("attempt"), value.get("step")
        if not isinstance(run_id, str) or not isinstance(attempt, int):
            return None
        if not isinstance(step, int):
            return None
        settings = value.get("settings") or {}
        return cls(run_id, attempt, step, dict(settings) if isinstance(settings, Mapping) else {})


def _failed(where: str) -> None:
    """Count and (the first time for ``where``) log the exception being handled."""
    failures[where] = failures.get(where, 0) + 1
    if failures[where] == 1:
        log.warning(
            "rlpulse: %s failed; training goes on without this update's per-rank metrics "
            "(later failures are counted in verl_workers.failures, not logged)",
            where,
            exc_info=True,
        )


# -- the driver: which run a trainer's updates belong to -------------------------------------


@dataclass
class _Binding:
    run_id: str
    attempt: int
    settings: dict[str, Any]


_bindings: weakref.WeakKeyDictionary[Any, _Binding] = weakref.WeakKeyDictionary()


def bind_trainer(
    trainer: Any, run_id: str, attempt: int, settings: Mapping[str, Any] | None = None
) -> None:
    """Make ``trainer``'s updates carry a :class:`RunContext` of this run to the workers."""
    _bindings[trainer] = _Binding(run_id, attempt, dict(settings or {}))


def unbind_trainer(trainer: Any) -> None:
    """Stop sending ``trainer``'s run to the workers (its run ended)."""
    _bindings.pop(trainer, None)


def context_of(trainer: Any) -> RunContext | None:
    """The context of ``trainer``'s current step (``global_steps``), if it is bound."""
    binding = _bindings.get(trainer)
    if binding is None:
        return None
    step = int(getattr(trainer, "global_steps", 0) or 0)
    return RunContext(binding.run_id, binding.attempt, step, binding.settings)


def _with_context(original: Callable[..., Any], holder: Callable[[Any], Any]) -> Callable[..., Any]:
    """``trainer._update_actor``/``_update_critic`` that put the context into the batch."""

    @functools.wraps(original)
    def update(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        slot = None
        try:
            context = context_of(self)
            if context is not None:
                slot = holder(batch)
                slot[CONTEXT_KEY] = context.to_value()
        except Exception:
            _failed("passing the step to the workers")
            slot = None
        try:
            return original(self, batch, *args, **kwargs)
        finally:
            if slot is not None:
                slot.pop(CONTEXT_KEY, None)

    update._rlpulse = True  # type: ignore[attr-defined]
    return update


def _patch_trainer(class_name: str, holder: str, module: ModuleType) -> None:
    """Make ``module.<class_name>``'s updates put the context into their batch's ``holder``."""
    trainer = getattr(module, class_name)
    for name in ("_update_actor", "_update_critic"):
        original = getattr(trainer, name)
        if not getattr(original, "_rlpulse", False):
            setattr(trainer, name, _with_context(original, operator.attrgetter(holder)))


# -- the workers: each rank's values, published from its process -----------------------------


def take_context(data: Any) -> RunContext | None:
    """Remove the :class:`RunContext` from an update's batch (TensorDict, DataProto, meta)."""
    for holder in ("extra_info", "meta_info"):  # KVBatchMeta/BatchMeta, DataProto
        found = getattr(data, holder, None)
        if isinstance(found, dict):
            return RunContext.from_value(found.pop(CONTEXT_KEY, None))
    keys = getattr(data, "keys", None)
    if keys is None or CONTEXT_KEY not in keys():
        return None
    from verl.utils import tensordict_utils as tu

    return RunContext.from_value(tu.pop(data, key=CONTEXT_KEY, default=None))


def _number(value: object) -> float | None:
    """``metric_number(value)``, with a fast path for the floats verl hands over."""
    if isinstance(value, float | int) and not isinstance(value, bool):
        return float(value)
    return metric_number(value)


def _numbers(items: Any) -> list[float]:
    """The numbers among ``items`` as floats (verl's are floats already: the fast path)."""
    try:
        return list(map(float, items))
    except (TypeError, ValueError, RuntimeError):
        return [n for n in map(_number, items) if n is not None]


def _mean(items: list[float]) -> float:
    return sum(items) / len(items)


_REDUCERS: dict[str, Callable[[list[float]], float]] = {
    "mean": _mean,
    "sum": sum,
    "min": min,
    "max": max,
}
_reducer_of: dict[object, Callable[[list[float]], float] | None] = {}
"""Per ``Metric.aggregation`` value seen, its reducer (None: ask ``Metric.aggregate``)."""
_metric_types: dict[type, bool] = {}
"""Per type seen in a metrics dict, whether it is a verl ``Metric`` (duck-typed)."""


def _aggregate(metric: Any) -> float | None:
    """A verl ``Metric``'s ``aggregate()`` (mean, sum, min or max), without numpy's overhead."""
    items = _numbers(metric.values)
    if not items:
        return None
    aggregation = metric.aggregation
    try:
        reducer = _reducer_of[aggregation]
    except KeyError:
        reducer = _REDUCERS.get(str(getattr(aggregation, "value", aggregation)))
        _reducer_of[aggregation] = reducer
    except TypeError:  # an unhashable aggregation: verl's own answer
        reducer = None
    if reducer is None:
        return _number(metric.aggregate())
    return reducer(items)


def _is_metric(kind: type) -> bool:
    found = _metric_types.get(kind)
    if found is None:
        found = hasattr(kind, "aggregate") and hasattr(kind, "aggregate_dp")
        _metric_types[kind] = found
    return found


def rank_values(
    metrics: Mapping[str, Any], into: dict[str, list[float]] | None = None
) -> dict[str, list[float]]:
    """One rank's values of one mini-batch, before verl gathers them across ranks.

    ``metrics`` is what ``_postprocess_output`` receives: per name a verl ``Metric`` (its
    micro-batches, reduced by its own aggregation, as ``Metric.aggregate_dp`` does for a
    single rank), a list of micro-batch values (kept, as the driver keeps them) or a number.
    The values are appended to ``into`` (the update's values so far), which is returned.
    """
    values: dict[str, list[float]] = {} if into is None else into
    for name, value in metrics.items():
        kind = type(value)
        if kind is float:
            found: float | None = value
        elif kind is list or kind is tuple:
            items = _numbers(value)
            if items:
                values.setdefault(name, []).extend(items)
            continue
        elif _is_metric(kind):
            found = _aggregate(value)
        else:
            found = _number(value)
        if found is not None:
            values.setdefault(name, []).append(found)
    return values


def reduce_rank(collected: Mapping[str, list[float]]) -> dict[str, float]:
    """A rank's values of one update (its mini-batches' values by name), as verl reduces them.

    verl's ``reduce_metrics``: the max of names saying ``max``, the min of those saying
    ``min``, else the mean.
    """
    reduced: dict[str, float] = {}
    for name, items in collected.items():
        if "max" in name:
            reduced[name] = max(items)
        elif "min" in name:
            reduced[name] = min(items)
        else:
            reduced[name] = sum(items) / len(items)
    return reduced


def driver_names(metrics: Mapping[str, float], role: str) -> dict[str, float]:
    """Names as the driver shows them: ``<role>/`` in front (verl's ``rename_dict``), mfu moved."""
    prefix = f"{role}/"
    named = {name if name.startswith(prefix) else prefix + name: v for name, v in metrics.items()}
    if prefix + "mfu" in named:
        named[f"perf/mfu/{role}"] = named.pop(prefix + "mfu")
    return named


def role_of(worker: Any) -> str:
    """``critic`` for a value-model TrainingWorker, else ``actor``."""
    model_type = getattr(getattr(worker, "config", None), "model_type", "language_model")
    return _ROLE_OF_MODEL.get(str(model_type), "actor")


class RankPublisher:
    """One process's publication: an EventLogger per (run, attempt, role), built lazily.

    The first logger also gets rlpulse's logging handler on the root logger, so this
    process's log records go to the run's ``.logs`` topic (and its local file).
    """

    def __init__(self) -> None:
        self._loggers: dict[tuple[str, int, str], EventLogger] = {}
        self._lock = threading.Lock()
        self._closes_at_exit = False
        self.handler: EventHandler | None = None

    def logger(self, context: RunContext, role: str, rank: int, world_size: int) -> EventLogger:
        """The logger of this run attempt and role (built on first use)."""
        key = (context.run_id, context.attempt, role)
        with self._lock:
            found = self._loggers.get(key)
            if found is not None:
                return found
            given = copy.deepcopy(context.settings)  # nest() fills nested dicts in place
            given["logging.component"] = f"verl_{role}"
            settings = load_settings(given)
            found = EventLogger(
                context.run_id,
                rank=rank,
                world_size=world_size,
                attempt=context.attempt,
                tags={"role": role, "framework": "verl"},
                settings=settings,
            )
            self._loggers[key] = found
            if self.handler is None:
                self.handler = attach_log_handler(found, stage=f"{role}_dp")
            return found

    def publish(
        self, context: RunContext, role: str, rank: int, world_size: int, values: dict[str, float]
    ) -> None:
        """Publish one rank's values of the driver's step ``context.step``."""
        events = self.logger(context, role, rank, world_size)
        events.log(values, context.step, f"{role}_dp", world_size=world_size)
        if not self._closes_at_exit:
            # After the logger's own exit hook (the first event registered it): at exit,
            # ours runs first, so no record reaches a closed logger.
            atexit.register(self.close)
            self._closes_at_exit = True

    def close(self) -> None:
        """Detach the handler and close every logger (flushing what is queued)."""
        if self.handler is not None:
            logging.getLogger().removeHandler(self.handler)
            self.handler = None
        with self._lock:
            loggers, self._loggers = list(self._loggers.values()), {}
        for events in loggers:
            events.close()


publisher = RankPublisher()
"""This process's publisher."""


def attach_log_handler(sink: Any, *, stage: str) -> EventHandler:
    """Put rlpulse's handler on the root logger (level and sampling from the sink's settings).

    The loggers' own levels still decide what reaches it (verl's: ``VERL_LOGGING_LEVEL``).
    """
    handler = EventHandler(sink, stage=stage)
    logging.getLogger().addHandler(handler)
    return handler


def _collect(
    worker: Any, output: Mapping[str, Any], into: dict[str, list[float]]
) -> frozenset[str] | None:
    """Add a rank's values of a mini-batch (``output`` as ``_postprocess_output`` gets it).

    Returns the names read (None on a rank that does not publish).
    """
    if not worker.engine.is_mp_src_rank_with_outputs():
        return None
    metrics = output.get("metrics") or {}
    rank_values(metrics, into)
    losses = _numbers(output.get("loss") or [])
    if losses:
        into.setdefault("loss", []).append(sum(losses))  # this rank's share, before the all-reduce
    return frozenset(metrics).union(("loss",))


def _metrics_of(result: Any) -> object:
    """The ``metrics`` dict of ``_postprocess_output``'s TensorDict (None when it has none)."""
    found = result.get("metrics", None)
    if found is None:
        return None
    # A tensorclass's attribute access costs ~4 us; NonTensorData keeps its value here.
    held = getattr(found, "__dict__", {}).get("_non_tensordict")
    if isinstance(held, dict) and "data" in held:
        return held["data"]
    return getattr(found, "data", found)


def add_ungathered(values: dict[str, list[float]], result: Any, read: Collection[str] = ()) -> None:
    """Add what ``_postprocess_output`` computed per rank or globally (perf/..., mfu).

    ``result`` is its output TensorDict; names in ``read`` (those the mini-batch's metrics
    held, gathered across ranks in ``result``) are left out.
    """
    final = _metrics_of(result) if result is not None else None
    if not isinstance(final, Mapping):
        return
    for name, value in final.items():
        if name not in read:
            found = value if type(value) is float else _number(value)
            if found is not None:
                values.setdefault(name, []).append(found)


def _patch_workers(module: ModuleType) -> None:
    worker_cls = module.TrainingWorker
    if getattr(worker_cls.train_mini_batch, "_rlpulse", False):
        return
    original_post = worker_cls._postprocess_output
    original_train = worker_cls.train_mini_batch

    @functools.wraps(original_post)
    def _postprocess_output(self: Any, output: Any, *args: Any, **kwargs: Any) -> Any:
        collecting = getattr(self, _COLLECTING, None)
        read = None
        if collecting is not None and not kwargs.get("forward_only", False):
            try:
                read = _collect(self, output, collecting)
            except Exception:
                _failed("reading a rank's metrics")
        result = original_post(self, output, *args, **kwargs)
        if read is not None and collecting is not None:
            try:
                add_ungathered(collecting, result, read)
            except Exception:
                _failed("reading a rank's metrics")
        return result

    @functools.wraps(original_train)
    def train_mini_batch(self: Any, *args: Any, **kwargs: Any) -> Any:
        context = None
        try:
            context = take_context(args[0] if args else kwargs.get("data"))
        except Exception:
            _failed("reading the driver's step")
        if context is None:
            return original_train(self, *args, **kwargs)
        collected: dict[str, list[float]] = {}
        setattr(self, _COLLECTING, collected)
        try:
            result = original_train(self, *args, **kwargs)
        finally:
            setattr(self, _COLLECTING, None)
        if collected:
            try:
                role = role_of(self)
                values = driver_names(reduce_rank(collected), role)
                engine = self.engine
                publisher.publish(
                    context,
                    role,
                    engine.get_data_parallel_rank(),
                    engine.get_data_parallel_size(),
                    values,
                )
            except Exception:
                _failed("publishing a rank's metrics")
        return result

    train_mini_batch._rlpulse = True  # type: ignore[attr-defined]
    worker_cls._postprocess_output = _postprocess_output
    worker_cls.train_mini_batch = train_mini_batch


_driver_handlers: dict[int, EventHandler] = {}


def driver_started(
    trainer: Any, link: Any, settings: Mapping[str, Any], *, rank_metrics: bool
) -> None:
    """The driver's ``Tracking`` built the rlpulse backend on ``link``: bind its trainer.

    With ``rank_metrics``, ``trainer``'s updates carry the run to the workers; the
    driver's own log records go to the run through ``link`` (stage ``driver``).
    """
    if trainer is not None and rank_metrics:
        bind_trainer(trainer, link.run_id, link.attempt, settings)
    _driver_handlers[id(link)] = attach_log_handler(link, stage="driver")


def driver_finished(trainer: Any, link: Any) -> None:
    """The driver's run ended: unbind the trainer, detach the log handler (before the close)."""
    if trainer is not None:
        unbind_trainer(trainer)
    handler = _driver_handlers.pop(id(link), None)
    if handler is not None:
        logging.getLogger().removeHandler(handler)


_installed: list[bool] = []


def install() -> None:
    """Hook verl's workers and trainers as their modules are imported; idempotent."""
    if _installed:
        return
    _installed.append(True)
    when_imported(WORKERS_MODULE, _patch_workers)
    legacy, v1 = TRAINER_MODULES
    when_imported(legacy, functools.partial(_patch_trainer, "RayPPOTrainer", "meta_info"))
    when_imported(v1, functools.partial(_patch_trainer, "PPOTrainer", "extra_info"))
