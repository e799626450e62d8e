"""The per-rank JSON Lines layout ``logs/<component>_rank<N>.jsonl``: writer and reader.

A file named just ``rank<N>.jsonl`` belongs to the component ``trainer`` (the seed's
naming supports both ``rank0.jsonl`` and ``rollout_rank1.jsonl``).

One file per (component, rank), one JSON object per line, metrics at the top level next to
the line's bookkeeping fields::

    {"stage":"rollout","step":120,"rank":0,"reward_mean":2.41,"kl_divergence":0.182,
     "timestamp_ns":1718000000000000000,"hostname":"node0"}

Non-finite values are written as Python's :mod:`json` writes them (``NaN``, ``Infinity``,
``-Infinity``) and read back the same way. The world size of a component is the number of
its rank files. Reading a line: the names of :class:`~rlpulse.schemas.records.TrainerEvent`
fields (``stage``, ``step``, ``rank``, ``timestamp_ns``, ``hostname``, ``pid``,
``attempt``, ...) are bookkeeping; every other key with a number value is a metric (the
layout cannot tell a numeric extra field from a metric); anything else is kept in
:attr:`RankRecord.fields` only.

A line that cannot be read is not skipped silently: readers yield a :class:`MalformedLine`
with its file and line number in its place. Trainer side: stdlib and ``rlpulse.schemas``
only.
"""

from __future__ import annotations

import datetime
import heapq
import json
import os
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeGuard

from rlpulse.closing import ClosedByWith
from rlpulse.schemas.records import TrainerEvent
from rlpulse.schemas.validation import metric_number, stage_problem

__all__ = [
    "DEFAULT_COMPONENT",
    "EVENT_FIELDS",
    "LOG_KIND",
    "MalformedLine",
    "RankFile",
    "RankLogWriter",
    "RankRecord",
    "list_rank_files",
    "metrics_line",
    "number_fields",
    "parse_rank_file",
    "rank_log_path",
    "read_json_lines",
    "read_rank_file",
    "read_rank_logs",
    "rotated_files",
    "world_sizes",
]

EVENT_FIELDS: Final = frozenset(TrainerEvent.__required_keys__ | TrainerEvent.__optional_keys__)
"""Names that are never metrics in a per-rank line: the fields of a TrainerEvent."""
LOG_KIND: Final = "log"
"""The ``kind`` of a line that holds a log record rather than metrics."""

_RANK_FILE = re.compile(r"(?:(?P<component>.+)_)?rank(?P<rank>\d+)\.jsonl")
DEFAULT_COMPONENT: Final = "trainer"
"""The component of a file named ``rank<N>.jsonl``."""
_SHOWN_CHARS = 120  # of a malformed line, in its report
_STAMP = "%Y%m%dT%H%M%S.%fZ"
_ROTATED = re.compile(r"\.jsonl\.\d{8}T\d{6}\.\d{6}Z(?:-\d+)?$")


@dataclass(frozen=True)
class MalformedLine:
    """A line that could not be read: where it is, why, and (the start of) its text."""

    path: Path
    line: int
    reason: str
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


def read_json_lines(
    path: str | os.PathLike[str],
) -> Iterator[tuple[int, dict[str, Any]] | MalformedLine]:
    """Yield ``(line number, object)`` per line, or a :class:`MalformedLine` in its place.

    A line is malformed when it is not UTF-8, not JSON, or not a JSON object. Blank lines
    (nothing but whitespace) carry no data and are skipped.
    """
    where = Path(path)
    with where.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                shown = raw[:_SHOWN_CHARS].decode("utf-8", "replace").rstrip()
                yield MalformedLine(where, number, f"not UTF-8 text ({exc.reason})", shown)
                continue
            try:
                value = json.loads(text.strip())
            except (ValueError, RecursionError) as exc:
                reason = f"not JSON ({exc})" if isinstance(exc, ValueError) else "nested too deep"
                yield MalformedLine(where, number, reason, text[:_SHOWN_CHARS].rstrip())
                continue
            if not isinstance(value, dict):
                reason = f"expected a JSON object, got {type(value).__name__}"
                yield MalformedLine(where, number, reason, text[:_SHOWN_CHARS].rstrip())
                continue
            yield number, value


# -- layout ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankFile:
    """One file of the layout: ``<directory>/<component>_rank<rank>.jsonl``."""

    path: Path
    component: str
    rank: int


def rank_log_path(directory: str | os.PathLike[str], component: str, rank: int) -> Path:
    """Path of the file of ``component`` and ``rank`` under ``directory``."""
    return Path(directory) / f"{component}_rank{rank}.jsonl"


