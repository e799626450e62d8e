"""rlpulse in a Hugging Face ``transformers.Trainer`` (and TRL's trainers, its subclasses).

::

    from rlpulse.producers import Settings
    from rlpulse.producers.integrations.hf import RlpulseCallback

    kafka = Settings(bootstrap="kafka:9092")
    callback = RlpulseCallback("grpo-qwen-7b", settings=kafka)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    callback.exit_if_stopped()   # a `stop` command ends the process here (exit status 0)

Events: rank 0 publishes every dict the Trainer logs (``on_log``: already reduced
across ranks) as stage ``trainer`` with world size 1; every rank publishes its own
``step_time_s`` each optimizer step as stage ``rank`` with world size = the number of
processes.

TRL: with a ``GRPOTrainer`` or ``RLOOTrainer`` (trl 1.16), every rank also publishes, each
optimizer step, the values it computed itself before TRL reduced them across processes
(``reward``, ``kl``, ``loss``, ``completions/mean_length``, ...; see
:mod:`~rlpulse.producers.integrations.trl_ranks`) as stage ``trl_rank``, world size = the
number of processes, and the events are tagged ``framework: trl``. Its own stage: the
worker joins one event per rank per (stage, step), and a ``trl_rank`` summary (the spread
of one metric across ranks) is a different thing from the reduced ``trainer`` values and
from the ``rank`` step times that every Trainer has.

Text logs: on every rank the records of the ``transformers`` and ``trl`` loggers (at the
levels those loggers are set to: ``log_level`` / ``log_level_replica`` of the
``TrainingArguments``) go to ``<prefix>.logs`` with the run, rank, host, pid and the step
being trained, from ``on_train_begin`` until the link closes (``capture_logs=False``: not).

Commands, at the end of each optimizer step (``on_step_end``, on every rank): rank 0
polls, :func:`~rlpulse.producers.integrations.torch_dist.torch_broadcast` hands the same
commands to every rank, and each rank sets the same ``TrainerControl`` flags:
``checkpoint`` -> ``should_save`` (the Trainer saves ``checkpoint-<step>`` right after
this callback), ``stop`` -> ``should_training_stop`` (it leaves the loop after that
save). Rank 0 acks a command once it took effect: after the save (``on_save``) when it
asked for one, else at once. ``scale_rollout_batch`` is acked ``rejected``: the
Trainer's batch size is fixed when its dataloader is built.

A run resumed from ``output_dir/checkpoint-<N>`` starts a new run attempt, and every
checkpoint records the attempt that saved it (``rlpulse_attempt.json``).
"""

from __future__ import annotations

import inspect
import logging
import time
from pathlib import Path
from typing import Any

