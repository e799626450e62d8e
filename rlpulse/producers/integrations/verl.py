"""rlpulse in verl: a ``Tracking`` backend named ``rlpulse``, and the launcher that enables it.

verl's ``verl.utils.tracking.Tracking`` (verl 0.9.1) accepts only the backend names of
its ``supported_backend`` list, and builds each one by name in ``__init__``.
:func:`install` adds ``rlpulse`` to that list and wraps ``Tracking.__init__`` (to build
an :class:`RlpulseBackend` when ``rlpulse`` is selected) and ``Tracking.finish`` (to
flush it). verl then calls ``RlpulseBackend.log(data=..., step=...)`` once per step from
the driver, with the dict of metrics it already reduced across ranks.

Every process that builds a ``Tracking`` must have run :func:`install`. verl imports
the modules named in ``VERL_USE_EXTERNAL_MODULES`` (and its ``verl.plugins`` entry points)
whenever it is imported, so the launcher (one command line)::

    python -m rlpulse.producers.integrations.verl trainer.logger='[console,rlpulse]'
        +rlpulse.bootstrap=kafka:9092 +rlpulse.run_id=grpo-qwen-7b ...

adds :mod:`~rlpulse.producers.integrations.verl_plugin` to that variable (the Ray
workers verl starts inherit it), installs the backend, and runs
``verl.trainer.main_ppo.main()`` with the remaining arguments (Hydra overrides).

The ``rlpulse`` block of verl's config is :class:`VerlSettings`. Each step's dict is
split into stages by metric prefix (``actor/`` -> ``actor``, ``critic/`` -> ``critic``,
``response_length/`` -> ``rollout``, ...; the rest -> ``trainer``) and published from
rank 0 with world size 1 (each step's rollout samples too, captured on the driver:
:mod:`~rlpulse.producers.integrations.verl_samples`); metric names keep their prefix,
and the seed's names are added for verl's
(:mod:`~rlpulse.producers.integrations.canonical`). After publishing, the backend
polls the run's commands and applies them to the trainer whose ``fit()`` built the
``Tracking`` (see :mod:`~rlpulse.producers.integrations.verl_trainer`).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlpulse.exceptions import SettingsError
from rlpulse.producers.caller.ending import exited, stopped_by
from rlpulse.producers.caller.link import RunLink
from rlpulse.producers.integrations import verl_samples, verl_workers
from rlpulse.producers.integrations.canonical import VERL_NAMES, canonical_metrics
from rlpulse.producers.integrations.commands import (
    ActionHandler,
    ActionResult,
    Outcome,
    alert,
    apply_command,
)
from rlpulse.producers.integrations.exceptions import ActionRejectedError, VerlSettingsError
from rlpulse.producers.integrations.metrics import numeric_metrics
from rlpulse.producers.integrations.verl_env import EXTERNAL_MODULES_ENV, with_plugin
from rlpulse.producers.integrations.verl_env import install as install_runtime_env
from rlpulse.producers.integrations.verl_trainer import VerlTrainerActions, is_verl_trainer
from rlpulse.schemas.records import Action, ControlCommand
from rlpulse.settings import Settings, load_settings

log = logging.getLogger(__name__)

BACKEND = "rlpulse"
"""The name to put in verl's ``trainer.logger`` list."""
DEFAULT_STAGES: dict[str, list[str]] = {
    "actor": ["actor/"],
    "critic": ["critic/"],
    "rollout": [
        "response_length/",
        "response_length_non_aborted/",
        "prompt_length/",
        "num_turns/",
        "tool_call_counts/",
        "rollout/",
    ],
}
"""Stage -> metric-name prefixes, after verl 0.9.1's metric names (``metric_utils.py``)."""


