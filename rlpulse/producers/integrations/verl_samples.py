"""Rollout samples of verl 0.9.1's PPO trainers, captured where the driver still holds them.

A logger backend sees only a step's scalars, after the samples are gone, so the integration
captures them on the driver, inside ``fit()``, and logs them through the run's
:class:`~rlpulse.producers.integrations.verl.RlpulseBackend` (installed by
:func:`install`, which :func:`rlpulse.producers.integrations.verl.install` calls):

- **v1** (``PPOTrainer``, the default): samples live in TransferQueue, and
  ``fit()`` clears them (``tq.kv_clear``, ``trainer_base.py`` ~511) right after
  ``_compute_metrics`` (~1868), which fetches prompts, responses, response masks,
  advantages and the per-token scores of every sample through
  ``get_metric_data_with_optional_routed_experts``. The capture takes the numbers from that
  fetch (no second fetch of the tokens), adds one fetch of what it does not get (``uid``,
  ``data_source``, ``reward_model``, ``extra_fields``), leaves verl's padding rows out
  (``is_padding`` in their tags), and decodes only the chosen samples' tokens, after
  ``_compute_metrics`` and before the clear.
- **legacy** (``RayPPOTrainer``): the whole step's ``DataProto`` is on the driver when
  ``fit()`` calls ``compute_data_metrics(batch=...)`` (``ray_trainer.py`` ~1772), which the
  capture wraps.
- **validation**, both: verl decodes every validation sample itself; the capture takes
  those texts (``_maybe_log_val_generations``) and the scores, uids and data sources
  ``_val_metrics_update`` gets, as ``validation`` samples of the step. Their lengths are in
  characters (verl keeps no token counts there) and ``truncated`` is not derived.

Per sample: the reward is the sum of its per-token scores before any KL penalty
(``token_level_scores``; v1's ``rm_scores``), the advantage its first response token's
(GRPO's is the same on every token; PPO's GAE there is the whole response's), named scores
the numeric ``reward_extra_info`` entries (the rest are named in ``dropped_scores``),
``aborted`` a response of no tokens (verl's own test), and ``truncated`` derived per sample:
its response reached ``rollout.response_length`` or prompt and response together
``rollout.max_model_len`` (verl's ``response_length/clip_ratio`` compares with the padded
width, and its server maps ``length`` and ``stop`` to one finish reason: verl #7823).
A capture that fails logs one warning and leaves training alone.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlpulse.producers.caller.samples import (
    TOKEN_TAIL,
    RawText,
    codes,
    response_identity,
    text_identity,
    text_repetition,
    token_repetition,
)
from rlpulse.producers.encoding.samples import Floats, Ints, SampleColumns

if TYPE_CHECKING:
    from rlpulse.producers.caller.link import RunLink

__all__ = ["bind", "install", "tensor_samples"]

log = logging.getLogger(__name__)

_LINKS: weakref.WeakKeyDictionary[Any, RunLink] = weakref.WeakKeyDictionary()
"""The run link bound to each verl trainer (its ``fit()`` built the rlpulse backend)."""
_LAST: list[weakref.ref[Any]] = []
"""The trainer bound last (what the legacy ``compute_data_metrics`` capture serves)."""
_V1_DATA: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "rlpulse_v1_metric_data", default=None
)
_VALIDATION = "_rlpulse_validation_texts"
_INSTALLED: list[bool] = []


def bind(trainer: Any, link: RunLink) -> None:
    """Send ``trainer``'s samples through ``link`` (the backend its ``fit()`` built)."""
    _LINKS[trainer] = link
    _LAST[:] = [weakref.ref(trainer)]


def _link(trainer: Any) -> RunLink | None:
    link = _LINKS.get(trainer)
    if link is None or link.closed or not link.settings.samples.enabled:
        return None
    return link


def _safely(what: str, work: Callable[[], None]) -> None:
    try:
        work()
    except Exception as exc:  # a capture must never stop training
        if not getattr(_safely, "warned", False):
            _safely.warned = True  # type: ignore[attr-defined]
            log.warning("rlpulse: %s failed; training goes on: %r", what, exc, exc_info=True)