from transformers import (
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

from rlpulse.producers.caller.ending import FINISHED, stopped_by
from rlpulse.producers.caller.link import RunLink
from rlpulse.producers.caller.logging_handler import EventHandler
from rlpulse.producers.control.bus import Broadcast
from rlpulse.producers.exceptions import InvalidValueError
from rlpulse.producers.integrations.canonical import (
    TRL_NAMES,
    canonical_metrics,
    with_seed_names,
)
from rlpulse.producers.integrations.commands import (
    ActionHandler,
    ActionResult,
    Outcome,
    alert,
    apply_command,
)
from rlpulse.producers.integrations.exceptions import ActionRejectedError, IntegrationError
from rlpulse.producers.integrations.metrics import numeric_metrics
from rlpulse.producers.integrations.torch_dist import torch_broadcast
from rlpulse.producers.integrations.trl_ranks import TrlRankMetrics
from rlpulse.schemas.records import Action, ControlCommand
from rlpulse.settings import Settings

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "checkpoint"
"""The Trainer's checkpoint folder prefix (``transformers.trainer_utils.PREFIX_CHECKPOINT_DIR``)."""

LOGGERS = ("transformers", "trl")
"""The loggers whose records ``capture_logs`` publishes (and their children's)."""

_TRAINER_FRAMES = 8
"""How far up the stack ``on_train_begin`` looks for the Trainer that called it."""


class RlpulseCallback(TrainerCallback):  # type: ignore[misc]  # transformers is not type-checked
    """Publishes a Trainer's metrics and applies the run's commands on every rank.

    ``run_id`` names the run; ``settings`` says where Kafka is (default: ``Settings()``,
    which reads ``$RLPULSE_BOOTSTRAP`` and the rest of the environment).
    ``poll_every_steps`` spaces the per-step collective that shares rank 0's commands;
    ``broadcast`` is that collective (default: over ``torch.distributed``, the identity
    without a process group). ``seed_names`` (default on) also publishes TRL's metrics under the
    seed's names (``reward`` as ``reward_mean`` in stage ``rollout``, ``kl`` as
    ``kl_divergence`` ...), so the default rules and the exporter's seed gauges act on the run.
    ``trl_stage`` is the stage of a TRL trainer's per-rank metrics; ``capture_logs``
    publishes the ``transformers`` and ``trl`` log records.
    """

    def __init__(
        self,
        run_id: str,
        *,
        settings: Settings | None = None,
        tags: dict[str, str] | None = None,
        stage: str = "trainer",
        rank_stage: str = "rank",
        trl_stage: str = "trl_rank",
        poll_every_steps: int = 1,
        broadcast: Broadcast = torch_broadcast,
        seed_names: bool = True,
        capture_logs: bool = True,
    ) -> None:
        if poll_every_steps < 1:
            raise InvalidValueError("poll_every_steps", poll_every_steps, "an int >= 1")
        self.run_id = run_id
        self.settings = settings if settings is not None else Settings()
        self.tags = {"framework": "transformers", **(tags or {})}
        self._framework_given = "framework" in (tags or {})
        self.stage = stage
        self.rank_stage = rank_stage
        self.trl_stage = trl_stage
        self.capture_logs = capture_logs
        self.trl: TrlRankMetrics | None = None
        """The per-rank metrics of the TRL trainer trained, from ``on_train_begin`` on."""
        self.log_handler: _LinkLogHandler | None = None
        """The handler on :data:`LOGGERS`, from ``on_train_begin`` on (``capture_logs``)."""
        self.poll_every_steps = poll_every_steps
        self.broadcast = broadcast
        self.seed_names = seed_names
        self.link: RunLink | None = None
        """This process's link to rlpulse, from ``on_train_begin`` on."""
        self.stopped_by: ControlCommand | None = None
        """The command that stopped training, on every rank."""
        self._step_started: float | None = None
        self._awaiting_save: list[tuple[ControlCommand, Outcome]] = []

    # -- Trainer events ---------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        """Open the link (a new attempt when resuming); rank 0 publishes ``run_start``.

        A TRL trainer that called it gets its per-rank hooks; the log handler goes on.
        """
        trainer = _calling_trainer(self)
        self.trl = TrlRankMetrics.attach(trainer) if trainer is not None else None
        if self.trl is not None and not self._framework_given:
            self.tags["framework"] = "trl"
        self.link = self._open(args, state)
        if self.trl is not None and self.link.settings.samples.enabled:
            self.trl.sample_sink = self.link.events.log_sample_columns
        self.stopped_by = None
        if self.capture_logs:
            self._capture_logs(self.link, int(state.global_step))
        if self.link.rank == 0:
            self.link.run_start(state.global_step)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        """Start timing the optimizer step; log records from now on belong to the next step."""
        self._step_started = time.perf_counter()
        if self.log_handler is not None:
            self.log_handler.last_step = int(state.global_step) + 1

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        """Publish this rank's step time (and TRL metrics); apply rank 0's commands everywhere."""
        link = self._require_link()
        step = int(state.global_step)
        if self._step_started is not None:
            elapsed = time.perf_counter() - self._step_started
            link.log({"step_time_s": elapsed}, step, self.rank_stage)
            self._step_started = None
        if self.trl is not None:
            own = self.trl.take()
            if own:
                link.log(
                    with_seed_names(own, TRL_NAMES) if self.seed_names else own,
                    step,
                    self.trl_stage,
                )
        if step % self.poll_every_steps:
            return
        for command in link.poll_commands(step=step):
            self._apply(command, args, step, control)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        """Record the attempt in the new checkpoint; ack the commands that asked for it."""
        link = self._require_link()
        directory = _checkpoint_dir(args, state.global_step)
        if link.rank == 0 and directory.is_dir():
            link.save_attempt(directory)
        self._ack_saves(state.global_step, saved=directory.is_dir())

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **_: Any,
    ) -> None:
        """Rank 0 publishes the logged (already cross-rank) metrics as ``stage``, world size 1.

        With ``seed_names``, the seed's names for TRL's metrics go too, each in its stage
        (:data:`~rlpulse.producers.integrations.canonical.TRL_NAMES`).
        """
        link = self._require_link()
        metrics = numeric_metrics(logs or {})
        if link.rank != 0 or not metrics:
            return
        step = int(state.global_step)
        link.log(metrics, step, self.stage, world_size=1)
        if self.seed_names:
            for stage, seed in canonical_metrics(metrics, TRL_NAMES).items():
                link.log(seed, step, stage, world_size=1)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        """Rank 0 publishes ``run_end`` once; the link is closed unless a stop is still to exit."""
        link = self._require_link()
        self._ack_saves(state.global_step, saved=False)
        stop = link.stop_command
        link.run_end(int(state.global_step), FINISHED if stop is None else stopped_by(stop))
        if link.stop_command is None:
            link.close()
        else:
            link.flush()

    # -- after training ---------------------------------------------------------------

    def exit_if_stopped(self) -> None:
        """After ``trainer.train()``: end the process if a ``stop`` command ended training.

        Raises :class:`~rlpulse.producers.StopRequested` (a ``SystemExit``, exit status
        :data:`~rlpulse.producers.EXIT_STOPPED_BY_RULE`); returns if training was not stopped.
        """
        if self.link is not None:
            self.link.exit_if_stopped()

    # -- internals --------------------------------------------------------------------

    def _open(self, args: TrainingArguments, state: TrainerState) -> RunLink:
        rank, world_size = int(args.process_index), int(args.world_size)
        options: dict[str, Any] = {
            "rank": rank,
            "world_size": world_size,
            "tags": self.tags,
            "settings": self.settings,
            "broadcast": self.broadcast,
        }
        checkpoint = _checkpoint_dir(args, state.global_step)
        # Every rank must take the same branch (resume is a collective): rank 0 decides.
        resumed = self.broadcast(state.global_step > 0 and rank == 0 and checkpoint.is_dir())
        if resumed:
            return RunLink.resume(self.run_id, checkpoint, **options)
        return RunLink(self.run_id, **options)

    def _apply(
        self, command: ControlCommand, args: TrainingArguments, step: int, control: TrainerControl
    ) -> None:
        """Set ``control``'s flags for ``command``; ack it now, or after the save it asked for."""
        save_requested = False

        def checkpoint(action: Action) -> ActionResult:
            nonlocal save_requested
            save_requested = True
            control.should_save = True
            return ActionResult("applied", {"path": str(_checkpoint_dir(args, step))})

        def stop(action: Action) -> ActionResult:
            control.should_training_stop = True
            self.stopped_by = self.stopped_by or command
            return ActionResult("applied", {"stopped_at_step": str(step)})

        handlers: dict[str, ActionHandler] = {
            "checkpoint": checkpoint,
            "stop": stop,
            "scale_rollout_batch": _fixed_batch_size,
            "alert": alert,
        }
        outcome = apply_command(command, handlers)
        if save_requested:
            self._awaiting_save.append((command, outcome))
        else:
            self._require_link().ack(
                command, outcome.status, applied_at_step=step, detail=outcome.detail
            )

    def _capture_logs(self, link: RunLink, step: int) -> None:
        """Put a handler publishing through ``link`` on :data:`LOGGERS` (replacing this one's)."""
        if self.log_handler is not None:
            self.log_handler.detach()
        handler = _LinkLogHandler(link, stage=self.stage)
        handler.last_step = step
        for name in LOGGERS:
            logging.getLogger(name).addHandler(handler)
        self.log_handler = handler

    def _require_link(self) -> RunLink:
        if self.link is None:
            raise IntegrationError("RlpulseCallback: the Trainer has not called on_train_begin")
        return self.link

    def _ack_saves(self, step: int, *, saved: bool) -> None:
        link = self._require_link()
        for command, outcome in self._awaiting_save:
            status, detail = outcome.status, outcome.detail
            if not saved:
                status = "failed"
                detail = {**detail, "reason": f"no checkpoint was written at step {step}"}
            link.ack(command, status, applied_at_step=step, detail=detail)
        self._awaiting_save.clear()


class _LinkLogHandler(EventHandler):
    """An :class:`EventHandler` on :data:`LOGGERS` that takes itself off once its link closed."""

    def __init__(self, link: RunLink, *, stage: str) -> None:
        super().__init__(link, stage=stage)
        self.link = link

    def emit(self, record: logging.LogRecord) -> None:
        """Publish ``record`` while the link is open."""
        if self.link.closed:
            self.detach()
            return
        super().emit(record)

    def detach(self) -> None:
        """Remove this handler from :data:`LOGGERS`."""
        for name in LOGGERS:
            logger = logging.getLogger(name)
            # A new list, not removeHandler's in-place remove: emit() detaches while the
            # logger iterates its handlers, and the handler after this one must still run.
            logger.handlers = [handler for handler in logger.handlers if handler is not self]


def _calling_trainer(callback: TrainerCallback) -> Trainer | None:
    """The ``Trainer`` up the stack whose callbacks hold ``callback`` (the one training now)."""
    frame = inspect.currentframe()
    try:
        for _ in range(_TRAINER_FRAMES):
            if frame is None:
                break
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, Trainer) and callback in candidate.callback_handler.callbacks:
                return candidate
            frame = frame.f_back
    finally:
        del frame
    return None


def _checkpoint_dir(args: TrainingArguments, step: int) -> Path:
    """Where the Trainer saves the checkpoint of ``step``."""
    return Path(str(args.output_dir)) / f"{CHECKPOINT_PREFIX}-{step}"


def _fixed_batch_size(action: Action) -> ActionResult:
    raise ActionRejectedError(
        "the Trainer's batch size (per_device_train_batch_size x gradient_accumulation_steps "
        "x processes) is fixed when its dataloader is built; it cannot change during train()"
    )