def parse_rank_file(path: str | os.PathLike[str]) -> RankFile | None:
    """The :class:`RankFile` that ``path`` names, or ``None`` if its name is not a rank file's."""
    where = Path(path)
    found = _RANK_FILE.fullmatch(where.name)
    if found is None:
        return None
    return RankFile(where, found["component"] or DEFAULT_COMPONENT, int(found["rank"]))


def list_rank_files(directory: str | os.PathLike[str]) -> list[RankFile]:
    """The rank files directly under ``directory``, sorted by component, then rank.

    Other files are ignored. Raises ``ValueError`` when two files name the same component
    and rank (``x_rank1.jsonl`` and ``x_rank01.jsonl``), and ``NotADirectoryError`` when
    ``directory`` is not one.
    """
    root = Path(directory)
    if not root.is_dir():
        raise NotADirectoryError(f"{root} is not a directory")
    files: dict[tuple[str, int], RankFile] = {}
    for path in sorted(root.iterdir()):
        file = parse_rank_file(path)
        if file is None or not path.is_file():
            continue
        key = (file.component, file.rank)
        if key in files:
            raise ValueError(
                f"{files[key].path.name} and {path.name} are both rank {key[1]} of {key[0]!r}"
            )
        files[key] = file
    return [files[key] for key in sorted(files)]


def world_sizes(files: Iterable[RankFile]) -> dict[str, int]:
    """World size of each component: the number of its rank files."""
    return dict(Counter(file.component for file in files))


# -- writer ----------------------------------------------------------------------------------


def rotated_files(live: Path) -> list[Path]:
    """The rotated files of the live rank file ``live``, oldest first."""
    if not live.parent.is_dir():
        return []
    prefix = live.name + "."
    found = [
        path
        for path in live.parent.iterdir()
        if path.name.startswith(prefix) and _ROTATED.search(path.name)
    ]
    return sorted(found, key=_rotation_order)


def _rotation_order(path: Path) -> tuple[str, int]:
    """Rotated files sort by their time, then by the serial that keeps equal times apart."""
    stamp, _, serial = path.name.rpartition(".")[2].partition("-")
    return stamp, int(serial or 0)