# -- the columns of a step's samples -----------------------------------------------------------


def _edge(values: Ints, starts: Ints, ends: Ints, width: int, tail: bool) -> Ints:
    """The last (or first) ``width`` items of each row of a flat array, -1 where a row is short."""
    places = np.arange(width)
    at = (ends[:, None] - width + places) if tail else (starts[:, None] + places)
    inside = (at >= starts[:, None]) & (at < ends[:, None])
    picked = values[np.clip(at, 0, max(0, len(values) - 1))] if len(values) else np.zeros_like(at)
    return np.where(inside, picked, -1).astype(np.int64)


Ragged = tuple[Floats, Ints]
"""Every sample's values one after another, and where each sample's begin (with the end)."""


def _per_sample(ragged: Ragged) -> tuple[Floats, Ints]:
    """Each sample's sum of its values, and how many it has (one pass, ``np.add.reduceat``)."""
    values, offsets = ragged
    counts = np.diff(offsets).astype(np.int64)
    if not len(values):
        return np.zeros(len(counts)), counts
    # In the values' own precision (verl's scores are float32): one pass over the step's tokens.
    sums = np.add.reduceat(values, np.minimum(offsets[:-1], len(values) - 1))
    return np.where(counts > 0, sums.astype(np.float64), 0.0), counts


def tensor_samples(
    *,
    response_ids: Ints,
    response_offsets: Ints,
    prompt_length: Ints,
    scores: Ragged,
    advantages: Ragged | None,
    num_turns: Ints | None,
    uids: Sequence[Any],
    data_sources: Sequence[Any] | None,
    extras: Sequence[Mapping[str, Any]] | None,
    max_response_length: int | None,
    max_model_length: int | None,
) -> tuple[SampleColumns, Ints]:
    """The columns and response identities of a step's samples from flat token arrays.

    ``response_ids`` holds every sample's response tokens one after another; sample ``i``'s
    are ``response_offsets[i]`` to ``response_offsets[i + 1]``; ``scores`` and ``advantages``
    are per-token values laid out the same way, each with its own offsets (verl's padding
    rows do not always have as many of each). A sample's reward is the sum of its scores,
    ``np.add.reduceat`` over those runs (one pass over the step's tokens, no Python loop); its
    advantage is the one of its first response token.
    """
    starts, ends = response_offsets[:-1], response_offsets[1:]
    lengths = (ends - starts).astype(np.int64)
    count = len(lengths)
    reward, _ = _per_sample(scores)
    advantage = None
    if advantages is not None:
        values, offsets = advantages
        firsts = offsets[:-1]
        has = np.diff(offsets) > 0
        picked = values[np.minimum(firsts, max(0, len(values) - 1))] if len(values) else firsts
        advantage = np.where(has, picked.astype(np.float64), np.nan)
    tails = _edge(response_ids, starts, ends, TOKEN_TAIL, tail=True)
    heads = _edge(response_ids, starts, ends, TOKEN_TAIL, tail=False)
    truncated = np.zeros(count, dtype=np.bool_)
    if max_response_length:
        truncated |= lengths >= max_response_length
    if max_model_length:
        truncated |= prompt_length + lengths >= max_model_length
    group_names, group_codes = codes(uids)
    source_names, source_codes = codes(data_sources)
    named, dropped = _extras(extras, count)
    columns = SampleColumns(
        reward=reward,
        prompt_length=prompt_length.astype(np.int64),
        response_length=lengths,
        truncated=truncated,
        empty=lengths == 0,
        repetition=token_repetition(tails, lengths),
        aborted=lengths == 0,
        num_turns=None if num_turns is None else num_turns.astype(np.int64),
        advantage=advantage,
        groups=group_names,
        group=group_codes,
        data_sources=source_names,
        data_source=source_codes,
        scores=named,
        dropped_scores=dropped,
    )
    return columns, response_identity(tails, heads, lengths)


