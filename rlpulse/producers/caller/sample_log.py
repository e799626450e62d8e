"""One logger's rollout samples: a producer and a write-ahead log of their own.

A logger's samples (every sample's numbers in chunks, the chosen texts) go to a second log
beside its events log, ``<producer id>.samples``, with its own ``seq``: the audit counts them
as one more producer of the run. Its ``meta.json`` says protocol 4 (the frame kinds
:data:`~rlpulse.producers.delivery.wal.SAMPLE` and
:data:`~rlpulse.producers.delivery.wal.SAMPLE_TEXT`), and the events log keeps saying 3: an
agent of the release before samples, still running on a host during an upgrade, sends the
events and log records as before and leaves the samples log alone, for the next agent of
this release (docs/logs.md, "Rollout samples").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from rlpulse.diagnostics import WarnOnce
from rlpulse.producers.delivery.agent_place import AgentBell
from rlpulse.producers.delivery.wal import (
    PROTOCOL,
    SAMPLE,
    SAMPLE_TEXT,
    AckFile,
    AckState,
    LogMeta,
    WalWriter,
)
from rlpulse.producers.encoding.fields import RecordSource
from rlpulse.producers.encoding.samples import SampleColumns, SampleEncoder, TextEntry
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.topics import Topics
from rlpulse.settings import Settings

__all__ = ["SAMPLES_SUFFIX", "SampleCounts", "SampleLog"]

log = logging.getLogger(__name__)

SAMPLES_SUFFIX: Final = ".samples"
"""What a logger's producer id gets for its samples' producer id (and log directory)."""
_DELIVERY_POLL_S: Final = 0.005


@dataclass
class SampleCounts:
    """What became of one logger's samples so far."""

    samples: int = 0
    """Samples written to the log (their numbers)."""
    texts: int = 0
    """Chosen samples whose texts were written."""
    steps: int = 0
    """Calls that logged samples."""
    refused: dict[str, int] = field(default_factory=dict)
    """Samples left out, per key of the problem (``reward``, ``response``, ...)."""
    dropped: int = 0
    """Records (chunks of samples, or texts) the log could not take: full, or no disk."""


class SampleLog:
    """The samples log of one logger (made with its first samples); see the module docstring.

    ``on_first_segment`` tells the host's agent of the log. Thread-safe.
    """

    def __init__(
        self,
        source: RecordSource,
        directory: Path,
        settings: Settings,
        agent_key: str,
        bell: AgentBell | None,
        on_first_segment: Callable[[], None],
    ) -> None:
        topics = Topics(settings.prefix)
        self.producer_id = source.producer_id
        self.directory = directory
        self.settings = settings
        self.counts = SampleCounts()
        self._bell = bell
        self._lock = threading.Lock()
        self._seq = 0
        self._warn_once = WarnOnce(log)
        self._encoder = SampleEncoder(source, default_codec())
        producer = settings.producer
        meta = LogMeta(
            directory, source.run_id, source.producer_id, topics.events, topics.logs,
            time.time_ns(), source.hostname, os.getpid(), agent_key, PROTOCOL, source.rank,
            source.attempt, samples_topic=topics.samples, sample_texts_topic=topics.sample_texts,
        )  # fmt: skip
        self._writer = WalWriter(
            meta,
            segment_bytes=producer.spool_file_bytes,
            max_bytes=producer.spool_max_bytes,
            on_first_segment=on_first_segment,
        )
        self._heads_written = False

    @property
    def logged(self) -> int:
        """Records written (the next ``seq``)."""
        return self._seq

    def write(
        self, columns: SampleColumns, texts: Sequence[TextEntry], step: int, split: str
    ) -> None:
        """Append one step's samples (in chunks) and its chosen texts to the log."""
        timestamp_ns = time.time_ns()
        max_bytes = int(self.settings.logging.batch_max_bytes)
        with self._lock:
            encoder = self._encoder
            chunks = encoder.chunks(columns, step, split, self._seq, timestamp_ns, max_bytes)
            if not self._heads_written:
                self._write_heads()
            written = 0
            for chunk in chunks:
                written += self._append(SAMPLE, chunk)
            for text in texts:
                entry = encoder.text_entry(text, step, split, self._seq, timestamp_ns)
                self.counts.texts += self._append(SAMPLE_TEXT, entry)
            self.counts.steps += 1
            self.counts.samples += len(columns) if written == len(chunks) else 0
        bell = self._bell
        if bell is not None and bell.state[0]:
            bell.ring(SAMPLE)

    def _write_heads(self) -> None:
        try:
            self._writer.write_source(self._encoder.samples_head, SAMPLE)
            self._writer.write_source(self._encoder.texts_head, SAMPLE_TEXT)
        except OSError as exc:  # the appends fail the same way, and say so
            log.debug("cannot write %s: %s", self.directory, exc)
            return
        self._heads_written = True

    def _append(self, kind: int, payload: bytes) -> int:
        """Append one record with the next seq; 1 if written, 0 if the log could not take it."""
        seq = self._seq
        self._seq = seq + 1  # a record not written keeps its seq: the audit shows the gap
        try:
            written = self._writer.append(kind, seq, payload)
        except OSError as exc:
            self.counts.dropped += 1
            self._warn_once(
                "samples-wal-error", "cannot write the samples log %s (%s); samples are dropped "
                "(counted in EventLogger.samples.dropped)", self.directory, exc,
            )  # fmt: skip
            return 0
        if not written:
            self.counts.dropped += 1
            self._warn_once(
                "samples-wal-full", "the samples log %s holds producer.spool_max_bytes Kafka "
                "has not taken yet; the newest samples are dropped (counted in "
                "EventLogger.samples.dropped)", self.directory,
            )  # fmt: skip
            return 0
        return 1

    def acked(self) -> AckState:
        """What the agent recorded of the log (its ``acked`` file)."""
        return AckFile.read(self.directory)

    def pending(self) -> int:
        """Records in the log Kafka has not acknowledged yet."""
        return max(0, self._writer.frames - self.acked().frames)

    def wait_delivered(self, deadline: float) -> int:
        """Wait until Kafka acknowledged every record, or ``deadline``; how many are left."""
        frames = self._writer.frames
        while True:
            left = max(0, frames - self.acked().frames)
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(_DELIVERY_POLL_S)

    def close(self) -> None:
        """Give the log up (the agent deletes it once all of it arrived) and tell the agent."""
        with self._lock:
            self._writer.close()
        if self._bell is not None:
            self._bell.send(b"-" + os.fsencode(self.directory) + b"\n")


def samples_log_dir(events_log: Path) -> Path:
    """The directory of the samples log beside a logger's events log."""
    return events_log.with_name(events_log.name + SAMPLES_SUFFIX)
