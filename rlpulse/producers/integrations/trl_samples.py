"""One rank's rollout samples of TRL's GRPO and RLOO trainers, from what their hooks saw.

:class:`~rlpulse.producers.integrations.trl_ranks.TrlRankMetrics` hands over what
``_calculate_rewards`` was called with on this rank (its inputs, prompts, completions and
completion ids), the rewards it returned for every rank, and what
``_generate_and_score_completions`` returned (this rank's prompt mask and advantages);
:func:`rank_samples` makes the columns of those samples (see that module for the trl 1.16
lines). Texts are what TRL decoded for its reward functions: nothing is decoded here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from rlpulse.producers.caller.samples import (
    TOKEN_TAIL,
    RawText,
    response_identity,
    token_repetition,
)
from rlpulse.producers.encoding.samples import Ints, SampleColumns
from rlpulse.schemas.records import SampleSplit

__all__ = ["GROUND_TRUTH_COLUMNS", "CapturedSamples", "rank_samples"]

GROUND_TRUTH_COLUMNS: Final = ("ground_truth", "solution", "answer", "reference")
"""Dataset columns taken as a sample's ground truth, the first present."""


@dataclass
class CapturedSamples:
    """One rank's samples of one generation, as the logger takes them."""

    columns: SampleColumns
    identity: Ints
    text_of: Callable[[int], RawText]
    step: int
    split: SampleSplit


def _text(value: Any) -> str:
    """A prompt or completion as text: a string, or a conversation's contents one per line."""
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence):
        parts = []
        for message in value:
            if isinstance(message, Mapping):
                content = message.get("content", "")
                role = message.get("role")
                text = content if isinstance(content, str) else str(content)
                parts.append(f"{role}: {text}" if role else text)
            else:
                parts.append(str(message))
        return "\n".join(parts)
    return str(value)


def _edges(ids: Sequence[Sequence[int]], width: int, tail: bool) -> Ints:
    out = np.full((len(ids), width), -1, dtype=np.int64)
    for row, tokens in enumerate(ids):
        part = list(tokens[-width:]) if tail else list(tokens[:width])
        if part:
            if tail:
                out[row, width - len(part) :] = part
            else:
                out[row, : len(part)] = part
    return out


def rank_samples(
    trainer: Any, arguments: tuple[Any, ...], every_rank: Any, output: Mapping[str, Any]
) -> CapturedSamples:
    """The samples of this rank's generation whose rewards and output the hooks saw."""
    inputs, prompts, completions, completion_ids = arguments[:4]
    count = len(prompts)
    index = int(trainer.accelerator.process_index)
    per_function = every_rank[index * count : (index + 1) * count].detach().float().cpu().numpy()
    weights = trainer.reward_weights.detach().float().cpu().numpy()
    unscorable = np.isnan(per_function).all(axis=1)
    reward = np.nansum(per_function * weights[None, :], axis=1)
    reward[unscorable] = np.nan
    training = bool(trainer.model.training)
    generations = int(trainer.num_generations if training else trainer.num_generations_eval)
    first = index * count
    group_codes = (first + np.arange(count)) // max(1, generations)
    lowest = int(group_codes.min()) if count else 0
    ids = [list(map(int, tokens)) for tokens in completion_ids]
    lengths = np.asarray([len(tokens) for tokens in ids], dtype=np.int64)
    tokenizer = trainer.processing_class
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    ends = {*trainer.eos_token_ids, tokenizer.pad_token_id}
    truncated = np.asarray([not tokens or tokens[-1] not in ends for tokens in ids], dtype=np.bool_)
    tails = _edges(ids, TOKEN_TAIL, tail=True)
    prompt_mask = output.get("prompt_mask")
    prompt_length = (
        prompt_mask.sum(dim=1).cpu().numpy().astype(np.int64)
        if prompt_mask is not None
        else np.zeros(count, dtype=np.int64)
    )
    advantages = output.get("advantages")
    sources = [row.get("data_source") if isinstance(row, Mapping) else None for row in inputs]
    source_names = sorted({str(s) for s in sources if s is not None})
    columns = SampleColumns(
        reward=reward.astype(np.float64),
        prompt_length=prompt_length,
        response_length=lengths,
        truncated=truncated,
        empty=lengths == 0,
        repetition=token_repetition(tails, lengths),
        advantage=None
        if advantages is None
        else advantages.detach().float().reshape(count, -1)[:, 0].cpu().numpy().astype(np.float64),
        groups=[f"prompt-{code}" for code in range(lowest, lowest + count)],
        group=(group_codes - lowest).astype(np.int64),
        data_sources=source_names,
        data_source=np.asarray(
            [-1 if s is None else source_names.index(str(s)) for s in sources], dtype=np.int64
        )
        if source_names
        else None,
        scores={
            str(name): per_function[:, column].astype(np.float64)
            for column, name in enumerate(trainer.reward_func_names)
        },
    )
    identity = response_identity(tails, _edges(ids, TOKEN_TAIL, tail=False), lengths)
    step = int(trainer.state.global_step) + (1 if training else 0)

    def text_of(position: int) -> RawText:
        row = inputs[position] if isinstance(inputs[position], Mapping) else {}
        truth = next((row[key] for key in GROUND_TRUTH_COLUMNS if row.get(key) is not None), None)
        return RawText(
            _text(prompts[position]),
            _text(completions[position]),
            None if truth is None else _text(truth),
        )

    return CapturedSamples(columns, identity, text_of, step, "train" if training else "validation")
