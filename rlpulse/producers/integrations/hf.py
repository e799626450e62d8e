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

import logging
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from rlpulse.producers.bus import Broadcast
from rlpulse.producers.ending import FINISHED, stopped_by
from rlpulse.producers.exceptions import InvalidValueError
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
from rlpulse.producers.link import RunLink
from rlpulse.schemas.records import Action, ControlCommand
from rlpulse.settings import Settings

log = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "checkpoint"
"""The Trainer's checkpoint folder prefix (``transformers.trainer_utils.PREFIX_CHECKPOINT_DIR``)."""


class RlpulseCallback(TrainerCallback):  # type: ignore[misc]  # transformers is not type-checked
    """Publishes a Trainer's metrics and applies the run's commands on every rank.

    ``run_id`` names the run; ``settings`` says where Kafka is (default: ``Settings()``,
    which reads ``$RLPULSE_BOOTSTRAP`` and the rest of the environment).
    ``poll_every_steps`` spaces the per-step collective that shares rank 0's commands;
    ``broadcast`` is that collective (default: over ``torch.distributed``, the identity
    without a process group).
    """

    def __init__(
        self,
        run_id: str,
        *,
        settings: Settings | None = None,
        tags: dict[str, str] | None = None,
        stage: str = "trainer",
        rank_stage: str = "rank",
        poll_every_steps: int = 1,
        broadcast: Broadcast = torch_broadcast,
    ) -> None:
        if poll_every_steps < 1:
            raise InvalidValueError("poll_every_steps", poll_every_steps, "an int >= 1")
        self.run_id = run_id
        self.settings = settings if settings is not None else Settings()
        self.tags = {"framework": "transformers", **(tags or {})}
        self.stage = stage
        self.rank_stage = rank_stage
        self.poll_every_steps = poll_every_steps
        self.broadcast = broadcast
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
        """Open the link (a new attempt when resuming); rank 0 publishes ``run_start``."""
        self.link = self._open(args, state)
        self.stopped_by = None
        if self.link.rank == 0:
            self.link.run_start(state.global_step)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        """Start timing the optimizer step."""
        self._step_started = time.perf_counter()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        """Publish this rank's step time; apply the commands rank 0 polled, on every rank."""
        link = self._require_link()
        step = int(state.global_step)
        if self._step_started is not None:
            elapsed = time.perf_counter() - self._step_started
            link.log({"step_time_s": elapsed}, step, self.rank_stage)
            self._step_started = None
        if step % self.poll_every_steps:
            return
        for command in link.poll_commands():
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
        """Rank 0 publishes the logged (already cross-rank) metrics as ``stage``, world size 1."""
        link = self._require_link()
        metrics = numeric_metrics(logs or {})
        if link.rank == 0 and metrics:
            link.log(metrics, int(state.global_step), self.stage, world_size=1)

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


def _checkpoint_dir(args: TrainingArguments, step: int) -> Path:
    """Where the Trainer saves the checkpoint of ``step``."""
    return Path(str(args.output_dir)) / f"{CHECKPOINT_PREFIX}-{step}"


def _fixed_batch_size(action: Action) -> ActionResult:
    raise ActionRejectedError(
        "the Trainer's batch size (per_device_train_batch_size x gradient_accumulation_steps "
        "x processes) is fixed when its dataloader is built; it cannot change during train()"
    )