class VerlSettings(BaseModel):
    """The ``rlpulse`` block of a verl config: ``+rlpulse.<key>=<value>`` on verl's command line.

    ``stages`` maps a stage to metric-name prefixes and is merged over
    :data:`DEFAULT_STAGES` stage by stage (``+rlpulse.stages.actor=[]`` drops one); the
    longest matching prefix wins, metrics matching none go to ``default_stage``.
    ``seed_names`` (on by default) also publishes the seed's names for verl's metrics
    (:data:`~rlpulse.producers.integrations.canonical.VERL_NAMES`: ``critic/score/mean`` as
    ``reward_mean`` in stage ``rollout``, ``actor/kl_loss`` as ``kl_divergence`` ...), so the
    default rules, the exporter's seed gauges, the dashboard and the alerts act on a verl run.
    ``settings`` takes any other :class:`~rlpulse.settings.Settings` field, nested as there
    (``+rlpulse.settings.producer.linger_ms=20``); values not given come from the
    environment (``RLPULSE_*``) and the config file, as everywhere.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str | None = Field(default=None, description="default: trainer.experiment_name")
    bootstrap: str | None = Field(default=None, description="default: $RLPULSE_BOOTSTRAP")
    prefix: str | None = None
    stages: dict[str, list[str]] = Field(default_factory=dict)
    default_stage: str = Field(default="trainer", min_length=1)
    tags: dict[str, str] = Field(default_factory=dict)
    seed_names: bool = True
    settings: dict[str, Any] = Field(default_factory=dict)
    rank_metrics: bool = Field(
        default=True, description="Publish each data-parallel rank's metrics from the workers."
    )

    @classmethod
    def from_verl_config(cls, config: Mapping[str, Any] | None) -> VerlSettings:
        """Read the ``rlpulse`` block of the (resolved) config verl passes to ``Tracking``."""
        block = (config or {}).get(BACKEND) or {}
        try:
            return cls.model_validate(block)
        except ValidationError as exc:
            raise VerlSettingsError(f"invalid `{BACKEND}` block in the verl config: {exc}") from exc

    def overrides(self) -> dict[str, Any]:
        """What this block sets of rlpulse's settings: ``settings``, ``bootstrap``, ``prefix``."""
        given = {**self.settings, "bootstrap": self.bootstrap, "prefix": self.prefix}
        return {name: value for name, value in given.items() if value is not None}

    def rlpulse_settings(self) -> Settings:
        """Rlpulse's settings: ``settings``, with ``bootstrap``/``prefix`` over it."""
        try:
            return load_settings(self.overrides())
        except SettingsError as exc:
            raise VerlSettingsError(f"invalid settings in `{BACKEND}`: {exc}") from exc

    def prefixes(self) -> list[tuple[str, str]]:
        """(prefix, stage) pairs, longest prefix first."""
        stages = {**DEFAULT_STAGES, **self.stages}
        pairs = [(prefix, stage) for stage, prefixes in stages.items() for prefix in prefixes]
        return sorted(pairs, key=lambda pair: len(pair[0]), reverse=True)

    def split(self, data: Mapping[str, Any]) -> dict[str, dict[str, float]]:
        """Group the numeric entries of ``data`` by stage, with the seed's names when enabled.

        Values that are not numbers are left out.
        """
        prefixes = self.prefixes()
        numbers = numeric_metrics(data)
        by_stage: dict[str, dict[str, float]] = {}
        for name, value in numbers.items():
            stage = next((s for p, s in prefixes if name.startswith(p)), self.default_stage)
            by_stage.setdefault(stage, {})[name] = value
        if self.seed_names:
            for stage, seed in canonical_metrics(numbers, VERL_NAMES).items():
                by_stage.setdefault(stage, {}).update(seed)
        return by_stage


