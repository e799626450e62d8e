"""The seed's metric names, found among a framework's own: what the default rules and gauges read.

The seed rules (``reward_mean`` in stage ``rollout``, ``kl_divergence`` in any stage), the
exporter's seed gauges (``<namespace>_reward_mean`` ...), the dashboard and the alerts all read
five canonical names. verl and TRL log the same quantities under their own names, so each
integration publishes, next to the framework's metrics (kept as logged), the canonical ones taken
from the first of their sources present in the step's dict, in the canonical stage. One table per
framework, here and nowhere else:

========================= ======= ======================== =========================
canonical                 stage   verl 0.9.1               TRL / HF Trainer
========================= ======= ======================== =========================
reward_mean               rollout critic/score/mean,       reward, objective/scores
                                  critic/rewards/mean
kl_divergence             actor   actor/kl_loss,           kl, objective/kl
                                  actor/reward_kl_penalty,
                                  critic/kl
actor_loss                actor   actor/pg_loss            loss/policy_avg, loss
critic_loss               critic  critic/vf_loss           loss/value_avg
throughput_tokens_per_sec trainer perf/throughput          train_tokens_per_second
========================= ======= ======================== =========================

Why these: ``critic/score/mean`` is the reward function's raw score of the batch (the seed's
"rollout reward"); ``critic/rewards/mean`` (score minus the in-reward KL penalty) stands in when a
config logs no score. The seed's KL is the policy's divergence from the *reference* model:
``actor/kl_loss`` when the KL is a loss term (``actor.use_kl_loss``, GRPO's default), else
``actor/reward_kl_penalty`` when it is taken out of the reward (``algorithm.use_kl_in_reward``),
``critic/kl`` in verl up to 0.3; ``actor/ppo_kl`` is the divergence between the rollout and the
updated policy, not the reference, so it is not the seed's KL. TRL's GRPO/RLOO trainers log ``kl``
(to the reference, when ``beta > 0``) and ``reward``; its PPO trainer ``objective/kl`` and
``objective/scores``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["TRL_NAMES", "VERL_NAMES", "CanonicalName", "canonical_metrics", "with_seed_names"]


@dataclass(frozen=True, slots=True)
class CanonicalName:
    """One seed metric: its name, the stage it is published in, and the framework names it is."""

    name: str
    stage: str
    sources: tuple[str, ...]
    """Framework metric names, most specific first: the first one present gives the value."""


VERL_NAMES: Final = (
    CanonicalName("reward_mean", "rollout", ("critic/score/mean", "critic/rewards/mean")),
    CanonicalName(
        "kl_divergence", "actor", ("actor/kl_loss", "actor/reward_kl_penalty", "critic/kl")
    ),
    CanonicalName("actor_loss", "actor", ("actor/pg_loss",)),
    CanonicalName("critic_loss", "critic", ("critic/vf_loss",)),
    CanonicalName("throughput_tokens_per_sec", "trainer", ("perf/throughput",)),
)
"""verl 0.9.1's names for the seed metrics (``trainer/ppo/metric_utils.py``, the losses)."""

TRL_NAMES: Final = (
    CanonicalName("reward_mean", "rollout", ("reward", "objective/scores")),
    CanonicalName("kl_divergence", "actor", ("kl", "objective/kl")),
    CanonicalName("actor_loss", "actor", ("loss/policy_avg", "loss")),
    CanonicalName("critic_loss", "critic", ("loss/value_avg",)),
    CanonicalName("throughput_tokens_per_sec", "trainer", ("train_tokens_per_second",)),
)
"""TRL's (GRPO, RLOO, PPO) and the Hugging Face ``Trainer``'s names for the seed metrics."""


def with_seed_names(
    metrics: Mapping[str, float], names: tuple[CanonicalName, ...]
) -> dict[str, float]:
    """``metrics`` and, beside them, the seed's names for those of ``names`` it carries.

    For one rank's own metrics, published in a stage of their own: the seed's names stay in
    that stage (their world size is the rank's), so the exporter's per-rank seed gauges
    (``<namespace>_kl_divergence{rank=...}``) show every rank.
    """
    seed = {
        name: value
        for stage_values in canonical_metrics(metrics, names).values()
        for name, value in stage_values.items()
    }
    return {**metrics, **seed}


def canonical_metrics(
    metrics: Mapping[str, float], names: tuple[CanonicalName, ...]
) -> dict[str, dict[str, float]]:
    """Stage -> {canonical name: value} for the seed metrics ``metrics`` carries under ``names``.

    A canonical name that ``metrics`` already holds as itself is left out (the trainer logged it
    under the seed's name: that value stands, in the trainer's own stage).
    """
    by_stage: dict[str, dict[str, float]] = {}
    for canonical in names:
        if canonical.name in metrics:
            continue
        source = next((s for s in canonical.sources if s in metrics), None)
        if source is not None:
            by_stage.setdefault(canonical.stage, {})[canonical.name] = metrics[source]
    return by_stage
