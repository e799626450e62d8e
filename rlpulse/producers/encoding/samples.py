"""The encoders of one producer's rollout samples and chosen texts, and their batches.

Rollout samples travel as log records do (:mod:`rlpulse.producers.encoding.logs`): entries
encoded by the caller are the write-ahead log's frames, and the host's agent joins
consecutive entries behind the shared head of a ``SampleBatch`` or ``SampleTextBatch`` (the
run, rank, host and producer, once) without encoding again, splitting at
``logging.batch_max_bytes`` as it splits log batches.

A step of a large GRPO run has 16,384 samples, and a training loop cannot spend microseconds
on each: an entry of a ``SampleBatch`` is a *chunk* of consecutive samples of a step as
columns (``SampleChunk``), and :meth:`SampleEncoder.chunks` writes each column with numpy in
one piece (an Avro array of doubles is its count, the little-endian doubles and a zero; longs
are zig-zag varints, made for the whole column at once). A chunk stays under a quarter of the
batch limit, so a step of any size goes through in several messages, never cut. Its output
is byte-identical to the codec's (a unit test checks it); like the other fast encoders it
checks at its start that its layout writes what the codec writes for the newest
``SampleBatch`` schema, and encodes through fastavro otherwise (slower, still correct),
saying so once. The few texts a step go through fastavro.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from fastavro import schemaless_writer

from rlpulse.producers.encoding.events import avro_string, layout_agrees, zigzag
from rlpulse.producers.encoding.fields import RecordSource
from rlpulse.producers.encoding.logs import batch_body
from rlpulse.schemas.codec import SHARED_SAMPLE_FIELDS, Codec
from rlpulse.schemas.records import SampleChunk, SampleTextEntry

__all__ = ["SampleColumns", "SampleEncoder", "TextEntry", "varints"]

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

_END: Final = b"\x00"
_CHUNK_SHARE: Final = 4
"""A chunk holds at most this share of the batch limit (1/4)."""


def varints(values: npt.NDArray[Any]) -> bytes:
    """Avro's zig-zag varints of every item of ``values`` (integers), one after the other."""
    if len(values) == 0:
        return b""
    signed = values.astype(np.int64, copy=False)
    folded = ((signed << 1) ^ (signed >> 63)).view(np.uint64)
    widths = np.ones(len(folded), dtype=np.int64)
    rest = folded >> np.uint64(7)
    while rest.any():
        widths += rest > 0
        rest >>= np.uint64(7)
    most = int(widths.max())
    places = np.arange(most)
    groups = np.empty((len(folded), most), dtype=np.uint8)
    for place in range(most):
        groups[:, place] = (folded >> np.uint64(7 * place)) & np.uint64(0x7F)
    groups |= np.where(places[None, :] < widths[:, None] - 1, 0x80, 0).astype(np.uint8)
    return groups[places[None, :] < widths[:, None]].tobytes()


def _array(count: int, items: bytes) -> bytes:
    return zigzag(count) + items + _END if count else _END


def _doubles(values: npt.NDArray[Any]) -> bytes:
    return _array(len(values), values.astype("<f8", copy=False).tobytes())


def _longs(values: npt.NDArray[Any]) -> bytes:
    return _array(len(values), varints(values))


def _booleans(values: npt.NDArray[Any]) -> bytes:
    return _array(len(values), values.astype(np.uint8, copy=False).tobytes())


def _strings(values: Sequence[str]) -> bytes:
    return _array(len(values), b"".join(avro_string(value) for value in values))


@dataclass
class SampleColumns:
    """One step's samples of one rank as columns: sample ``i``'s numbers are item ``i`` of each.

    :mod:`rlpulse.producers.caller.samples` builds them from a caller's mappings or from a
    framework's tensors. ``group`` and ``data_source`` are codes into ``groups`` and
    ``data_sources`` (-1: none); an optional column left None is absent for every sample.
    """

    reward: Floats
    prompt_length: Ints
    response_length: Ints
    truncated: Bools
    empty: Bools
    repetition: Floats
    aborted: Bools | None = None
    num_turns: Ints | None = None
    advantage: Floats | None = None
    """NaN where a sample has none."""
    groups: list[str] = field(default_factory=list)
    group: Ints | None = None
    data_sources: list[str] = field(default_factory=list)
    data_source: Ints | None = None
    scores: dict[str, Floats] = field(default_factory=dict)
    """Named scores, each a column (NaN where a sample has none)."""
    dropped_scores: list[str] = field(default_factory=list)
    """Names of extras that were not numbers (the same for every sample of the step)."""

    def __len__(self) -> int:
        return len(self.reward)

    def take(self, keep: Ints) -> SampleColumns:
        """The samples at the indices ``keep``, in that order (the names stay as they are)."""

        def pick(values: Any) -> Any:
            return None if values is None else values[keep]

        return SampleColumns(
            reward=self.reward[keep],
            prompt_length=self.prompt_length[keep],
            response_length=self.response_length[keep],
            truncated=self.truncated[keep],
            empty=self.empty[keep],
            repetition=self.repetition[keep],
            aborted=pick(self.aborted),
            num_turns=pick(self.num_turns),
            advantage=pick(self.advantage),
            groups=self.groups,
            group=pick(self.group),
            data_sources=self.data_sources,
            data_source=pick(self.data_source),
            scores={name: values[keep] for name, values in self.scores.items()},
            dropped_scores=self.dropped_scores,
        )