def _extras(
    extras: Sequence[Mapping[str, Any]] | None, count: int
) -> tuple[dict[str, Floats], list[str]]:
    """Verl's reward extras: a column per numeric name (NaN where missing), the rest named."""
    if not extras:
        return {}, []
    columns: dict[str, Floats] = {}
    dropped: set[str] = set()
    for row, extra in enumerate(extras):
        for name, value in (extra or {}).items():
            if name in dropped:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float | np.number):
                dropped.add(str(name))
                columns.pop(str(name), None)
                continue
            column = columns.get(str(name))
            if column is None:
                column = columns[str(name)] = np.full(count, math.nan)
            column[row] = float(value)
    return columns, sorted(dropped)


def _lengths(config: Any) -> tuple[int | None, int | None]:
    """``rollout.response_length`` and ``rollout.max_model_len`` of verl's config (or None)."""
    from omegaconf import OmegaConf

    response = OmegaConf.select(config, "actor_rollout_ref.rollout.response_length")
    if response is None:
        response = OmegaConf.select(config, "data.max_response_length")
    model = OmegaConf.select(config, "actor_rollout_ref.rollout.max_model_len")
    return (int(response) if response else None), (int(model) if model else None)


def _decode(tokenizer: Any, ids: Any) -> str:
    return str(tokenizer.decode(list(map(int, ids)), skip_special_tokens=True))


# -- v1: TransferQueue ------------------------------------------------------------------------


def _v1_capture(
    trainer: Any, batch: Any, data: Mapping[str, Any], link: RunLink, step: int
) -> None:
    """Log the samples of a v1 step from the data ``_compute_metrics`` fetched.

    A sample's group is the uid its key starts with (``{uid}_{session}_{i}``,
    ``AgentLoopWorkerTQ``'s); its data source and ground truth are its prompt's, which the
    driver read from the dataloader (``_fetch_one_gen_batch``, noted by :func:`_install_v1`).
    TransferQueue is asked only for what the driver never held: the reward extras (and, for
    samples whose prompt was not noted, the data source and ground truth), in one fetch.
    """
    import transfer_queue as tq

    keys = list(batch.keys)
    real = np.asarray([not tag.get("is_padding", False) for tag in batch.tags], dtype=np.bool_)
    responses, prompts = data["responses"], data["prompts"]
    response_offsets = responses.offsets().cpu().numpy().astype(np.int64, copy=False)
    prompt_offsets = prompts.offsets().cpu().numpy().astype(np.int64, copy=False)
    response_ids = responses.values().cpu().numpy().astype(np.int64, copy=False)
    prompt_ids = prompts.values().cpu().numpy().astype(np.int64, copy=False)
    uids = [_uid_of(key) for key in keys]
    noted: Mapping[str, tuple[Any, Any]] = getattr(trainer, _PROMPTS, {})
    known = all(uid in noted for uid in uids)
    fields = ["extra_fields"] if known else ["extra_fields", "data_source", "reward_model"]
    small = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=fields)
    got = names_in(small)
    if known:
        sources = [noted[uid][0] for uid in uids]
        truths = [noted[uid][1] for uid in uids]
    else:
        sources = _values(small["data_source"]) if "data_source" in got else [None] * len(keys)
        truths = [
            m.get("ground_truth") if isinstance(m, Mapping) else None
            for m in (_values(small["reward_model"]) if "reward_model" in got else [])
        ] or [None] * len(keys)
    extras = (
        [
            (e or {}).get("reward_extra_info", {}) if isinstance(e, Mapping) else {}
            for e in _values(small["extra_fields"])
        ]
        if "extra_fields" in got
        else None
    )
    score_field = "rm_scores" if "rm_scores" in data else "token_level_scores"
    advantages = _ragged(data["advantages"]) if "advantages" in data else None
    turns = data.get("num_turns")
    max_response, max_model = _lengths(trainer.config)
    columns, identity = tensor_samples(
        response_ids=response_ids,
        response_offsets=response_offsets,
        prompt_length=np.diff(prompt_offsets),
        scores=_ragged(data[score_field]),
        advantages=advantages,
        num_turns=None if turns is None else np.asarray(_values(turns), dtype=np.int64).reshape(-1),
        uids=uids,
        data_sources=sources,
        extras=extras,
        max_response_length=max_response,
        max_model_length=max_model,
    )
    keep = np.flatnonzero(real)
    if len(keep) != len(real):
        columns, identity = columns.take(keep), identity[keep]
    tokenizer = trainer.tokenizer

    def text_of(position: int) -> RawText:
        row = int(keep[position])
        truth = truths[row]
        prompt = prompt_ids[prompt_offsets[row] : prompt_offsets[row + 1]]
        response = response_ids[response_offsets[row] : response_offsets[row + 1]]
        return RawText(
            _decode(tokenizer, prompt),
            _decode(tokenizer, response),
            None if truth is None else str(truth),
        )

    link.events.log_sample_columns(columns, identity, text_of, step, "train")