class RlpulseBackend:
    """What ``Tracking.logger['rlpulse']`` holds: publishes verl's metrics, applies commands.

    ``trainer`` is the verl trainer commands act on; without one (a ``Tracking`` built
    outside a trainer's ``fit()``) ``stop``, ``checkpoint`` and ``scale_rollout_batch``
    are acked ``rejected``. A command is acked once it took effect: at once, or for a
    ``stop`` that ends the run only after one more step (legacy trainer), at that step.
    """

    def __init__(self, link: RunLink, settings: VerlSettings, trainer: Any | None = None) -> None:
        self.link = link
        self.settings = settings
        self.trainer = trainer
        """The verl trainer this backend is bound to, or None."""
        self.actions = None if trainer is None else VerlTrainerActions(trainer)
        self.last_step = 0
        self._due: list[tuple[ControlCommand, Outcome, int]] = []
        self._finished = False

    @classmethod
    def create(
        cls, config: Mapping[str, Any] | None, experiment_name: str, trainer: Any | None = None
    ) -> RlpulseBackend:
        """Build the backend from verl's config; ``trainer`` is None or a verl trainer.

        A trainer that resumed from a checkpoint (``global_steps > 0``) starts a new run
        attempt (:meth:`RunLink.resume`); each checkpoint it saves records its attempt.
        """
        settings = VerlSettings.from_verl_config(config)
        run_id = settings.run_id or experiment_name
        options: dict[str, Any] = {
            "tags": {"framework": "verl", **settings.tags},
            "settings": settings.rlpulse_settings(),
        }
        step = int(getattr(trainer, "global_steps", 0) or 0)
        resumed_from = _resumed_from(trainer, step)
        if resumed_from is not None:
            link = RunLink.resume(run_id, resumed_from, **options)
        else:
            link = RunLink(run_id, **options)
        if trainer is not None and hasattr(trainer, "checkpoint_callback"):
            trainer.checkpoint_callback = _RecordAttempt(trainer.checkpoint_callback, link)
        backend = cls(link, settings, trainer)
        link.run_start(step)
        return backend

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """Publish one step's metrics by stage, then apply the run's new commands."""
        for stage, metrics in self.settings.split(data).items():
            self.link.log(metrics, step, stage, world_size=1)
        self.last_step = step
        for command in self.link.poll_commands(step=step):
            outcome = apply_command(command, self._handlers())
            due = step
            if self.actions is not None and self.actions.last_step is not None:
                due = max(step, self.actions.last_step)
            self._due.append((command, outcome, due))
        self._ack_due(step)

    def finish(self, exit_code: int = 0) -> None:
        """Ack what is still due (``failed`` if the run ended first), end the run, flush."""
        if self._finished:
            return
        self._finished = True
        for command, outcome, due in self._due:
            detail = {**outcome.detail, "reason": f"the run ended (exit code {exit_code}) first"}
            log.warning("command %s: the run ended before step %d", command["command_id"], due)
            self.link.ack(command, "failed", applied_at_step=self.last_step, detail=detail)
        self._due.clear()
        stop = self.link.stop_command
        self.link.run_end(self.last_step, exited(exit_code) if stop is None else stopped_by(stop))
        self.link.close()

    def _handlers(self) -> dict[str, ActionHandler]:
        if self.actions is not None:
            return self.actions.handlers()
        rejected = dict.fromkeys(("stop", "checkpoint", "scale_rollout_batch"), _no_trainer)
        return {**rejected, "alert": alert}

    def _ack_due(self, step: int) -> None:
        keep: list[tuple[ControlCommand, Outcome, int]] = []
        for command, outcome, due in self._due:
            if due > step:
                keep.append((command, outcome, due))
                continue
            self.link.ack(command, outcome.status, applied_at_step=step, detail=outcome.detail)
        self._due = keep


def _resumed_from(trainer: Any | None, step: int) -> Path | None:
    """The checkpoint a trainer at ``step`` resumed from: where ``_load_checkpoint`` looks.

    ``trainer.resume_mode=auto`` loads ``{default_local_dir}/global_step_<N>``,
    ``resume_path`` loads ``trainer.resume_from_path``. None for a fresh run, or (with a
    warning: the run keeps attempt 0) when neither directory is there.
    """
    if trainer is None or step <= 0:
        return None
    settings = trainer.config.trainer
    candidates = [Path(str(settings.default_local_dir)) / f"global_step_{step}"]
    if settings.get("resume_from_path"):
        candidates.append(Path(str(settings.resume_from_path)))
    found = next((path for path in candidates if path.is_dir()), None)
    if found is None:
        log.warning("resumed at step %d but found none of %s; attempt stays 0", step, candidates)
    return found


