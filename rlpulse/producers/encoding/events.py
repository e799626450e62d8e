"""The hot-path encoder of one logger's TrainerEvents.

``Codec.encode`` re-parses the schema on every call (fastavro's ``schemaless_writer``),
about 18 us for an event of 20 metrics: more than everything else in ``log()``
together. A logger's events share most fields (run id, attempt, rank, tags, hostname,
pid, producer id), so :class:`EventEncoder` writes those bytes once and each event
adds only what changes. A trainer logs the same metric names step after step, so the
map's layout is made once per set of names and its values are packed (and checked to
be numbers) by one ``struct`` call: about 2.8 us for an event of 16 metrics (5 us
value by value, 18 us through fastavro).

The output is byte-identical to ``Codec.encode("TrainerEvent", ...)`` (a property test
checks it). The schema, not this module, is the authority: each encoder checks at its start
that its layout writes what the codec writes for the newest TrainerEvent schema (sample
events with every field set and unset); if the schema changed, every event goes through the
codec (slower, still correct) and a warning says the fast layout needs an update.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import get_args

from rlpulse.producers.encoding.fields import EventFields, RecordSource, resolved
from rlpulse.producers.exceptions import InvalidFieldError
from rlpulse.schemas.codec import MAGIC, Codec
from rlpulse.schemas.exceptions import EncodeError
from rlpulse.schemas.records import EventKind, TrainerEvent
from rlpulse.schemas.validation import EventProblem, event_problem, metric_number, name_problem
from rlpulse.settings import EventLimits

log = logging.getLogger(__name__)

_KINDS: tuple[str, ...] = get_args(EventKind)  # in the order of the schema's enum symbols
_KIND_INDEX: dict[str, bytes] = {kind: bytes([index << 1]) for index, kind in enumerate(_KINDS)}
_DOUBLE = struct.Struct("<d").pack
_SMALL = [bytes([(n << 1) if n >= 0 else ((-n << 1) - 1)]) for n in range(-64, 64)]
_NULL = b"\x00"
_TWO_NULLS = _NULL + _NULL
_END_OF_MAP = b"\x00"


def zigzag(number: int) -> bytes:
    """Avro's variable-length zig-zag encoding of an ``int`` or ``long``."""
    if -64 <= number < 64:
        return _SMALL[number + 64]
    number = (number << 1) ^ (number >> 63)
    if number < 0x4000:  # two or three bytes (up to 2**20): no loop
        return bytes(((number & 0x7F) | 0x80, number >> 7))
    if number < 0x200000:
        return bytes(((number & 0x7F) | 0x80, ((number >> 7) & 0x7F) | 0x80, number >> 14))
    out = bytearray()
    while number > 0x7F:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


class TimestampVarint:
    """Zig-zag varints of nanosecond timestamps, the bits above the lowest 21 remembered.

    A timestamp's 9-byte varint changes only in its first three bytes within ~1 ms (2**21
    ns, after zig-zag), so those are computed and the rest reused: about a fifth of the
    cost of :func:`zigzag` for such numbers.
    """

    _LOW_BITS = 21

    def __init__(self) -> None:
        self._high = -1
        self._tail = b""

    def __call__(self, number: int) -> bytes:
        """``zigzag(number)``, fast for numbers of 2**20 and more."""
        if number < 1 << (self._LOW_BITS - 1):
            return zigzag(number)
        folded = number << 1
        high = folded >> self._LOW_BITS
        if high != self._high:
            out = bytearray()
            rest = high
            while rest > 0x7F:
                out.append((rest & 0x7F) | 0x80)
                rest >>= 7
            out.append(rest)
            self._high, self._tail = high, bytes(out)
        return (
            bytes(
                (
                    (folded & 0x7F) | 0x80,
                    ((folded >> 7) & 0x7F) | 0x80,
                    ((folded >> 14) & 0x7F) | 0x80,
                )
            )
            + self._tail
        )


def avro_string(text: str) -> bytes:
    """An Avro ``string``: the UTF-8 length, then the bytes."""
    data = text.encode()
    return zigzag(len(data)) + data


def _optional_string(text: str | None) -> bytes:
    return _NULL if text is None else b"\x02" + avro_string(text)


def _optional_long(number: int | None) -> bytes:
    return _NULL if number is None else b"\x02" + zigzag(number)


def metric_value(key: object, value: object) -> float:
    """``value`` as a float; a non-str key or a non-numeric value raises, naming the key."""
    if not isinstance(key, str):
        raise InvalidFieldError("metrics", repr(key), key, "str metric names")
    number = metric_number(value)
    if number is None:
        raise InvalidFieldError("metrics", key, value, "a number")
    return number