def _uid_of(key: str) -> str:
    """The uid of an ``AgentLoopWorkerTQ`` key, ``{uid}_{session_id}_{index}``."""
    parts = key.rsplit("_", 2)
    return parts[0] if len(parts) == 3 else key


_PROMPTS = "_rlpulse_prompts"
"""The trainer's attribute: uid -> (data source, ground truth) of the prompts it fetched."""
_PROMPTS_KEPT = 1 << 16
"""Prompts remembered (their samples are captured a step or a few later)."""


def _note_prompts(trainer: Any, batch: Any) -> None:
    """Remember the data source and ground truth of each prompt of a dataloader batch."""
    present = names_in(batch)
    if "uid" not in present:
        return
    uids = [str(uid) for uid in _values(batch["uid"])]
    sources = _values(batch["data_source"]) if "data_source" in present else [None] * len(uids)
    models = _values(batch["reward_model"]) if "reward_model" in present else [None] * len(uids)
    noted: dict[str, tuple[Any, Any]] = getattr(trainer, _PROMPTS, None) or {}
    for uid, source, model in zip(uids, sources, models, strict=True):
        truth = model.get("ground_truth") if isinstance(model, Mapping) else None
        noted[uid] = (source, truth)
    while len(noted) > _PROMPTS_KEPT:
        del noted[next(iter(noted))]
    setattr(trainer, _PROMPTS, noted)


def _values(column: Any) -> list[Any]:
    """A TransferQueue field's values as a list (a tensor, a stack of non-tensors, a list)."""
    return list(column.tolist()) if hasattr(column, "tolist") else list(column)


def names_in(tensors: Any) -> set[str]:
    """The keys of a TensorDict (which refuses ``in``: it asks for ``.keys()``)."""
    return set(tensors.keys())


def _ragged(nested: Any) -> Ragged:
    """A nested (jagged) tensor's values and offsets, as numpy."""
    return (
        nested.values().float().cpu().numpy(),
        nested.offsets().cpu().numpy().astype(np.int64, copy=False),
    )


_V1_FIELDS = (
    "prompts", "responses", "rm_scores", "token_level_scores", "advantages", "num_turns"
)  # fmt: skip
"""What the v1 capture takes of ``_compute_metrics``' fetch."""


def _install_v1() -> None:
    from verl.trainer.ppo.v1 import trainer_base

    fetch = trainer_base.get_metric_data_with_optional_routed_experts
    compute = trainer_base.PPOTrainer._compute_metrics

    @functools.wraps(fetch)
    def fetched(*args: Any, **kwargs: Any) -> Any:
        data = fetch(*args, **kwargs)
        seen = _V1_DATA.get()
        if seen is not None:  # _compute_metrics pops some of them: keep what the capture needs
            got = names_in(data)
            seen.append({name: data[name] for name in _V1_FIELDS if name in got})
        return data

    @functools.wraps(compute)
    def compute_metrics(self: Any, batch: Any, metrics: Any, *args: Any, **kwargs: Any) -> Any:
        link = _link(self)
        if link is None:
            return compute(self, batch, metrics, *args, **kwargs)
        seen: list[Any] = []
        token = _V1_DATA.set(seen)
        try:
            result = compute(self, batch, metrics, *args, **kwargs)
        finally:
            _V1_DATA.reset(token)
        step = int(kwargs.get("global_steps", args[1] if len(args) > 1 else self.global_steps))
        if seen:
            _safely(
                "capturing verl's samples", lambda: _v1_capture(self, batch, seen[0], link, step)
            )
        return result

    fetch_prompts = trainer_base.PPOTrainer._fetch_one_gen_batch

    @functools.wraps(fetch_prompts)
    def fetch_one_gen_batch(self: Any) -> Any:
        batch = fetch_prompts(self)
        if _link(self) is not None:
            _safely("noting verl's prompts", lambda: _note_prompts(self, batch))
        return batch

    trainer_base.get_metric_data_with_optional_routed_experts = fetched
    trainer_base.PPOTrainer._compute_metrics = compute_metrics
    trainer_base.PPOTrainer._fetch_one_gen_batch = fetch_one_gen_batch