class RankLogWriter(ClosedByWith):
    """Appends this rank's lines to ``<directory>/<component>_rank<rank>.jsonl``.

    The one writer of the layout's files (a logger's local copy,
    ``rlpulse.producers.caller.rankfiles``, hands its lines to one from a thread). The file
    (and ``directory``) is created at construction, so the rank counts towards the
    component's world size even before its first line. Lines are written whole and each
    reaches the OS when :meth:`write` (or :meth:`write_lines`) returns. Thread-safe.

    Write all metrics of one (stage, step) in one call: a reader without an ``attempt``
    field reads a step at or below the last one of the same stage and rank as the start of
    a resumed attempt (docs/design.md, "Attempts"). Every line carries the ``timestamp_ns``,
    ``hostname`` and ``pid`` of the process that wrote it.

    With ``rotation_bytes``, a file that would pass that size is renamed to
    ``<name>.jsonl.<UTC time>`` (no longer matching ``*.jsonl``: readers and shippers of live
    files do not read it twice) and a new one is started. With ``retention_s``, rotated files
    older than that (by modification time: when they were rotated) are deleted at each
    rotation and by :meth:`sweep`. ``clock`` (seconds since the epoch) names rotated files and
    decides their age; tests pass one.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        component: str,
        rank: int,
        *,
        hostname: str | None = None,
        rotation_bytes: int | None = None,
        retention_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(component, str) or not component or "/" in component or "\\" in component:
            raise ValueError(f"component must be a non-empty name without '/', got {component!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be an int >= 0, got {rank!r}")
        self.component = component
        self.rank = rank
        self.hostname = socket.gethostname() if hostname is None else hostname
        self.pid = os.getpid()
        self.path = rank_log_path(directory, component, rank)
        self.rotation_bytes = rotation_bytes
        self.retention_s = retention_s
        self.deleted: list[Path] = []
        """Rotated files this writer deleted after their retention."""
        self._clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._file = self.path.open("a", encoding="utf-8", buffering=1)
        self._size = self._file.tell()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._file.closed

    def write(self, step: int, stage: str, metrics: Mapping[str, float], **extra: Any) -> None:
        """Append one line: ``stage``, ``step``, ``rank``, the metrics, then the extras.

        ``timestamp_ns`` (default: now) and ``hostname`` (default: the writer's) may be
        given in ``extra``; other extras are written as they are (JSON-serialisable values;
        ``attempt=N`` spares readers inferring the attempt). The line is
        :func:`metrics_line`'s, with its rules: metric values are stored as floats; names of
        TrainerEvent fields are refused as metric names, and an extra may not repeat a metric.
        Raises ``ValueError`` (``TypeError`` for values JSON cannot hold) before anything is
        written.
        """
        if "rank" in extra:
            raise ValueError("rank is the writer's; make one RankLogWriter per rank")
        timestamp = extra.pop("timestamp_ns", None)
        if timestamp is not None and not _is_int(timestamp):
            raise ValueError(f"timestamp_ns must be an int (ns since the epoch), got {timestamp!r}")
        line = metrics_line(
            step,
            stage,
            self.rank,
            metrics,
            timestamp_ns=time.time_ns() if timestamp is None else timestamp,
            hostname=extra.pop("hostname", self.hostname),
            pid=extra.pop("pid", self.pid),
            extra=extra,
        )
        self._append([json.dumps(line, separators=(",", ":")) + "\n"])

    def write_lines(self, lines: Iterable[Mapping[str, Any]]) -> int:
        """Append lines made already (a logger's metrics lines and log records), in order.

        Values JSON cannot hold are written as their ``str``. Returns how many were written.
        """
        texts = [json.dumps(line, separators=(",", ":"), default=str) + "\n" for line in lines]
        self._append(texts)
        return len(texts)

    def sweep(self) -> list[Path]:
        """Delete the rotated files past the retention now (none without one); returns them."""
        if self.retention_s is None:
            return []
        cutoff = self._clock() - self.retention_s
        gone = []
        for path in rotated_files(self.path):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    gone.append(path)
            except FileNotFoundError:
                continue
        self.deleted += gone
        return gone

    def close(self) -> None:
        """Close the file; calling it again does nothing."""
        with self._lock:
            self._file.close()

    def _append(self, texts: list[str]) -> None:
        chunk: list[str] = []
        with self._lock:
            for text in texts:
                size = len(text) if text.isascii() else len(text.encode())
                limit = self.rotation_bytes
                if limit is not None and self._size and self._size + size > limit:
                    self._file.write("".join(chunk))
                    chunk.clear()
                    self._rotate()
                chunk.append(text)
                self._size += size
            self._file.write("".join(chunk))
            self._file.flush()

    def _rotate(self) -> None:
        self._file.close()
        stamp = datetime.datetime.fromtimestamp(self._clock(), datetime.UTC).strftime(_STAMP)
        target = self.path.with_name(f"{self.path.name}.{stamp}")
        serial = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.name}.{stamp}-{serial}")
            serial += 1
        os.replace(self.path, target)
        self._file = self.path.open("a", encoding="utf-8", buffering=1)
        self._size = 0
        self.sweep()


def metrics_line(
    step: int,
    stage: str,
    rank: int,
    metrics: Mapping[str, object],
    *,
    timestamp_ns: int,
    hostname: str,
    pid: int,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    """One metrics line of a rank file, as :class:`RankLogWriter` and a logger's local file make it.

    ``stage``, ``step``, ``rank``, the metrics as floats, ``timestamp_ns``, ``hostname``,
    ``pid``, then ``extra`` (``attempt``, ``run_id``, ...). Raises ``ValueError`` for a line
    a reader could not read back as it was meant: a step below 0, a stage the worker refuses,
    a metric that is not a number, a metric named like a TrainerEvent field
    (:data:`EVENT_FIELDS`: a reader takes it for the line's own field), or an extra that
    repeats a metric. :meth:`RankLogWriter.write` raises it to its caller; a logger's local
    file (``rlpulse.producers.caller.rankfiles``) leaves the line out, counted and warned once,
    because ``log()`` never raises.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    problem = stage_problem(stage)
    if problem is not None:
        raise ValueError(problem.detail)
    line: dict[str, Any] = {"stage": stage, "step": step, "rank": rank}
    for name, value in metrics.items():
        if not isinstance(name, str) or name in EVENT_FIELDS:
            raise ValueError(f"{name!r} cannot be a metric name (reserved or not a str)")
        line[name] = _as_float(name, value)
    clashes = sorted(name for name in extra if name in metrics)
    if clashes:
        raise ValueError(f"extra fields {clashes} repeat metric names")
    line["timestamp_ns"] = timestamp_ns
    line["hostname"] = hostname
    line["pid"] = pid
    line.update(extra)
    return line


def _as_float(name: str, value: object) -> float:
    number = metric_number(value)
    if number is None:
        raise ValueError(f"metric {name!r} must be a number, got {value!r}")
    return number


# -- reader ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankRecord:
    """One line of a rank file, read.

    ``fields`` is the whole line as read, with ``rank`` filled in from the file name when
    the line leaves it out; ``metrics`` its number-valued keys that are not TrainerEvent
    fields, as floats. ``stage`` defaults to the component when the line has none.
    """

    path: Path
    line: int
    component: str
    rank: int
    stage: str
    step: int
    metrics: dict[str, float]
    timestamp_ns: int | None
    fields: dict[str, Any]

    @property
    def attempt(self) -> int | None:
        """The line's ``attempt`` field, if it has one that is an int >= 0."""
        value = self.fields.get("attempt")
        return value if _is_int(value) and value >= 0 else None

    def to_event(self, run_id: str, world_size: int, attempt: int = 0) -> TrainerEvent:
        """The TrainerEvent this line stands for.

        The file is the producer (``producer_id`` is its path) and the line number is the
        ``seq``, so no two lines are ever taken for duplicates. A missing ``timestamp_ns``
        becomes 0.
        """
        fields = self.fields
        hostname, pid = fields.get("hostname"), fields.get("pid")
        return {
            "kind": "metrics",
            "run_id": run_id,
            "attempt": attempt,
            "step": self.step,
            "stage": self.stage,
            "rank": self.rank,
            "world_size": world_size,
            "metrics": dict(self.metrics),
            "level": None,
            "message": None,
            "tags": {},
            "timestamp_ns": self.timestamp_ns or 0,
            "hostname": hostname if isinstance(hostname, str) else "",
            "pid": pid if _is_int(pid) else 0,
            "producer_id": str(self.path),
            "seq": self.line,
            "policy_version": None,
            "trace_id": None,
        }


def read_rank_file(file: RankFile) -> Iterator[RankRecord | MalformedLine]:
    """Yield each line of one rank file as a record, or as a :class:`MalformedLine`.

    Malformed besides bad JSON: ``step`` missing or not an int >= 0, ``stage`` not a
    non-empty string without ``|``, ``rank`` other than the file's, ``timestamp_ns`` not
    an int. Log record lines (``"kind": "log"``, see :mod:`rlpulse.producers.caller.rankfiles`)
    are not metrics and are skipped.
    """
    for item in read_json_lines(file.path):
        if isinstance(item, MalformedLine):
            yield item
            continue
        number, fields = item
        if fields.get("kind") == LOG_KIND:
            continue
        problem = _rank_line_problem(fields, file)
        if problem is not None:
            text = json.dumps(fields, separators=(",", ":"))[:_SHOWN_CHARS]
            yield MalformedLine(file.path, number, problem, text)
            continue
        fields.setdefault("rank", file.rank)
        timestamp = fields.get("timestamp_ns")
        yield RankRecord(
            path=file.path,
            line=number,
            component=file.component,
            rank=file.rank,
            stage=fields.get("stage") or file.component,
            step=fields["step"],
            metrics=number_fields(fields, exclude=EVENT_FIELDS),
            timestamp_ns=timestamp,
            fields=fields,
        )


def read_rank_logs(
    directory: str | os.PathLike[str], files: Iterable[RankFile] | None = None
) -> Iterator[RankRecord | MalformedLine]:
    """Yield the lines of all rank files of ``directory`` merged into one stream.

    Merged by ``timestamp_ns``; a line without a timestamp (or a malformed one) takes the
    timestamp of the line before it in its file (0 at the start). Ties are broken by how
    often the file's step went down so far (a resumed run), then step, rank, component, so
    files without timestamps merge step by step, a resumed part after what it resumes. The
    merge streams: every file keeps its own line order, even where its timestamps go back.
    ``files`` defaults to :func:`list_rank_files` of ``directory``.
    """
    chosen = list_rank_files(directory) if files is None else list(files)
    yield from (item for _, item in heapq.merge(*map(_keyed, chosen), key=lambda pair: pair[0]))


_MergeKey = tuple[int, int, int, int, str]


def _keyed(file: RankFile) -> Iterator[tuple[_MergeKey, RankRecord | MalformedLine]]:
    timestamp, rewinds, step = 0, 0, 0
    for item in read_rank_file(file):
        if isinstance(item, RankRecord):
            timestamp = item.timestamp_ns if item.timestamp_ns is not None else timestamp
            rewinds += item.step < step
            step = item.step
        yield (timestamp, rewinds, step, file.rank, file.component), item


def _rank_line_problem(fields: dict[str, Any], file: RankFile) -> str | None:
    step, stage, rank = fields.get("step"), fields.get("stage"), fields.get("rank")
    if not _is_int(step) or step < 0:
        return f"step must be an int >= 0, got {step!r}"
    problem = None if stage is None else stage_problem(stage)
    if problem is not None:
        return problem.detail
    if rank is not None and rank != file.rank:
        return f"rank {rank!r} in the file of rank {file.rank}"
    timestamp = fields.get("timestamp_ns")
    if timestamp is not None and not _is_int(timestamp):
        return f"timestamp_ns must be an int, got {timestamp!r}"
    return None


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def number_fields(
    fields: Mapping[str, Any], exclude: AbstractSet[str] = frozenset()
) -> dict[str, float]:
    """The keys of ``fields`` whose values are numbers (not bools), as floats; in order."""
    return {
        name: float(value)
        for name, value in fields.items()
        if name not in exclude and isinstance(value, int | float) and not isinstance(value, bool)
    }
