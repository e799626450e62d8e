"""A step's rollout samples: their columns, the step's statistics over them, the texts to send.

The pure core of sample capture; :meth:`EventLogger.log_samples
<rlpulse.producers.caller.logger.EventLogger.log_samples>` and the integrations (verl, TRL)
feed it and write what it returns. Everything here is a function of its inputs: the same
samples give the same statistics and choose the same texts (the random picks are seeded by
the step).

- :func:`columns_from_mappings` turns a hand-written loop's samples (mappings with
  ``prompt``, ``response``, ``reward`` ...) into :class:`SampleColumns`; a malformed sample is
  left out with a :class:`SampleProblem` naming its index and key, the others are kept.
- :func:`token_repetition` and :func:`text_repetition` score a loop in each response's tail
  (tokens where the capture has them, characters otherwise), for a whole step at once.
- :func:`step_statistics` are the metrics of the step's event (``samples/...``): the
  truncated, repetitive and empty shares, reward quantiles, the groups whose samples all got
  one reward, distinct responses per group, each named score's mean.
- :func:`choose_texts` picks the samples whose texts are sent, each with why;
  :func:`chosen_texts` makes their entries, each cut to its head and tail (:func:`text_entry`).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import numpy as np
import numpy.typing as npt

from rlpulse.producers.encoding.samples import Floats, Ints, SampleColumns, TextEntry
from rlpulse.settings import SamplesSettings

__all__ = [
    "REASONS",
    "RawText",
    "SampleProblem",
    "choose_texts",
    "chosen_texts",
    "codes",
    "columns_from_mappings",
    "cut",
    "response_identity",
    "step_statistics",
    "text_entry",
    "text_identity",
    "text_repetition",
    "token_repetition",
]

REASONS: Final = (
    "best", "worst", "truncated", "longest", "repetitive", "random", "data_source", "group"
)  # fmt: skip
"""Why a sample's texts were chosen, in the order the choice takes them."""

TOKEN_TAIL: Final = 64
"""Tokens of a response's tail that its repetition score looks at."""
TOKEN_GRAM: Final = 3
CHAR_TAIL: Final = 256
"""Characters (UTF-8 bytes) of a response's tail, where only text is given."""
CHAR_GRAM: Final = 8
_MIN_GRAMS: Final = 8
"""A tail with fewer n-grams than this scores 0 (too short to loop)."""
_MAX_SOURCE_METRICS: Final = 8
"""Data sources that get metrics of their own (the first ones, by name)."""
_METRIC_NAME: Final = re.compile(r"[^A-Za-z0-9_./-]")
_KEYS: Final = frozenset(
    {
        "prompt", "response", "reward", "scores", "group", "data_source", "prompt_length",
        "response_length", "truncated", "advantage", "ground_truth", "aborted", "num_turns",
        "response_ids",
    }
)  # fmt: skip
"""The keys a sample mapping may have."""


class RawText(NamedTuple):
    """One sample's texts as the capture has them (before they are cut and redacted)."""

    prompt: str
    response: str
    ground_truth: str | None = None


@dataclass(frozen=True)
class SampleProblem:
    """Why one sample of a call was left out: its index, the key, what is wrong."""

    index: int
    key: str
    detail: str

    def __str__(self) -> str:
        return f"sample {self.index}: {self.key!r} {self.detail}"


# -- columns from a hand-written loop's mappings ----------------------------------------------


def _number(value: object) -> float:
    if isinstance(value, str | bytes) or value is None or isinstance(value, bool):
        raise TypeError
    return float(value)  # type: ignore[arg-type]


