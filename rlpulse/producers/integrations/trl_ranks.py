"""Each process's own values of the metrics TRL's GRPO and RLOO trainers reduce across ranks.

TRL logs ``reward``, ``kl``, ``loss``, ``completions/mean_length`` ... already reduced over
every process (rank 0's ``on_log`` dict). :meth:`TrlRankMetrics.attach` hooks one
trainer object (instance attributes; its class and other trainers are untouched) so
that each process also keeps the values it computed before TRL gathered them, under
TRL's own names. The hooks, in trl 1.16 (``trl/trainer/grpo_trainer.py``; RLOO's
``rloo_trainer.py`` has the same structure):

- ``training_step`` (GRPO l.1510): its return value is this rank's micro-batch loss,
  the one ``Trainer`` adds to ``tr_loss`` before it averages ranks for ``loss``; summed
  over the optimizer step's micro-batches.
- ``_generate`` (GRPO l.2193, RLOO l.1404): returns this rank's completion ids (and for
  GRPO the tool mask) before l.2281 gathers the lengths: ``completions/mean_length``,
  ``completions/min_length``, ``completions/max_length``, counted as TRL counts them.
- ``_calculate_rewards`` (GRPO l.1579, RLOO l.1148): returns the rewards of every
  process (gathered at l.1681); this rank's rows are the ``process_slice`` that
  ``_generate_and_score_completions`` keeps (l.2813): ``reward`` (weighted sum, rows that
  every reward function left None excluded, as at l.2827) and ``rewards/<func>/mean``.
- ``accelerator.reduce`` while ``training_step`` runs, paired with the next value TRL
  appends to ``_metrics["train"]``: TRL's token-weighted means (``global_masked_mean``,
  GRPO l.3259: ``kl``, ``entropy``, ``clip_ratio/*_mean``; RLOO l.1713 ``kl``, l.1844
  ``entropy``) reduce a ``[sum, count]`` pair with ``reduction="sum"`` and append
  ``sum / count.clamp(min=1)``; when the appended value is exactly that of the reduced
  pair, this rank's value is its local ``sum / count``.

Only what runs inside ``training_step`` counts (evaluation does not). Each value is
averaged over the step like TRL's ``log`` averages its lists (NaN left out).

The same two hooks give this rank's rollout samples (with a ``sample_sink``, which the
callback sets to its link's ``EventLogger.log_sample_columns``), with no extra gather:
``_calculate_rewards`` gets this rank's prompts, completions (the texts TRL decoded for
its reward functions) and completion ids, and returns every function's rewards (this rank's
rows: the reward, before RLOO's KL penalty, and one score per function);
``_generate_and_score_completions`` (GRPO l.2324, RLOO l.1458) returns this rank's
``prompt_mask`` and ``advantages``. A group is ``num_generations`` consecutive completions of
the global batch (a group may straddle two ranks: each logs its part). Truncated is TRL's own
per-sample test (l.2302: the last token is neither EOS nor pad). TRL generates once for
``steps_per_generation`` optimizer steps: those samples are logged once, at the step that
generated them (``global_step + 1``); the steps after it train on them without new samples.
In evaluation they are ``validation`` samples of the step evaluated.
Other trl versions are not hooked (a warning says so): the private methods above are
what the hooks rely on, checked against :data:`TESTED_TRL`.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlpulse.producers.caller.samples import RawText
    from rlpulse.producers.encoding.samples import Ints, SampleColumns
    from rlpulse.schemas.records import SampleSplit

    SampleSink = Callable[
        [SampleColumns, Ints, Callable[[int], RawText] | None, int, SampleSplit], None
    ]

log = logging.getLogger(__name__)

TESTED_TRL = ("1.16",)
"""The trl release lines (major.minor) whose private methods the hooks were checked against."""

TRAINERS = ("GRPOTrainer", "RLOOTrainer")
"""The trl trainer classes hooked (and their subclasses)."""

_TOOL_MASK_AT = {"GRPOTrainer": 2}
"""Where ``_generate``'s result holds the tool mask (RLOO has none)."""