@dataclass
class TextEntry:
    """The texts of one chosen sample, ready to encode (already cut and redacted)."""

    sample_index: int
    group: str | None
    data_source: str | None
    reward: float
    chosen: list[str]
    prompt: str | None
    prompt_chars: int
    response_head: str
    response_tail: str
    response_chars: int
    response_digest: str
    ground_truth: str | None


class SampleEncoder:
    """Encodes one producer's samples (:meth:`chunks`) and texts (:meth:`text_entry`).

    ``samples_head`` and ``texts_head`` are what every batch of each starts with. Not
    thread-safe: its caller holds the logger's lock.
    """

    def __init__(self, source: RecordSource, codec: Codec) -> None:
        self.source = source
        self._codec = codec
        shared = self._shared()
        self.samples_head = codec.encode("SampleBatch", {**shared, "entries": []})[:-1]
        """The bytes every SampleBatch of this producer starts with."""
        self.texts_head = codec.encode("SampleTextBatch", {**shared, "entries": []})[:-1]
        """The bytes every SampleTextBatch of this producer starts with."""
        batch = codec.registry.latest("SampleBatch")
        self._chunk_schema: Any = _items(batch.parsed)
        self._text_schema: Any = _items(codec.registry.latest("SampleTextBatch").parsed)
        self.fast = layout_agrees(
            "SampleEncoder",
            f"SampleBatch v{batch.version} ({batch.path})",
            [partial(self._sample, columns) for columns in _SAMPLES],
        )
        """Whether the numpy layout of a chunk is used (it writes what the codec writes)."""

    def _shared(self) -> dict[str, Any]:
        source = self.source
        values = {
            "run_id": source.run_id,
            "attempt": source.attempt,
            "rank": source.rank,
            "tags": dict(source.tags),
            "hostname": source.hostname,
            "pid": source.pid,
            "producer_id": source.producer_id,
        }
        return {name: values[name] for name in SHARED_SAMPLE_FIELDS}

    def _sample(self, columns: SampleColumns) -> tuple[bytes, bytes]:
        """Sample columns as a batch of one chunk, by numpy and by the codec."""
        fixed = (12, "train", 77, 1_700_000_000_000_000_000)
        fast = self._fast_chunk(columns, 0, len(columns), *fixed)
        record = chunk_record(columns, 0, len(columns), *fixed)
        wanted = self._codec.encode("SampleBatch", {**self._shared(), "entries": [record]})
        return self.samples_head + batch_body([fast]), wanted

    def chunks(
        self,
        columns: SampleColumns,
        step: int,
        split: str,
        first_seq: int,
        timestamp_ns: int,
        max_bytes: int,
    ) -> list[bytes]:
        """The ``SampleChunk`` bodies of ``columns``, seqs from ``first_seq``, each small enough.

        A chunk is at most a quarter of ``max_bytes`` (the batch limit), so that a message
        of the agent's holds one or more whole chunks.
        """
        count = len(columns)
        budget = max(1024, max_bytes // _CHUNK_SHARE)
        rows = max(1, min(count, budget // _bytes_per_sample(columns)))
        out: list[bytes] = []
        start = 0
        while start < count:
            stop = min(count, start + rows)
            seq = first_seq + len(out)
            encoded = (
                self._fast_chunk(columns, start, stop, step, split, seq, timestamp_ns)
                if self.fast
                else self._schema_chunk(
                    chunk_record(columns, start, stop, step, split, seq, timestamp_ns)
                )
            )
            if len(encoded) > budget and stop - start > 1:
                rows = max(1, (stop - start) // 2)
                continue
            out.append(encoded)
            start = stop
        return out

    def _schema_chunk(self, record: SampleChunk) -> bytes:
        buffer = io.BytesIO()
        schemaless_writer(buffer, self._chunk_schema, record)
        return buffer.getvalue()

    def _fast_chunk(
        self,
        columns: SampleColumns,
        start: int,
        stop: int,
        step: int,
        split: str,
        seq: int,
        timestamp_ns: int,
    ) -> bytes:
        """Samples ``start`` to ``stop`` as a chunk's body, each column written by numpy."""
        part = slice(start, stop)
        count = stop - start
        scores = columns.scores
        groups, group = _recoded(columns.groups, columns.group, part)
        sources, source = _recoded(columns.data_sources, columns.data_source, part)
        return b"".join(
            (
                zigzag(seq),
                zigzag(timestamp_ns),
                zigzag(step),
                avro_string(split),
                zigzag(start),
                _doubles(columns.reward[part]),
                _longs(columns.prompt_length[part]),
                _longs(columns.response_length[part]),
                _booleans(columns.truncated[part]),
                _booleans(columns.empty[part]),
                _doubles(columns.repetition[part]),
                _END if columns.aborted is None else _booleans(columns.aborted[part]),
                _END if columns.num_turns is None else _longs(columns.num_turns[part]),
                _END if columns.advantage is None else _doubles(columns.advantage[part]),
                _strings(groups),
                _END if group is None else _array(count, varints(group)),
                _strings(sources),
                _END if source is None else _array(count, varints(source)),
                (
                    zigzag(len(scores))
                    + b"".join(
                        avro_string(name) + _doubles(values[part])
                        for name, values in scores.items()
                    )
                    + _END
                )
                if scores
                else _END,
                _strings(columns.dropped_scores),
            )
        )

    def text_entry(
        self, text: TextEntry, step: int, split: str, seq: int, timestamp_ns: int
    ) -> bytes:
        """The ``SampleTextEntry`` body of one chosen sample."""
        entry: SampleTextEntry = {
            "seq": seq,
            "timestamp_ns": timestamp_ns,
            "step": step,
            "split": split,
            "sample_index": text.sample_index,
            "group": text.group,
            "data_source": text.data_source,
            "reward": text.reward,
            "chosen": list(text.chosen),
            "prompt": text.prompt,
            "prompt_chars": text.prompt_chars,
            "response_head": text.response_head,
            "response_tail": text.response_tail,
            "response_chars": text.response_chars,
            "response_digest": text.response_digest,
            "ground_truth": text.ground_truth,
        }
        buffer = io.BytesIO()
        schemaless_writer(buffer, self._text_schema, entry)
        return buffer.getvalue()


def _bytes_per_sample(columns: SampleColumns) -> int:
    """A generous estimate of one sample's share of a chunk."""
    names = sum(len(name) for name in columns.groups[:64]) // max(1, min(64, len(columns.groups)))
    return 64 + 9 * len(columns.scores) + names


def _recoded(names: list[str], codes: Ints | None, part: slice) -> tuple[list[str], Ints | None]:
    """The distinct names a chunk uses and its samples' codes into them (-1: none)."""
    if codes is None:
        return [], None
    mine = codes[part]
    used = np.unique(mine[mine >= 0])
    remap = np.full(len(names) + 1, -1, dtype=np.int64)  # the last: -1's place
    remap[used] = np.arange(len(used))
    return [names[int(code)] for code in used], remap[mine]


def chunk_record(
    columns: SampleColumns,
    start: int,
    stop: int,
    step: int,
    split: str,
    seq: int,
    timestamp_ns: int,
) -> SampleChunk:
    """Samples ``start`` to ``stop`` of ``columns`` as the codec's ``SampleChunk``."""
    part = slice(start, stop)
    groups, group = _recoded(columns.groups, columns.group, part)
    sources, source = _recoded(columns.data_sources, columns.data_source, part)
    return {
        "seq": seq,
        "timestamp_ns": timestamp_ns,
        "step": step,
        "split": split,
        "first_index": start,
        "reward": columns.reward[part].tolist(),
        "prompt_length": columns.prompt_length[part].tolist(),
        "response_length": columns.response_length[part].tolist(),
        "truncated": columns.truncated[part].tolist(),
        "empty": columns.empty[part].tolist(),
        "repetition": columns.repetition[part].tolist(),
        "aborted": [] if columns.aborted is None else columns.aborted[part].tolist(),
        "num_turns": [] if columns.num_turns is None else columns.num_turns[part].tolist(),
        "advantage": [] if columns.advantage is None else columns.advantage[part].tolist(),
        "groups": groups,
        "group": [] if group is None else group.tolist(),
        "data_sources": sources,
        "data_source": [] if source is None else source.tolist(),
        "scores": {name: values[part].tolist() for name, values in columns.scores.items()},
        "dropped_scores": list(columns.dropped_scores),
    }


def _items(parsed: Mapping[str, Any]) -> Any:
    entries = next(f for f in parsed["fields"] if f["name"] == "entries")
    return entries["type"]["items"]


def _columns(**values: Any) -> SampleColumns:
    arrays: dict[str, Any] = {
        name: np.asarray(value) if isinstance(value, list) and name not in _LISTS else value
        for name, value in values.items()
    }
    return SampleColumns(**arrays)


_LISTS: Final = frozenset({"groups", "data_sources", "dropped_scores"})

_SAMPLES: Final[Sequence[SampleColumns]] = (
    _columns(
        reward=[0.5], prompt_length=[12], response_length=[300], truncated=[False],
        empty=[False], repetition=[0.0],
    ),
    _columns(
        reward=[-1.25, 2.0, float("nan")], prompt_length=[2**33, 0, 7],
        response_length=[-5, 2**40, 64], truncated=[True, False, False],
        empty=[False, True, False], repetition=[1.0, 0.125, 0.5],
        aborted=[True, False, False], num_turns=[3, 1, 2], advantage=[float("nan"), -0.75, 1.0],
        groups=["uid-7", "uid-8"], group=[1, -1, 1], data_sources=["gsm8k é"],
        data_source=[-1, 0, 0], scores={"acc": np.array([1.0, 0.0, 0.5])},
        dropped_scores=["pred", "note"],
    ),
)  # fmt: skip
"""Columns that set and unset every field: what the layout check encodes."""