def metric_values(metrics: Mapping[str, float]) -> dict[str, float]:
    """``metrics`` as a ``dict[str, float]``; a non-numeric value raises, naming its key."""
    if not isinstance(metrics, Mapping):
        raise InvalidFieldError("metrics", None, metrics, "a mapping of metric name to number")
    return {key: metric_value(key, value) for key, value in metrics.items()}


_SAMPLES = (
    EventFields("metrics", 7, "actor", 4, {"loss": 0.5, "kl": -1e300, "n": 3}),
    EventFields("log", -(2**40), "rollout", 1, {}, "WARNING", "text é", 2**33, "trace-1"),
)
"""Events that set and unset every field the caller gives: what the layout check encodes."""


_SAMPLE_NS = 1_700_000_000_000_000_000
_SAMPLE_SEQ = 4242


def layout_agrees(
    encoder: str, schema: str, samples: Iterable[Callable[[], tuple[bytes, bytes]]]
) -> bool:
    """Whether a fast encoder writes what the codec writes: each sample gives (fast, codec).

    On the first difference (or error) it says so once and returns False: the encoder then
    encodes through fastavro.
    """
    for sample in samples:
        try:
            fast, wanted = sample()
            agrees = fast == wanted
        except (EncodeError, KeyError, TypeError, ValueError):
            agrees = False
        if not agrees:
            log.warning(
                "%s's layout does not write %s; it encodes through fastavro (slower) until it "
                "is updated",
                encoder,
                schema,
            )
            return False
    return True


