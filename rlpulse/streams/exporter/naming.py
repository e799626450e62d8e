"""Prometheus names for what trainers log: sanitising, HELP texts, and who owns a name.

A per-rank family is ``<namespace>_<metric>``, ``metric`` sanitised: each run of characters a
Prometheus metric name may not hold becomes one ``_`` and leading or trailing ``_`` go
(``actor/pg_loss`` -> ``actor_pg_loss``). A name ending in ``_total`` is a counter (Prometheus
naming practice), everything else a gauge. Two logged names that sanitise to the same family,
or a family that would shadow one of the exporter's own, are a collision: the first name keeps
the family, the other's samples are dropped and the collision is reported
(:attr:`FamilyNames.collisions`), never merged.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "COUNTER_SUFFIX",
    "RANK_HELP",
    "Collision",
    "DropReason",
    "FamilyNames",
    "family_key",
    "is_counter",
    "rank_help",
    "sanitise",
]

COUNTER_SUFFIX: Final = "_total"
_NOT_IN_NAME: Final = re.compile(r"[^A-Za-z0-9_]+")

DropReason = Literal["cap", "not_allowed", "collision", "unnamable", "invalid"]
"""Why a sample was not exported: the series cap, the allow-list, a name collision, a name with
nothing left after sanitising, an event the worker would dead-letter."""

RANK_HELP: Final = {
    "reward_mean": "Average reward per rollout step",
    "kl_divergence": "KL divergence between the policy and the reference policy",
    "actor_loss": "Actor (policy) loss",
    "critic_loss": "Critic (value function) loss",
    "policy_loss": "Policy loss",
    "entropy": "Entropy of the policy",
    "response_length": "Mean response length in tokens",
    "throughput_tokens_per_sec": "Training throughput in tokens per second",
    "grad_norm": "Gradient norm before clipping",
    "learning_rate": "Learning rate",
    "process_cpu_seconds_total": "CPU time the rank's trainer process used, in seconds",
    "process_resident_memory_bytes": "Resident memory of the rank's trainer process, in bytes",
    "gpu_utilization_ratio": "Utilisation of the rank's GPU (0 to 1)",
    "gpu_memory_used_bytes": "GPU memory in use on the rank's device, in bytes",
}
"""HELP texts of well-known trainer metrics, by the name the trainer logs."""


def sanitise(metric: str) -> str:
    """``metric`` as a Prometheus name part: ``actor/pg_loss`` -> ``actor_pg_loss``; may be ''."""
    return _NOT_IN_NAME.sub("_", metric).strip("_")


def is_counter(name: str) -> bool:
    """Whether the family ``name`` is a counter (its name ends in ``_total``)."""
    return name.endswith(COUNTER_SUFFIX) and len(name) > len(COUNTER_SUFFIX)


def family_key(name: str) -> str:
    """The name a family is known by in OpenMetrics: a counter's without ``_total``.

    ``x`` (a gauge) and ``x_total`` (a counter) are both the family ``x`` there, so they
    collide even though their sample names differ.
    """
    return name[: -len(COUNTER_SUFFIX)] if is_counter(name) else name


def rank_help(metric: str) -> str:
    """The HELP text of the per-rank family fed by ``metric``."""
    known = RANK_HELP.get(metric) or RANK_HELP.get(sanitise(metric))
    return known or f"Latest {metric} logged by each rank"


@dataclass(frozen=True)
class Collision:
    """A logged name whose family another name (or the exporter itself) already owns."""

    family: str
    metric: str
    kept: str
    """The logged name that owns the family, or ``"(exporter)"`` for one of its own."""


EXPORTER_OWNER: Final = "(exporter)"
MAX_COLLISIONS: Final = 1000
"""Collisions kept for reporting; more are still dropped, and counted, but not listed."""
MAX_DECISIONS: Final = 100_000
"""Logged names whose decision is cached; the cache starts over beyond this."""


class FamilyNames:
    """Decides, once per logged name, which per-rank family its samples feed, if any."""

    def __init__(
        self,
        namespace: str,
        allow: Sequence[str],
        reserved: Iterable[str] = (),
        max_chars: int = 256,
    ) -> None:
        self.namespace = namespace
        self.max_chars = max_chars
        self._allow = tuple(allow)
        self._reserved = {family_key(name) for name in reserved}
        self._owners: dict[str, str] = {}  # family key -> logged name
        self.decided: dict[str, tuple[str | None, DropReason | None]] = {}
        """The decisions made so far, by logged name (read it before calling :meth:`resolve`)."""
        self.collisions: dict[tuple[str, str], Collision] = {}
        """Every collision seen, by (family, dropped name)."""

    def resolve(self, metric: str) -> tuple[str | None, DropReason | None]:
        """(family, None) for a name that is exported, (None, why) for one that is not."""
        decided = self.decided.get(metric)
        if decided is None:
            if len(self.decided) >= MAX_DECISIONS:
                self.decided.clear()
            decided = self._decide(metric)
            self.decided[metric] = decided
        return decided

    def _decide(self, metric: str) -> tuple[str | None, DropReason | None]:
        if len(metric) > self.max_chars:  # the worker refuses such events
            return None, "invalid"
        if self._allow and not any(fnmatch.fnmatchcase(metric, p) for p in self._allow):
            return None, "not_allowed"
        part = sanitise(metric)
        if not part:
            return None, "unnamable"
        family = f"{self.namespace}_{part}"
        key = family_key(family)
        owner = EXPORTER_OWNER if key in self._reserved else self._owners.setdefault(key, metric)
        if owner != metric:
            if len(self.collisions) < MAX_COLLISIONS:
                self.collisions[(family, metric)] = Collision(family, metric, owner)
            return None, "collision"
        return family, None

    def release(self, families: Iterable[str]) -> None:
        """Forget the owners of ``families`` (they have no series left) and every decision."""
        for family in families:
            self._owners.pop(family_key(family), None)
        self.decided.clear()