# -- legacy: the step's DataProto ---------------------------------------------------------------


def _legacy_capture(trainer: Any, batch: Any, link: RunLink, step: int) -> None:
    """Log the samples of a legacy step from its whole ``DataProto``."""
    tensors = batch.batch
    present = names_in(tensors)
    responses = tensors["responses"]
    width = responses.shape[-1]
    mask = tensors["response_mask"].bool()
    lengths = mask.sum(-1).cpu().numpy().astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    prompt_length = (
        tensors["attention_mask"][:, :-width].sum(-1).cpu().numpy().astype(np.int64)
        if "attention_mask" in present
        else np.zeros(len(lengths), dtype=np.int64)
    )
    extras_names = [
        name
        for name in batch.non_tensor_batch
        if name not in {"uid", "data_source", "reward_model", "raw_prompt", "__num_turns__",
                        "extra_info", "index", "tools_kwargs", "interaction_kwargs", "ability",
                        "multi_modal_data", "multi_modal_inputs", "raw_prompt_ids"}
    ]  # fmt: skip
    count = len(lengths)
    non_tensor = batch.non_tensor_batch
    extras = [{name: non_tensor[name][row] for name in extras_names} for row in range(count)]
    turns = non_tensor.get("__num_turns__")
    advantages = (
        (tensors["advantages"][mask].float().cpu().numpy(), offsets)
        if "advantages" in present
        else None
    )
    max_response, max_model = _lengths(trainer.config)
    columns, identity = tensor_samples(
        response_ids=responses[mask].cpu().numpy().astype(np.int64),
        response_offsets=offsets,
        prompt_length=prompt_length,
        scores=(tensors["token_level_scores"][mask].float().cpu().numpy(), offsets),
        advantages=advantages,
        num_turns=None if turns is None else np.asarray(turns, dtype=np.int64),
        uids=list(non_tensor.get("uid", [None] * count)),
        data_sources=list(non_tensor["data_source"]) if "data_source" in non_tensor else None,
        extras=extras,
        max_response_length=max_response,
        max_model_length=max_model,
    )
    tokenizer = trainer.tokenizer
    prompts = tensors["prompts"]
    attention = tensors["attention_mask"] if "attention_mask" in present else None
    truths = non_tensor.get("reward_model")

    def text_of(row: int) -> RawText:
        prompt = prompts[row]
        if attention is not None:
            prompt = prompt[attention[row, : prompt.shape[-1]].bool()]
        truth = (
            truths[row].get("ground_truth")
            if truths is not None and isinstance(truths[row], Mapping)
            else None
        )
        return RawText(
            _decode(tokenizer, prompt),
            _decode(tokenizer, responses[row][mask[row]]),
            None if truth is None else str(truth),
        )

    link.events.log_sample_columns(columns, identity, text_of, step, "train")