def _whole(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if hasattr(value, "__index__"):
            return int(value.__index__())
        raise TypeError
    return value


def columns_from_mappings(
    samples: Sequence[Mapping[str, Any]],
) -> tuple[SampleColumns, list[RawText], Ints, list[SampleProblem]]:
    """The columns of the well-formed ``samples``, their texts, identities and the problems.

    Each kept sample's texts are its ``prompt``, ``response`` and ``ground_truth``; lengths
    not given are the texts' lengths in characters; ``truncated`` not given is False.
    """
    problems: list[SampleProblem] = []
    texts: list[RawText] = []
    rewards: list[float] = []
    prompt_lengths: list[int] = []
    response_lengths: list[int] = []
    truncated: list[bool] = []
    aborted: list[bool] = []
    turns: list[int] = []
    advantages: list[float] = []
    groups: list[str | None] = []
    sources: list[str | None] = []
    scores: list[Mapping[str, Any] | None] = []
    ids: list[Any] = []
    any_advantage = any_aborted = any_turns = False
    for index, sample in enumerate(samples):
        quick = _quick(sample)
        if quick is not None:
            (prompt, response, reward, prompt_length, response_length, cut, advantage, abort,
             turn, group, source, named, truth, tokens) = quick  # fmt: skip
            any_advantage = any_advantage or advantage is not _NAN
            any_aborted = any_aborted or abort is not None
            any_turns = any_turns or turn is not None
            texts.append(RawText(prompt, response, truth))
            rewards.append(reward)
            prompt_lengths.append(len(prompt) if prompt_length is None else prompt_length)
            response_lengths.append(len(response) if response_length is None else response_length)
            truncated.append(cut)
            advantages.append(advantage)
            aborted.append(bool(abort))
            turns.append(1 if turn is None else turn)
            groups.append(group)
            sources.append(source)
            scores.append(named)
            ids.append(tokens)
            continue
        try:
            if not isinstance(sample, Mapping):
                raise _Bad("", f"is a {type(sample).__name__}, not a mapping")
            unknown = sample.keys() - _KEYS
            if unknown:
                raise _Bad(
                    sorted(unknown)[0], f"is not a sample's key ({', '.join(sorted(_KEYS))})"
                )
            prompt, response = _text(sample, "prompt"), _text(sample, "response")
            truth = sample.get("ground_truth")
            if truth is not None and not isinstance(truth, str):
                truth = str(truth)
            reward = _field(sample, "reward", _number, "must be a number")
            given = sample.get
            prompt_length = _optional(sample, "prompt_length", _whole, len(prompt))
            response_length = _optional(sample, "response_length", _whole, len(response))
            cut = _optional(sample, "truncated", _flag, False)
            advantage = _optional(sample, "advantage", _number, math.nan)
            abort = _optional(sample, "aborted", _flag, False)
            turn = _optional(sample, "num_turns", _whole, 1)
            group, source = given("group"), given("data_source")
            named = given("scores")
            if named is not None and not isinstance(named, Mapping):
                raise _Bad("scores", "must be a mapping of names to numbers")
        except _Bad as bad:
            problems.append(SampleProblem(index, bad.key, bad.detail))
            continue
        any_advantage = any_advantage or "advantage" in sample
        any_aborted = any_aborted or "aborted" in sample
        any_turns = any_turns or "num_turns" in sample
        texts.append(RawText(prompt, response, truth))
        rewards.append(reward)
        prompt_lengths.append(prompt_length)
        response_lengths.append(response_length)
        truncated.append(cut)
        advantages.append(advantage)
        aborted.append(abort)
        turns.append(turn)
        groups.append(None if group is None else str(group))
        sources.append(None if source is None else str(source))
        scores.append(named)
        ids.append(sample.get("response_ids"))
    count = len(texts)
    named_columns, dropped = _score_columns(scores)
    responses = [text.response for text in texts]
    token_ids = [i for i in ids if i is not None]
    repetition = (
        token_repetition(_tails(ids), np.asarray(response_lengths, dtype=np.int64))
        if count and len(token_ids) == count
        else text_repetition(responses)
    )
    group_names, group_codes = codes(groups)
    source_names, source_codes = codes(sources)
    columns = SampleColumns(
        reward=np.asarray(rewards, dtype=np.float64),
        prompt_length=np.asarray(prompt_lengths, dtype=np.int64),
        response_length=np.asarray(response_lengths, dtype=np.int64),
        truncated=np.asarray(truncated, dtype=np.bool_),
        empty=np.asarray([not response.strip() for response in responses], dtype=np.bool_),
        repetition=repetition,
        aborted=np.asarray(aborted, dtype=np.bool_) if any_aborted else None,
        num_turns=np.asarray(turns, dtype=np.int64) if any_turns else None,
        advantage=np.asarray(advantages, dtype=np.float64) if any_advantage else None,
        groups=group_names,
        group=group_codes,
        data_sources=source_names,
        data_source=source_codes,
        scores=named_columns,
        dropped_scores=dropped,
    )
    return columns, texts, text_identity(responses), problems


_NAN: Final = math.nan
"""The advantage of a sample given none (one object: ``is`` tells it from a given NaN)."""


def _quick(sample: object) -> tuple[Any, ...] | None:
    """A plain sample's fields without a call per field; None: the careful path decides.

    The common case of a training loop: a dict of str texts, a float reward, ints and bools
    as they are. Anything else (numpy numbers, a tensor, a missing or unknown key) goes the
    careful way, which converts what it can and names what it cannot.
    """
    if type(sample) is not dict or not sample.keys() <= _KEYS:
        return None
    get = sample.get
    prompt, response, reward = get("prompt"), get("response"), get("reward")
    if type(prompt) is not str or type(response) is not str:
        return None
    if type(reward) is int:
        reward = float(reward)
    elif type(reward) is not float:
        return None
    prompt_length, response_length = get("prompt_length"), get("response_length")
    if (prompt_length is not None and type(prompt_length) is not int) or (
        response_length is not None and type(response_length) is not int
    ):
        return None
    cut, abort, turn = get("truncated", False), get("aborted"), get("num_turns")
    if type(cut) is not bool or (abort is not None and type(abort) is not bool):
        return None
    if turn is not None and type(turn) is not int:
        return None
    advantage = get("advantage", _NAN)
    if type(advantage) is not float:
        if type(advantage) is not int or advantage is None:
            return None
        advantage = float(advantage)
    named, truth = get("scores"), get("ground_truth")
    if (named is not None and type(named) is not dict) or (
        truth is not None and type(truth) is not str
    ):
        return None
    group, source = get("group"), get("data_source")
    return (
        prompt, response, reward, prompt_length, response_length, cut, advantage, abort, turn,
        None if group is None else str(group), None if source is None else str(source), named,
        truth, get("response_ids"),
    )  # fmt: skip


class _Bad(Exception):  # noqa: N818 -- control flow inside columns_from_mappings
    def __init__(self, key: str, detail: str) -> None:
        super().__init__(detail)
        self.key = key
        self.detail = detail


def _text(sample: Mapping[str, Any], key: str) -> str:
    if key not in sample:
        raise _Bad(key, "is missing")
    value = sample[key]
    if not isinstance(value, str):
        raise _Bad(key, f"must be a str, not {type(value).__name__}")
    return value


def _field(sample: Mapping[str, Any], key: str, convert: Callable[[object], Any], need: str) -> Any:
    if key not in sample:
        raise _Bad(key, "is missing")
    try:
        return convert(sample[key])
    except (TypeError, ValueError, OverflowError):
        raise _Bad(key, f"{need}, not {sample[key]!r:.40}") from None


def _optional(
    sample: Mapping[str, Any], key: str, convert: Callable[[object], Any], default: Any
) -> Any:
    value = sample.get(key)
    if value is None:
        return default
    try:
        return convert(value)
    except (TypeError, ValueError, OverflowError):
        raise _Bad(key, f"has the wrong type: {value!r:.40}") from None


def _flag(value: object) -> bool:
    if isinstance(value, bool | np.bool_):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise TypeError


def _score_columns(
    scores: Sequence[Mapping[str, Any] | None],
) -> tuple[dict[str, Floats], list[str]]:
    """A column per named score (NaN where a sample has none); names that were not numbers."""
    names: dict[str, None] = {}
    for named in scores:
        if named:
            names.update(dict.fromkeys(named))
    columns: dict[str, Floats] = {}
    dropped: list[str] = []
    for name in names:
        try:  # plain numbers: one pass in C
            columns[str(name)] = np.fromiter(
                (_NAN if named is None else named.get(name, _NAN) for named in scores),
                dtype=np.float64,
                count=len(scores),
            )
            continue
        except (TypeError, ValueError):
            pass  # a value that is not a plain number: one by one below
        values = np.full(len(scores), math.nan)
        numeric = True
        for index, named in enumerate(scores):
            if named is None or name not in named:
                continue
            try:
                values[index] = _number(named[name])
            except (TypeError, ValueError, OverflowError):
                numeric = False
                break
        if numeric:
            columns[str(name)] = values
        else:
            dropped.append(str(name))
    return columns, dropped


def codes(values: Sequence[Any] | None) -> tuple[list[str], Ints | None]:
    """Distinct names (as text) in first-seen order and each value's code (-1: None).

    ``(names, None)`` when every value is None (or there are none): the column is absent.
    """
    if values is None or all(value is None for value in values):
        return [], None
    names: dict[str, int] = {}
    found = np.fromiter(
        (-1 if value is None else names.setdefault(str(value), len(names)) for value in values),
        dtype=np.int64,
        count=len(values),
    )
    return list(names), found


def text_identity(responses: Sequence[str]) -> Ints:
    """A number per response that equal responses share, from its text (length, head, tail)."""
    if not responses:
        return np.zeros(0, dtype=np.int64)
    return np.asarray([hash((len(r), r[:64], r[-64:])) for r in responses], dtype=np.int64)


def _tails(ids: Sequence[Any]) -> Ints:
    """The last :data:`TOKEN_TAIL` token ids of each response, right-aligned, -1 before them."""
    out = np.full((len(ids), TOKEN_TAIL), -1, dtype=np.int64)
    for row, tokens in enumerate(ids):
        tail = tokens[-TOKEN_TAIL:]  # a list's slice: only the tail is converted
        if len(tail):
            out[row, TOKEN_TAIL - len(tail) :] = tail
    return out


# -- repetition ---------------------------------------------------------------------------------


def _gram_repetition(symbols: Ints, gram: int) -> Floats:
    """``1 - distinct/total`` n-grams of each row of ``symbols`` (-1: no symbol there)."""
    rows, width = symbols.shape
    if rows == 0 or width < gram:
        return np.zeros(rows)
    places = width - gram + 1
    valid = np.ones((rows, places), dtype=np.bool_)
    hashed = np.zeros((rows, places), dtype=np.uint64)
    for offset in range(gram):
        window = symbols[:, offset : offset + places]
        valid &= window >= 0
        hashed = hashed * np.uint64(0x100000001B3) + window.astype(np.uint64)
    # A window with a gap gets a value of its own, never equal to another.
    hashed = np.where(
        valid, hashed >> np.uint64(1), np.uint64(1 << 63) + np.arange(places, dtype=np.uint64)
    )
    ordered = np.sort(hashed, axis=1)
    distinct = 1 + np.count_nonzero(ordered[:, 1:] != ordered[:, :-1], axis=1)
    gaps = places - valid.sum(axis=1)
    total = places - gaps
    with np.errstate(invalid="ignore", divide="ignore"):
        score = 1.0 - (distinct - gaps) / total
    return np.where(total >= _MIN_GRAMS, score, 0.0)


def token_repetition(tails: Ints, lengths: Ints) -> Floats:
    """The repetition score of each response from its last :data:`TOKEN_TAIL` token ids.

    ``tails`` holds them right-aligned, -1 before a short response's first token. The score
    is the share of the tail's 3-grams that repeat one before them: a loop of period ``p``
    scores ``1 - p/62``, ordinary text near 0.
    """
    del lengths
    return _gram_repetition(tails, TOKEN_GRAM)


def text_repetition(responses: Sequence[str]) -> Floats:
    """The repetition score of each response from its last :data:`CHAR_TAIL` bytes of text.

    For a capture without token ids: the share of repeated 8-byte grams of the tail.
    """
    if not responses:
        return np.zeros(0)
    width = CHAR_TAIL
    raw = b"".join(r[-width:].encode()[-width:].rjust(width, b"\x00") for r in responses)
    symbols = np.frombuffer(raw, dtype=np.uint8).reshape(len(responses), width).astype(np.int64)
    # Padding bytes (the zeros before a short tail) are no symbols.
    lengths = np.fromiter(
        (min(width, len(r[-width:].encode())) for r in responses),
        dtype=np.int64,
        count=len(responses),
    )
    symbols[np.arange(width)[None, :] < (width - lengths)[:, None]] = -1
    return _gram_repetition(symbols, CHAR_GRAM)


def response_identity(tails: Ints, heads: Ints, lengths: Ints) -> Ints:
    """A number per response that equal responses share: its length, first and last tokens.

    Two responses count as the same (in ``samples/distinct_responses_per_group``) when their
    lengths and their first and last 64 tokens agree: a whole-response hash would read every
    token of the step.
    """
    weights = np.random.default_rng(7).integers(1, 2**62, size=tails.shape[1] + heads.shape[1])
    mixed = np.concatenate([tails, heads], axis=1).astype(np.int64) * weights
    identity: Ints = (mixed.sum(axis=1) * 31 + lengths).astype(np.int64)
    return identity


# -- the step's statistics ----------------------------------------------------------------------


def _metric_part(name: str) -> str:
    return _METRIC_NAME.sub("_", name)[:64] or "_"


def step_statistics(
    columns: SampleColumns, identity: Ints, repetition_threshold: float
) -> dict[str, float]:
    """The metrics of a step's event over all its samples (names under ``samples/``).

    Shares are over this rank's samples; quantiles too (the worker's mean over ranks of a
    quantile is not the quantile of all samples, but lies between the ranks' smallest and
    largest: docs/logs.md). Groups are this rank's: a group whose samples straddle ranks
    counts once on each, with its part there.
    """
    count = len(columns)
    stats: dict[str, float] = {"samples/count": float(count)}
    if count == 0:
        return stats
    reward = columns.reward
    finite = reward[np.isfinite(reward)]
    repetitive = columns.repetition >= repetition_threshold
    stats.update(
        {
            "samples/truncated_ratio": float(columns.truncated.mean()),
            "samples/repetitive_ratio": float(repetitive.mean()),
            "samples/empty_ratio": float(columns.empty.mean()),
            "samples/repetition_mean": float(columns.repetition.mean()),
            "samples/response_length_mean": float(columns.response_length.mean()),
            "samples/response_length_max": float(columns.response_length.max()),
            "samples/prompt_length_mean": float(columns.prompt_length.mean()),
        }
    )
    if columns.aborted is not None:
        stats["samples/aborted_ratio"] = float(columns.aborted.mean())
    if len(finite):
        p10, p50, p90 = np.quantile(finite, [0.1, 0.5, 0.9])
        stats.update(
            {
                "samples/reward_mean": float(finite.mean()),
                "samples/reward_std": float(finite.std()),
                "samples/reward_min": float(finite.min()),
                "samples/reward_max": float(finite.max()),
                "samples/reward_p10": float(p10),
                "samples/reward_p50": float(p50),
                "samples/reward_p90": float(p90),
            }
        )
    if columns.advantage is not None:
        advantage = columns.advantage[np.isfinite(columns.advantage)]
        if len(advantage):
            stats["samples/advantage_std"] = float(advantage.std())
    for name, values in columns.scores.items():
        known = values[np.isfinite(values)]
        if len(known):
            stats[f"samples/score/{_metric_part(name)}_mean"] = float(known.mean())
    if columns.group is not None:
        stats.update(_group_statistics(columns.group, reward, identity))
    if columns.data_source is not None:
        for code, source in sorted(enumerate(columns.data_sources), key=lambda item: item[1])[
            :_MAX_SOURCE_METRICS
        ]:
            mine = columns.data_source == code
            part = _metric_part(source)
            stats[f"samples/{part}/count"] = float(mine.sum())
            stats[f"samples/{part}/truncated_ratio"] = float(columns.truncated[mine].mean())
            known = reward[mine & np.isfinite(reward)]
            if len(known):
                stats[f"samples/{part}/reward_mean"] = float(known.mean())
    return stats


def _group_statistics(group: Ints, reward: Floats, identity: Ints) -> dict[str, float]:
    """Groups, the share whose samples all got one reward, distinct responses per group."""
    grouped = group >= 0
    if not grouped.any():
        return {}
    codes, rewards, ids = group[grouped], reward[grouped], identity[grouped]
    order = np.lexsort((rewards, codes))
    codes, rewards = codes[order], rewards[order]
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    sizes = np.diff(np.r_[starts, len(codes)])
    lowest = rewards[starts]
    highest = rewards[np.r_[starts[1:], len(codes)] - 1]
    several = sizes >= 2
    same = (lowest == highest) & several
    by_id = np.lexsort((ids[order], codes))
    id_codes, id_values = group[grouped][by_id], ids[by_id]
    new = np.r_[True, (id_codes[1:] != id_codes[:-1]) | (id_values[1:] != id_values[:-1])]
    distinct = np.add.reduceat(
        new.astype(np.int64), np.flatnonzero(np.r_[True, id_codes[1:] != id_codes[:-1]])
    )
    stats = {
        "samples/groups": float(len(starts)),
        "samples/distinct_responses_per_group": float(distinct.mean()),
    }
    if several.any():
        stats["samples/same_reward_group_ratio"] = float(same.sum() / several.sum())
    return stats


# -- which texts go ----------------------------------------------------------------------------


def choose_texts(
    columns: SampleColumns,
    count: int,
    group_count: int,
    repetition_threshold: float,
    step: int,
) -> dict[int, list[str]]:
    """The samples whose texts are sent, each with why (:data:`REASONS`), by sample index.

    A quarter of ``count`` each: the best and the worst rewards; the truncated (longest
    first), else the longest; the repetitive (most first), else random ones. Then one sample
    of each data source not yet among them, and up to ``group_count`` samples of one whole
    group: the one whose rewards spread most.
    """
    total = len(columns)
    chosen: dict[int, list[str]] = {}
    if total == 0 or (count == 0 and group_count == 0):
        return chosen

    def take(indices: Sequence[int] | npt.NDArray[Any], reason: str, limit: int) -> None:
        for index in list(indices)[:limit]:
            chosen.setdefault(int(index), []).append(reason)

    quarter = max(1, count // 4) if count else 0
    rng = np.random.default_rng(abs(step) + 1)
    reward = np.where(np.isfinite(columns.reward), columns.reward, -np.inf)
    by_reward = np.argsort(-reward, kind="stable")
    if quarter:
        take(by_reward, "best", quarter)
        take(
            np.argsort(
                np.where(np.isfinite(columns.reward), columns.reward, np.inf), kind="stable"
            ),
            "worst",
            quarter,
        )
        longest = np.argsort(-columns.response_length, kind="stable")
        cut = longest[columns.truncated[longest]]
        take(cut if len(cut) else longest, "truncated" if len(cut) else "longest", quarter)
        repetitive = np.argsort(-columns.repetition, kind="stable")
        looping = repetitive[columns.repetition[repetitive] >= repetition_threshold]
        if len(looping):
            take(looping, "repetitive", quarter)
        else:
            take(rng.permutation(total), "random", quarter)
    if columns.data_source is not None:
        present = {int(columns.data_source[i]) for i in chosen}
        for code in range(len(columns.data_sources)):
            if code not in present:
                members = np.flatnonzero(columns.data_source == code)
                if len(members):
                    take([int(rng.choice(members))], "data_source", 1)
    if columns.group is not None and group_count:
        spread_group = _widest_group(columns.group, reward)
        if spread_group is not None:
            take(np.flatnonzero(columns.group == spread_group), "group", group_count)
    return chosen


def _widest_group(group: Ints, reward: Floats) -> int | None:
    """The group whose rewards spread most (the first such), or None without groups."""
    codes = np.unique(group[group >= 0])
    if not len(codes):
        return None
    finite = np.where(np.isfinite(reward), reward, 0.0)
    spreads = [float(np.ptp(finite[group == code])) for code in codes]
    return int(codes[int(np.argmax(spreads))])


# -- one chosen sample's texts ------------------------------------------------------------------


def cut(text: str, max_chars: int) -> tuple[str, str]:
    """``text`` as its head and tail within ``max_chars`` (the tail empty when it fits)."""
    if len(text) <= max_chars:
        return text, ""
    head = max_chars // 2
    return text[:head], text[len(text) - (max_chars - head) :]


def _cut_whole(text: str, max_chars: int) -> str:
    head, tail = cut(text, max_chars)
    if not tail:
        return head
    return f"{head} [... {len(text) - len(head) - len(tail)} characters cut ...] {tail}"


def text_entry(
    index: int,
    reasons: list[str],
    raw: RawText,
    columns: SampleColumns,
    with_prompt: bool,
    max_text_chars: int,
    max_prompt_chars: int,
    redact: Callable[[str], str] | None,
) -> TextEntry:
    """Sample ``index``'s texts, redacted, then cut; its prompt only ``with_prompt``."""
    clean = redact if redact is not None else _same
    response = clean(raw.response)
    head, tail = cut(response, max_text_chars)
    prompt = clean(raw.prompt) if with_prompt else None
    truth = (
        None if raw.ground_truth is None else _cut_whole(clean(raw.ground_truth), max_prompt_chars)
    )
    group = (
        None
        if columns.group is None or columns.group[index] < 0
        else columns.groups[int(columns.group[index])]
    )
    source = (
        None
        if columns.data_source is None or columns.data_source[index] < 0
        else columns.data_sources[int(columns.data_source[index])]
    )
    return TextEntry(
        sample_index=index,
        group=group,
        data_source=source,
        reward=float(columns.reward[index]),
        chosen=reasons,
        prompt=None if prompt is None else _cut_whole(prompt, max_prompt_chars),
        prompt_chars=len(raw.prompt),
        response_head=head,
        response_tail=tail,
        response_chars=len(response),
        response_digest=hashlib.sha256(response.encode()).hexdigest()[:32],
        ground_truth=truth,
    )


def chosen_texts(
    columns: SampleColumns,
    text_of: Callable[[int], RawText],
    settings: SamplesSettings,
    step: int,
    redact: Callable[[str], str] | None,
) -> list[TextEntry]:
    """The texts to send of a step's samples, best reward first (``samples.*`` settings).

    ``text_of`` is called for the chosen samples only; a group's prompt goes with its first.
    """
    chosen = choose_texts(
        columns, settings.text_count, settings.group_texts, settings.repetition_threshold, step
    )
    prompts_sent: set[int] = set()
    entries = []
    for index in sorted(chosen, key=lambda i: (-float(columns.reward[i]), i)):
        group = -1 if columns.group is None else int(columns.group[index])
        entries.append(
            text_entry(
                index,
                chosen[index],
                text_of(index),
                columns,
                group < 0 or group not in prompts_sent,
                settings.max_text_chars,
                settings.max_prompt_chars,
                redact,
            )
        )
        prompts_sent.add(group)
    return entries


def _same(text: str) -> str:
    return text