class RefusedEvent(Exception):  # noqa: N818 -- control flow inside the logger, never raised out
    """An event the worker would refuse, found while encoding it (a metric name too long)."""

    def __init__(self, problem: EventProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


_MAX_REMEMBERED = 64
"""Sets of metric names (and stages) an encoder remembers the bytes of; others are encoded
each time (metrics value by value)."""


class _MetricShape:
    """The layout of a metrics map with given names: their bytes, and one ``struct`` for all.

    The struct's format interleaves each name's bytes (``<n>s``) with its double (``d``):
    the Avro map body in one ``pack``.
    """

    __slots__ = ("arguments", "count", "key_bytes", "pack")

    def __init__(self, key_bytes: list[bytes]) -> None:
        self.key_bytes = key_bytes
        self.count = zigzag(len(key_bytes))
        self.pack = struct.Struct("<" + "".join(f"{len(key)}sd" for key in key_bytes)).pack
        self.arguments: list[object] = [part for key in key_bytes for part in (key, 0.0)]


class EventEncoder:
    """Encodes the TrainerEvents of one :class:`RecordSource` (validating the metrics).

    A metric name longer than ``limits`` allow raises :class:`RefusedEvent`; on the slow
    path (a schema the precomputed layout does not write) the whole event is validated.
    """

    def __init__(self, source: RecordSource, codec: Codec, limits: EventLimits) -> None:
        self.source = source
        self._codec = codec
        self._limits = limits
        schema = codec.registry.latest("TrainerEvent")
        self.fast = True
        """Whether the precomputed layout is used (it writes what the codec writes)."""
        run = avro_string(source.run_id) + zigzag(source.attempt)
        self._starts = {
            kind: MAGIC + schema.fingerprint + index + run for kind, index in _KIND_INDEX.items()
        }
        """Each kind's first bytes: the header, the kind, the run and the attempt."""
        self._rank_bytes = zigzag(source.rank)
        tags = b""
        if source.tags:
            pairs = b"".join(avro_string(k) + avro_string(v) for k, v in source.tags.items())
            tags = zigzag(len(source.tags)) + pairs
        self._tags = tags + _END_OF_MAP
        self._no_text = _END_OF_MAP + _NULL + _NULL + self._tags
        """From the end of the metrics to the tags, for an event without level and message."""
        self._host_bytes = (
            avro_string(source.hostname) + zigzag(source.pid) + avro_string(source.producer_id)
        )
        self._timestamp = TimestampVarint()
        self._stages: dict[str, bytes] = {}
        self._keys: dict[str, bytes] = {}
        self._shapes: dict[tuple[str, ...], _MetricShape] = {}
        self.fast = layout_agrees(
            "EventEncoder",
            f"TrainerEvent v{schema.version} ({schema.path})",
            [partial(self._sample, sample) for sample in _SAMPLES],
        )

    def _sample(self, event: EventFields) -> tuple[bytes, bytes]:
        """One sample event, by the fast layout and by the codec."""
        record = self.record(event, _SAMPLE_NS, _SAMPLE_SEQ)
        return self.encode(event, _SAMPLE_NS, _SAMPLE_SEQ), self._codec.encode(
            "TrainerEvent", record
        )

    def encode(self, event: EventFields, timestamp_ns: int, seq: int) -> bytes:
        """The single-object encoding of one event; its fields other than metrics are checked."""
        metrics, world_size = event.metrics, event.world_size
        if world_size is None:
            raise ValueError("world_size was not filled in before encoding")
        if type(metrics) is not dict and not isinstance(metrics, Mapping):  # dict: no ABC check
            raise InvalidFieldError("metrics", None, metrics, "a mapping of metric name to number")
        if not self.fast:
            record = self.record(event, timestamp_ns, seq)
            problem = event_problem(record, self._limits)
            if problem is not None:
                raise RefusedEvent(problem)
            return self._codec.encode("TrainerEvent", record)
        out = [
            self._starts[event.kind],
            zigzag(event.step),
            self._stages.get(event.stage) or self._stage_bytes(event.stage),
            self._rank_bytes,
            zigzag(world_size),
        ]
        if metrics:
            out += self._metric_bytes(metrics)
        level, message = event.level, event.message
        if level is None and message is None:
            out.append(self._no_text)
        else:
            out += (_END_OF_MAP, _optional_string(level), _optional_string(message), self._tags)
        out += (self._timestamp(timestamp_ns), self._host_bytes, zigzag(seq))
        policy_version, trace_id = event.policy_version, event.trace_id
        if policy_version is None and trace_id is None:
            out.append(_TWO_NULLS)
        else:
            out += (_optional_long(policy_version), _optional_string(trace_id))
        return b"".join(out)

    def _stage_bytes(self, stage: str) -> bytes:
        """A stage as Avro bytes, remembered for the first :data:`_MAX_REMEMBERED` stages."""
        found = avro_string(stage)
        if len(self._stages) < _MAX_REMEMBERED:
            self._stages[stage] = found
        return found

    def _metric_bytes(self, metrics: Mapping[str, float]) -> tuple[bytes, ...]:
        """The map's count and its key/value pairs (without the end of the map).

        A trainer logs the same metric names step after step: their layout is made once
        per set of names (a :class:`_MetricShape`) and the values are packed by one
        ``struct`` call. Anything that call refuses (a value that is not a plain number)
        goes through the checks of each value, which raise naming the key.
        """
        names = tuple(metrics)
        shape = self._shapes.get(names)
        if shape is None:
            key_bytes = [self._key_bytes(key) for key in names]
            if len(self._shapes) >= _MAX_REMEMBERED:
                return self._metric_pairs(metrics, key_bytes)
            shape = self._shapes[names] = _MetricShape(key_bytes)
        arguments = shape.arguments.copy()
        arguments[1::2] = metrics.values()
        try:
            return shape.count, shape.pack(*arguments)
        except (struct.error, TypeError, ValueError, RuntimeError, OverflowError):
            return self._metric_pairs(metrics, shape.key_bytes)

    def _key_bytes(self, key: str) -> bytes:
        """A metric name as Avro bytes, checked once (not a str, or too long: raises)."""
        prefix = self._keys.get(key)
        if prefix is None:
            metric_value(key, 0.0)  # checks the key (a caller may pass any object)
            problem = name_problem(key, self._limits)
            if problem is not None:
                raise RefusedEvent(problem)
            prefix = self._keys[key] = avro_string(key)
        return prefix

    @staticmethod
    def _metric_pairs(metrics: Mapping[str, float], key_bytes: list[bytes]) -> tuple[bytes, ...]:
        """:meth:`_metric_bytes` one value at a time (each checked, raising naming its key)."""
        out = [zigzag(len(metrics))]
        for prefix, (key, value) in zip(key_bytes, metrics.items(), strict=True):
            out.append(prefix)
            out.append(_DOUBLE(value if type(value) is float else metric_value(key, value)))
        return tuple(out)

    def record(self, event: EventFields, timestamp_ns: int, seq: int) -> TrainerEvent:
        """The same event as a decoded record (what consumers see)."""
        source = self.source
        return {
            "kind": event.kind,
            "run_id": source.run_id,
            "attempt": source.attempt,
            "step": event.step,
            "stage": event.stage,
            "rank": source.rank,
            "world_size": resolved(event.world_size, "world_size"),
            "metrics": metric_values(event.metrics),
            "level": event.level,
            "message": event.message,
            "tags": source.tags,
            "timestamp_ns": timestamp_ns,
            "hostname": source.hostname,
            "pid": source.pid,
            "producer_id": source.producer_id,
            "seq": seq,
            "policy_version": event.policy_version,
            "trace_id": event.trace_id,
        }