class TrlRankMetrics:
    """The per-process metrics of one hooked TRL trainer; build it with :meth:`attach`."""

    def __init__(self, trainer: Any, kind: str) -> None:
        self.trainer = trainer
        self.kind = kind
        """Which of :data:`TRAINERS` the trainer is."""
        self._values: defaultdict[str, list[float]] = defaultdict(list)
        self._loss: Any = None  # a tensor on the trainer's device: one sync per step, in take()
        self._in_step = False
        self._pending: tuple[float, float] | None = None
        self._scored: tuple[tuple[Any, ...], Any] | None = None
        self.failed: str | None = None
        """Why collecting stopped (a hook's error; training goes on), or None."""
        self.sample_sink: SampleSink | None = None
        """Where this rank's rollout samples go (None: they are not captured)."""

    @classmethod
    def attach(cls, trainer: Any) -> TrlRankMetrics | None:
        """Hook ``trainer`` if it is a TRL GRPO/RLOO trainer of a tested trl; else None.

        Attaching twice returns the first one's collector (the hooks are installed once).
        """
        kind = _trl_kind(trainer)
        if kind is None:
            return None
        existing = getattr(trainer, "_rlpulse_rank_metrics", None)
        if isinstance(existing, TrlRankMetrics):
            return existing
        collector = cls(trainer, kind)
        collector._install()
        trainer._rlpulse_rank_metrics = collector
        return collector

    def take(self) -> dict[str, float]:
        """The values collected since the last call (one optimizer step), then forget them."""
        taken: dict[str, float] = {}
        if self._loss is not None:
            taken["loss"] = float(self._loss)
        for name, values in self._values.items():
            valid = [value for value in values if not math.isnan(value)]
            if valid:
                taken[name] = sum(valid) / len(valid)
        self._values.clear()
        self._loss = None
        return taken

    # -- hooks ------------------------------------------------------------------------

    def _install(self) -> None:
        trainer = self.trainer
        trainer.training_step = self._around_step(trainer.training_step)
        trainer._generate = self._after(trainer._generate, self._completions)
        trainer._calculate_rewards = self._after(trainer._calculate_rewards, self._rewards)
        trainer._calculate_rewards = self._after(
            trainer._calculate_rewards, self._note_scored, always=True
        )
        trainer._generate_and_score_completions = self._after(
            trainer._generate_and_score_completions, self._scored_samples, always=True
        )
        accelerator = trainer.accelerator
        accelerator.reduce = self._around_reduce(accelerator.reduce)
        train = trainer._metrics["train"]
        noted = _NotedMetrics(lambda name, value: self._safely(self._appended, name, value))
        for name, values in train.items():
            noted[name].extend(values)
        trainer._metrics["train"] = noted

    def _around_step(self, step: Callable[..., Any]) -> Callable[..., Any]:
        def training_step(*args: Any, **kwargs: Any) -> Any:
            self._in_step = True
            try:
                loss = step(*args, **kwargs)
            finally:
                self._in_step, self._pending = False, None
            self._safely(self._add_loss, loss)
            return loss

        return training_step

    def _add_loss(self, loss: Any) -> None:
        micro = loss.detach()
        self._loss = micro if self._loss is None else self._loss + micro

    def _after(
        self,
        method: Callable[..., Any],
        note: Callable[[tuple[Any, ...], Any], None],
        always: bool = False,
    ) -> Callable[..., Any]:
        """``method`` that hands its arguments and result to ``note`` (in a step, or always)."""

        def hooked(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            if always or self._in_step:
                self._safely(note, args, result)
            return result

        return hooked

    def _note_scored(self, args: tuple[Any, ...], every_rank: Any) -> None:
        """``_calculate_rewards``' arguments (this rank's rows) and its gathered rewards."""
        if self.sample_sink is not None:
            self._scored = (args, every_rank)

    def _scored_samples(self, args: tuple[Any, ...], output: Any) -> None:
        """``_generate_and_score_completions``' output: this rank's samples, to the sink."""
        scored, self._scored = self._scored, None
        sink = self.sample_sink
        if sink is None or scored is None:
            return
        from rlpulse.producers.integrations.trl_samples import rank_samples

        captured = rank_samples(self.trainer, scored[0], scored[1], output)
        sink(captured.columns, captured.identity, captured.text_of, captured.step, captured.split)

    def _completions(self, args: tuple[Any, ...], result: Any) -> None:
        """``_generate``'s result: this rank's completion lengths, as TRL counts them."""
        completion_ids: Sequence[Sequence[int]] = result[1]
        at = _TOOL_MASK_AT.get(self.kind)
        tool_mask = result[at] if at is not None else None
        if tool_mask is not None:
            lengths = [float(sum(mask)) for mask in tool_mask]
        else:
            lengths = [float(len(ids)) for ids in completion_ids]
        if not lengths:
            return
        self._values["completions/mean_length"].append(sum(lengths) / len(lengths))
        self._values["completions/min_length"].append(min(lengths))
        self._values["completions/max_length"].append(max(lengths))

    def _rewards(self, args: tuple[Any, ...], every_rank: Any) -> None:
        """``_calculate_rewards``' gathered rewards: this rank's rows and their means."""
        import torch

        prompts = args[1]
        index = int(self.trainer.accelerator.process_index)
        mine = every_rank[index * len(prompts) : (index + 1) * len(prompts)].detach().float()
        weights = self.trainer.reward_weights.to(mine.device).float()
        unscorable = torch.isnan(mine).all(dim=1)
        rewards = (mine * weights.unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = torch.nan
        self._values["reward"].append(torch.nanmean(rewards).item())
        for column, name in enumerate(self.trainer.reward_func_names):
            self._values[f"rewards/{name}/mean"].append(torch.nanmean(mine[:, column]).item())

    def _around_reduce(self, reduce: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
            pair = self._in_step and reduction == "sum" and _is_pair(tensor)
            local = self._safely(_ratio, tensor) if pair else None
            result = reduce(tensor, reduction=reduction, scale=scale)
            if local is not None and _is_pair(result):
                reduced = self._safely(_ratio, result)
                self._pending = None if reduced is None else (local, reduced)
            return result

        return hooked

    def _safely(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)``, or None once a hook failed: telemetry never stops training."""
        if self.failed is not None:
            return None
        try:
            return work(*args)
        except Exception as error:
            self.failed = f"{type(error).__name__}: {error}"
            log.warning("rlpulse: per-rank TRL metrics stop here: %s", self.failed, exc_info=True)
            return None

    def _appended(self, name: str, value: object) -> None:
        """TRL appended ``value`` to ``_metrics["train"][name]``."""
        pending, self._pending = self._pending, None
        if pending is None or not isinstance(value, float):
            return
        local, reduced = pending
        if value == reduced or (math.isnan(value) and math.isnan(reduced)):
            self._values[name].append(local)


class _NotedList(list[Any]):
    """One of TRL's metric lists; tells its owner of every value appended."""

    def __init__(self, name: str, note: Callable[[str, object], None]) -> None:
        super().__init__()
        self.name = name
        self.note = note

    def append(self, value: Any) -> None:
        """Append ``value`` and report it."""
        super().append(value)
        self.note(self.name, value)


class _NotedMetrics(defaultdict[str, list[Any]]):
    """TRL's ``_metrics["train"]`` (a ``defaultdict(list)``) whose new lists are noted."""

    def __init__(self, note: Callable[[str, object], None]) -> None:
        super().__init__(list)
        self.note = note

    def __missing__(self, name: str) -> list[Any]:
        made = _NotedList(name, self.note)
        self[name] = made
        return made


def _trl_kind(trainer: Any) -> str | None:
    """Which of :data:`TRAINERS` ``trainer`` is, if trl is a tested version; else None."""
    if not any(kind.__module__.startswith("trl.") for kind in type(trainer).__mro__):
        return None  # a plain Trainer: trl (its trainers are heavy imports) stays unimported
    try:
        import trl
    except ImportError:
        return None
    kind = next(
        (name for name in TRAINERS if isinstance(trainer, getattr(trl, name, ()))),
        None,
    )
    if kind is None:
        return None
    version = str(trl.__version__)
    if ".".join(version.split(".")[:2]) not in TESTED_TRL:
        log.warning(
            "rlpulse: per-rank TRL metrics are off: trl %s is not one of the tested releases %s",
            version,
            ", ".join(f"{line}.x" for line in TESTED_TRL),
        )
        return None
    return kind


def _is_pair(tensor: Any) -> bool:
    shape = getattr(tensor, "shape", None)
    return shape is not None and tuple(shape) == (2,)


def _ratio(pair: Any) -> float:
    """``pair[0] / pair[1].clamp(min=1)``, as TRL divides a reduced ``[sum, count]``."""
    return float((pair[0] / pair[1].clamp(min=1.0)).item())
