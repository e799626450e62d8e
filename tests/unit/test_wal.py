"""The write-ahead log: frames read back in order, a cut frame ends it, claims are exclusive."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rlpulse.producers.delivery.adoption import (
    DeadLog,
    PassedLog,
    claim_dead_logs,
    look_for_dead_logs,
)
from rlpulse.producers.delivery.shipper import LogShipper
from rlpulse.producers.delivery.wal import (
    EVENT,
    HEADER,
    LOG,
    AckFile,
    AckState,
    LogMeta,
    WalClaim,
    WalReader,
    WalWriter,
    logs_under,
    position,
    read_source,
    segment_of,
    segments,
    unsent_frames,
)
from rlpulse.producers.encoding.logs import batch_body


def a_writer(directory: Path, segment_bytes: int = 4096, max_bytes: int = 1 << 20) -> WalWriter:
    meta = LogMeta(directory, "run-a", "p-1", "t.events", "t.logs", time.time_ns())
    return WalWriter(meta, segment_bytes=segment_bytes, max_bytes=max_bytes)


def read_all(directory: Path, start: int = 0, end: int | None = None) -> list[tuple[int, bytes]]:
    reader = WalReader(directory)
    try:
        return [(frame.seq, frame.payload) for frame in reader.frames(start, end)]
    finally:
        reader.close()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=700), min_size=1, max_size=60))
def test_frames_read_back_in_order_across_segments(payloads: list[bytes]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        directory = Path(folder) / "log"
        writer = a_writer(directory, segment_bytes=1024)
        for seq, payload in enumerate(payloads):
            assert writer.append(EVENT if seq % 3 == 0 else LOG, seq, payload)
        expected = list(enumerate(payloads))
        assert read_all(directory, 0, writer.end) == expected  # a live writer's reader
        assert read_all(directory) == expected  # a dead writer's log, read to its end
        writer.close()


def test_nothing_touches_the_disk_before_the_first_frame(tmp_path: Path) -> None:
    writer = a_writer(tmp_path / "log")
    assert not (tmp_path / "log").exists()
    writer.append(EVENT, 0, b"x")
    assert sorted(p.name for p in (tmp_path / "log").iterdir()) == [
        "000001.wal",
        "lock",
        "meta.json",
    ]
    meta = LogMeta.read(tmp_path / "log")
    assert meta is not None and meta.producer_id == "p-1"


def test_a_cut_or_corrupt_frame_ends_the_log(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    writer = a_writer(directory)
    for seq in range(3):
        writer.append(LOG, seq, bytes([seq]) * 50)
    writer.close()
    path = directory / "000001.wal"
    data = bytearray(path.read_bytes())
    second = HEADER.size + 50
    data[second + HEADER.size + 10] ^= 0xFF  # the second frame's payload, as a kill mid-copy
    path.write_bytes(bytes(data))
    assert [seq for seq, _ in read_all(directory)] == [0]


def test_the_log_stops_at_max_bytes_and_deleted_segments_are_skipped(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    writer = a_writer(directory, segment_bytes=4096, max_bytes=2 * 4096)
    written = 0
    while writer.append(EVENT, written, b"e" * 1000):
        written += 1
    assert written == 8 and writer.live == {1, 2}  # 4 frames of 1,013 bytes a segment
    writer.remove(1)
    assert segments(directory) == [2]
    assert [seq for seq, _ in read_all(directory)] == [4, 5, 6, 7]
    assert writer.append(EVENT, 8, b"e" * 1000)  # room again: a third segment
    assert segment_of(writer.end) == 3


def test_the_acked_file_survives_a_spoiled_slot(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    directory.mkdir()
    acks = AckFile(directory)
    acks.write(AckState(position(1, 100), 7, (2, 40), (-1, -1)))
    acks.write(AckState(position(1, 200), 7, (2, 41), (2, 9)))
    acks.close()
    assert AckFile.read(directory) == AckState(position(1, 200), 7, (2, 41), (2, 9))
    data = bytearray((directory / "acked").read_bytes())
    data[0:8] = b"\x00" * 8  # the slot of the second write (generation 2), cut by a kill
    (directory / "acked").write_bytes(bytes(data))
    assert AckFile.read(directory) == AckState(position(1, 100), 7, (2, 40), (-1, -1))
    again = AckFile(directory)  # a recovering process goes on from the newest generation
    again.write(AckState(position(1, 300), 0, (2, 42), (2, 9)))
    again.close()
    assert AckFile.read(directory) == AckState(position(1, 300), 7, (2, 42), (2, 9))


def test_unsent_frames_count_from_the_acknowledged_position(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    writer = a_writer(directory)
    ends = []
    for seq in range(5):
        writer.append(EVENT, seq, b"x" * 10)
        ends.append(writer.end)
    acks = AckFile(directory)
    acks.write(AckState(ends[1], 0))
    acks.close()
    assert unsent_frames(directory) == 3


def test_a_claim_is_held_until_its_process_dies(tmp_path: Path) -> None:
    directory = tmp_path / "run" / "p-1"
    writer = a_writer(directory)
    writer.append(EVENT, 0, b"x")
    assert WalClaim.take(directory) is None  # this process's writer holds it
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "run" / "p-2")], stdout=subprocess.PIPE
    )
    assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
    assert WalClaim.take(tmp_path / "run" / "p-2") is None
    holder.kill()
    holder.wait()
    claim = WalClaim.take(tmp_path / "run" / "p-2")
    assert claim is not None
    assert logs_under(tmp_path / "run") == [directory, tmp_path / "run" / "p-2"]
    claim.release(delete=True)
    assert not (tmp_path / "run" / "p-2").exists()


HOLD = """
import sys, time
from pathlib import Path
from rlpulse.producers.delivery.wal import WalClaim
from rlpulse.producers.delivery.wal import LogMeta, WalWriter
directory = Path(sys.argv[1])
writer = WalWriter(LogMeta(directory, "r", "p-2", "e", "l", 0), segment_bytes=4096, max_bytes=8192)
writer.append(1, 0, b"x")
print("held", flush=True)
time.sleep(60)
"""


class RecordingProducer:
    """Takes every message; delivers none (what a shipper hands to librdkafka)."""

    def __init__(self) -> None:
        self.values: list[bytes] = []

    def produce(self, topic: str, value: bytes, key: bytes, **kwargs: object) -> None:
        self.values.append(value)


def test_a_live_log_builds_its_batches_from_the_head_it_wrote_not_the_file(tmp_path: Path) -> None:
    writer = a_writer(tmp_path / "log")
    writer.write_source(b"HEAD")
    assert writer.source == b"HEAD" == read_source(tmp_path / "log")  # for whoever comes next
    writer.append(LOG, 0, b"entry")
    (tmp_path / "log" / "source").unlink()  # this process does not read it back
    shipper = LogShipper(writer.meta, lambda: None, batch_max_bytes=1 << 20, writer=writer)  # type: ignore[arg-type,return-value]
    producer = RecordingProducer()
    shipper.step(producer)  # type: ignore[arg-type]
    assert producer.values == [b"HEAD" + batch_body([b"entry"])]
    shipper.close(delete=False)
    writer.close()


def test_one_look_claims_the_dead_logs_and_says_why_it_passed_the_others(tmp_path: Path) -> None:
    """What a logger's adoption and ``rlpulse replay`` both go through: look_for_dead_logs."""
    run = tmp_path / "run"
    writers = {}
    hosts = {"dead": "node-1", "elsewhere": "node-2", "live": "node-1", "bare": "node-1"}
    for name, host in hosts.items():
        meta = LogMeta(run / name, "run-a", name, "t.events", "t.logs", time.time_ns(), host)
        writers[name] = writer = WalWriter(meta, segment_bytes=4096, max_bytes=1 << 20)
        writer.append(EVENT, 0, b"x")
    (run / "bare" / "meta.json").unlink()
    for name in ("dead", "elsewhere", "bare"):  # their processes are gone
        claim = writers[name].claim
        assert claim is not None
        writers[name].close()
        claim.release()
    found = list(look_for_dead_logs(logs_under(run), "node-1"))
    claimed = [item for item in found if isinstance(item, DeadLog)]
    passed = [(item.path.name, item.reason) for item in found if isinstance(item, PassedLog)]
    assert [dead.meta.producer_id for dead in claimed] == ["dead"]
    assert passed == [("bare", "no meta"), ("elsewhere", "other host"), ("live", "held")]
    assert list(claim_dead_logs(run, "node-1")) == []  # "dead" is claimed by the look above
    claimed[0].claim.release()
    assert list(claim_dead_logs(run, "node-1", skip={run / "dead"})) == []
    [again] = claim_dead_logs(run, "node-1")
    assert again.meta.producer_id == "dead"
    again.claim.release()
    writers["live"].close()