def _install_legacy() -> None:
    from verl.trainer.ppo import ray_trainer

    metrics_of = ray_trainer.compute_data_metrics

    @functools.wraps(metrics_of)
    def compute_data_metrics(batch: Any, use_critic: bool = True) -> Any:
        result = metrics_of(batch=batch, use_critic=use_critic)
        trainer = _LAST[0]() if _LAST else None
        link = None if trainer is None else _link(trainer)
        if link is not None and not hasattr(trainer, "trainer_mode"):
            step = int(getattr(trainer, "global_steps", 0))
            _safely("capturing verl's samples", lambda: _legacy_capture(trainer, batch, link, step))
        return result

    ray_trainer.compute_data_metrics = compute_data_metrics


# -- validation, both trainers ------------------------------------------------------------------


def _validation_capture(
    trainer: Any,
    link: RunLink,
    data_sources: Sequence[Any],
    uids: Sequence[Any],
    extras: Mapping[str, Sequence[Any]],
    turns: Any,
) -> None:
    texts = getattr(trainer, _VALIDATION, None)
    setattr(trainer, _VALIDATION, None)
    count = len(uids)
    rewards = np.asarray(list(extras.get("reward", [math.nan] * count)), dtype=np.float64)
    inputs, outputs = (
        (texts[0], texts[1]) if texts and len(texts[1]) == count else ([""] * count, [""] * count)
    )
    extra_rows = [
        {
            name: values[row]
            for name, values in extras.items()
            if name != "reward" and len(values) == count
        }
        for row in range(count)
    ]
    named, dropped = _extras(extra_rows, count)
    group_names, group_codes = codes(list(uids))
    source_names, source_codes = codes(list(data_sources))
    response_chars = np.asarray([len(text) for text in outputs], dtype=np.int64)
    flat_turns = None
    if turns is not None and len(turns):
        flat = np.concatenate([np.asarray(part).reshape(-1) for part in turns])
        flat_turns = flat.astype(np.int64) if len(flat) == count else None
    columns = SampleColumns(
        reward=rewards,
        prompt_length=np.asarray([len(text) for text in inputs], dtype=np.int64),
        response_length=response_chars,
        truncated=np.zeros(count, dtype=np.bool_),
        empty=np.asarray([not text.strip() for text in outputs], dtype=np.bool_),
        repetition=text_repetition(list(outputs)),
        num_turns=flat_turns,
        groups=group_names,
        group=group_codes,
        data_sources=source_names,
        data_source=source_codes,
        scores=named,
        dropped_scores=dropped,
    )
    identity = text_identity(list(outputs))
    step = int(getattr(trainer, "global_steps", 0))
    link.events.log_sample_columns(
        columns, identity, lambda row: RawText(inputs[row], outputs[row]), step, "validation"
    )


def _install_validation(trainer_class: Any) -> None:
    keep_texts = trainer_class._maybe_log_val_generations
    update = trainer_class._val_metrics_update

    @functools.wraps(keep_texts)
    def maybe_log_val_generations(self: Any, inputs: Any, outputs: Any, scores: Any) -> Any:
        if _link(self) is not None:
            setattr(self, _VALIDATION, (list(inputs), list(outputs)))
        return keep_texts(self, inputs=inputs, outputs=outputs, scores=scores)

    @functools.wraps(update)
    def val_metrics_update(
        self: Any, data_sources: Any, sample_uids: Any, reward_extra_infos_dict: Any,
        sample_turns: Any, *args: Any, **kwargs: Any,
    ) -> Any:  # fmt: skip
        link = _link(self)
        if link is not None:
            _safely(
                "capturing verl's validation samples",
                lambda: _validation_capture(
                    self,
                    link,
                    list(data_sources),
                    list(sample_uids),
                    reward_extra_infos_dict,
                    sample_turns,
                ),
            )
        return update(
            self, data_sources, sample_uids, reward_extra_infos_dict, sample_turns, *args, **kwargs
        )

    trainer_class._maybe_log_val_generations = maybe_log_val_generations
    trainer_class._val_metrics_update = val_metrics_update


def install() -> None:
    """Wrap verl's trainers where they hold the samples (see the module docstring); once."""
    if _INSTALLED:
        return
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    _install_v1()
    _install_legacy()
    _install_validation(PPOTrainer)
    _install_validation(RayPPOTrainer)
    _INSTALLED.append(True)