def _no_trainer(action: Action) -> ActionResult:
    raise ActionRejectedError(
        "no verl trainer is bound to this Tracking (it was not built by a trainer's fit())"
    )


class _RecordAttempt:
    """A v1 trainer's checkpoint callback that also records the run attempt in each checkpoint."""

    def __init__(self, inner: Any, link: RunLink) -> None:
        self._inner = inner
        self._link = link

    def on_save(self, trainer: Any, global_step: int, checkpoint_dir: str, **kwargs: Any) -> None:
        """Call the configured callback, then write the attempt file (rank 0 is the driver)."""
        self._inner.on_save(trainer, global_step, checkpoint_dir, **kwargs)
        self._link.save_attempt(Path(checkpoint_dir))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def install() -> None:
    """Make verl's ``Tracking`` accept ``rlpulse`` in ``trainer.logger``; idempotent.

    Also makes verl's Ray runtime env carry rlpulse's settings to every node
    (:func:`~rlpulse.producers.integrations.verl_env.install`).

    The backend is bound to the verl trainer whose ``fit()`` builds the ``Tracking``:
    ``PPOTrainer.fit`` (v1) and ``RayPPOTrainer.fit`` (legacy) call ``Tracking(...)``
    themselves, so the caller's ``self`` is the trainer.
    """
    from verl.utils.tracking import Tracking

    install_runtime_env()
    verl_samples.install()
    if BACKEND in Tracking.supported_backend:
        return
    Tracking.supported_backend = [*Tracking.supported_backend, BACKEND]
    original_init = Tracking.__init__
    original_finish = Tracking.finish

    @functools.wraps(original_init)
    def __init__(  # noqa: N807 -- replaces Tracking.__init__
        self: Any,
        project_name: str,
        experiment_name: str,
        default_backend: str | list[str] = "console",
        config: Mapping[str, Any] | None = None,
    ) -> None:
        original_init(self, project_name, experiment_name, default_backend, config)
        names = [default_backend] if isinstance(default_backend, str) else list(default_backend)
        if BACKEND in names:
            caller = sys._getframe(1).f_locals.get("self")
            trainer = caller if is_verl_trainer(caller) else None
            backend = RlpulseBackend.create(config, experiment_name, trainer)
            self.logger[BACKEND] = backend
            if trainer is not None:
                verl_samples.bind(trainer, backend.link)
            verl_workers.driver_started(
                trainer,
                backend.link,
                backend.settings.overrides(),
                rank_metrics=backend.settings.rank_metrics,
            )

    @functools.wraps(original_finish)
    def finish(self: Any, exit_code: int = 0) -> None:
        backend = getattr(self, "logger", {}).get(BACKEND)
        try:
            original_finish(self, exit_code)
        finally:
            if backend is not None:
                verl_workers.driver_finished(backend.trainer, backend.link)
                backend.finish(exit_code)

    Tracking.__init__ = __init__
    Tracking.finish = finish


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``verl.trainer.main_ppo`` with the rlpulse backend in every verl process.

    ``argv`` (default ``sys.argv[1:]``) are verl's Hydra overrides.
    """
    os.environ[EXTERNAL_MODULES_ENV] = with_plugin(os.environ.get(EXTERNAL_MODULES_ENV, ""))
    install()
    from verl.trainer import main_ppo

    sys.argv = [main_ppo.__file__, *(sys.argv[1:] if argv is None else argv)]
    main_ppo.main()


if __name__ == "__main__":
    from rlpulse.producers.integrations.verl import main as run  # the importable copy

    run()
