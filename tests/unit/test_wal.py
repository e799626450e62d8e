"""The write-ahead log: frames read back in order from another process's view, a cut frame ends
it, the writer sees its sender delete segments, claims are exclusive."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rlpulse.producers.delivery.wal import (
    EVENT,
    HEADER,
    LOG,
    SHIP_LOCK_NAME,
    AckFile,
    AckState,
    LogMeta,
    WalClaim,
    WalReader,
    WalWriter,
    logs_under,
    position,
    segment_of,
    segments,
    sender_pid,
    unsent_frames,
)


def a_writer(
    directory: Path,
    segment_bytes: int = 4096,
    max_bytes: int = 1 << 20,
    on_first_segment: Callable[[], None] | None = None,
) -> WalWriter:
    meta = LogMeta(directory, "run-a", "p-1", "t.events", "t.logs", time.time_ns())
    return WalWriter(meta, segment_bytes, max_bytes, on_first_segment)


def read_all(directory: Path, start: int = 0) -> list[tuple[int, bytes]]:
    reader = WalReader(directory)
    try:
        return [(frame.seq, frame.payload) for frame in reader.frames(start)]
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
        assert read_all(directory) == expected  # the writer alive
        writer.close()
        assert read_all(directory) == expected  # and gone


def test_nothing_touches_the_disk_before_the_first_frame(tmp_path: Path) -> None:
    """The agent is told of the log once, when its first segment exists (meta.json first)."""
    told: list[list[str]] = []
    writer = a_writer(
        tmp_path / "log",
        segment_bytes=4096,
        on_first_segment=lambda: told.append(sorted(p.name for p in (tmp_path / "log").iterdir())),
    )
    assert not (tmp_path / "log").exists()
    for seq in range(10):
        writer.append(EVENT, seq, b"x" * 1000)  # three segments
    assert told == [["000001.wal", "lock", "meta.json"]]
    meta = LogMeta.read(tmp_path / "log")
    assert meta is not None and meta.producer_id == "p-1"
    writer.close()


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


def test_the_log_stops_at_max_bytes_and_sees_its_sender_delete_segments(tmp_path: Path) -> None:
    """The writer counts segments it made; before it calls itself full it lists the disk,
    where the agent (another process) deleted what was delivered."""
    directory = tmp_path / "log"
    writer = a_writer(directory, segment_bytes=4096, max_bytes=2 * 4096)
    written = 0
    while writer.append(EVENT, written, b"e" * 1000):
        written += 1
    assert written == 8 and writer.live == {1, 2}  # 4 frames of 1,013 bytes a segment
    (directory / "000001.wal").unlink()  # as the agent does once all of it arrived
    assert [seq for seq, _ in read_all(directory)] == [4, 5, 6, 7]
    assert writer.append(EVENT, 8, b"e" * 1000)  # room again: a third segment
    assert segment_of(writer.end) == 3 and segments(directory) == [2, 3]
    writer.close()


def test_a_frame_finished_after_the_reader_stopped_is_read_when_the_next_segment_exists(
    tmp_path: Path,
) -> None:
    """The reader stops at a frame being written; once the writer made the next segment, the
    tail is read again before the reader moves on: no frame is skipped."""
    directory = tmp_path / "log"
    writer = a_writer(directory, segment_bytes=4096)
    for seq in range(3):
        writer.append(EVENT, seq, b"e" * 1000)
    data = writer._map
    assert data is not None
    third = 2 * (HEADER.size + 1000)
    header = bytes(data[third : third + HEADER.size])
    data[third : third + HEADER.size] = b"\x00" * HEADER.size  # its header not written yet
    reader = WalReader(directory)
    first = list(reader.frames(0))
    assert [frame.seq for frame in first] == [0, 1]
    data[third : third + HEADER.size] = header  # the writer finishes it ...
    writer.append(EVENT, 3, b"e" * 1000)
    writer.append(EVENT, 4, b"e" * 3000)  # ... and the next frame starts segment 2
    assert [frame.seq for frame in reader.frames(first[-1].end)] == [2, 3, 4]
    reader.close()
    writer.close()


def test_the_acked_file_survives_a_spoiled_slot(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    directory.mkdir()
    acks = AckFile(directory)
    acks.write(AckState(position(1, 100), 7, (2, 40), (-1, -1), 3, 3))
    acks.write(AckState(position(1, 200), 7, (2, 41), (2, 9), 5, 4, 0, 0, 1))
    acks.close()
    assert AckFile.read(directory) == AckState(position(1, 200), 7, (2, 41), (2, 9), 5, 4, 0, 0, 1)
    data = bytearray((directory / "acked").read_bytes())
    data[0:8] = b"\x00" * 8  # the slot of the second write (generation 2), cut by a kill
    (directory / "acked").write_bytes(bytes(data))
    assert AckFile.read(directory) == AckState(position(1, 100), 7, (2, 40), (-1, -1), 3, 3)
    again = AckFile(directory)  # a recovering process goes on from the newest generation
    again.write(AckState(position(1, 300), 0, (2, 42), (2, 9)))
    again.close()
    assert AckFile.read(directory) == AckState(position(1, 300), 7, (2, 42), (2, 9))


def test_an_acked_file_of_the_earlier_release_is_read(tmp_path: Path) -> None:
    """64-byte slots without counts (the release whose trainers sent their own logs)."""
    layout = struct.Struct("<4sIqqiqiqI")
    slot = layout.pack(b"RPWA", 3, position(2, 50), 9, 1, 17, 1, 4, 0)
    slot = slot[:-4] + zlib.crc32(slot[:-4]).to_bytes(4, "little")
    directory = tmp_path / "log"
    directory.mkdir()
    (directory / "acked").write_bytes(b"\x00" * 64 + slot.ljust(64, b"\x00"))
    assert AckFile.read(directory) == AckState(position(2, 50), 9, (1, 17), (1, 4))


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
    writer.close()


def test_a_sender_s_claim_says_its_pid_and_is_apart_from_the_writer_s(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    writer = a_writer(directory)
    writer.append(EVENT, 0, b"x")
    sending = WalClaim.take(directory, SHIP_LOCK_NAME)
    assert sending is not None and sender_pid(directory) == os.getpid()
    assert WalClaim.take(directory, SHIP_LOCK_NAME) is None  # one sender per log
    sending.release()
    writer.close()


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


def test_a_header_read_before_its_kind_and_seq_were_written_is_not_a_frame(
    tmp_path: Path,
) -> None:
    """Another process may read a frame while it is written: with the length and CRC there
    but the kind and seq still zero it must read as the end (the CRC covers them), not as a
    frame of kind 0; once whole it reads as itself."""
    directory = tmp_path / "log"
    writer = a_writer(directory)
    writer.append(EVENT, 0, b"first")
    writer.append(EVENT, 7, b"second")
    data = writer._map
    assert data is not None
    second = HEADER.size + len(b"first")
    kind_seq = bytes(data[second + 8 : second + HEADER.size])
    data[second + 8 : second + HEADER.size] = b"\x00" * 9  # not written yet
    assert [seq for seq, _ in read_all(directory)] == [0]
    data[second + 8 : second + HEADER.size] = kind_seq
    assert [seq for seq, _ in read_all(directory)] == [0, 7]
    writer.close()


def test_a_log_of_an_earlier_protocol_is_read_with_its_own_crc(tmp_path: Path) -> None:
    """Protocols 1 and 2: a CRC of the payload alone."""
    directory = tmp_path / "log"
    directory.mkdir()
    payload = b"an event of the earlier release"
    frame = HEADER.pack(len(payload), zlib.crc32(payload), EVENT, 4) + payload
    (directory / "000001.wal").write_bytes(frame.ljust(4096, b"\x00"))
    reader = WalReader(directory, protocol=2)
    assert [(frame.seq, frame.payload) for frame in reader.frames(0)] == [(4, payload)]
    reader.close()
    assert read_all(directory) == []  # read as this protocol, its CRC does not hold


def test_logs_under_passes_over_logs_deleted_while_it_looks(tmp_path: Path) -> None:
    """``rlpulse spool list`` and the tests look while the host's agent deletes sent logs."""
    spool = tmp_path / "spool"
    kept = spool / "run-k" / "p-kept"
    kept.mkdir(parents=True)
    (kept / "000000.wal").write_bytes(b"")
    stop = threading.Event()

    def delete_and_remake() -> None:
        while not stop.is_set():
            for number in range(40):
                log = spool / f"run-{number}" / "p-1"
                log.mkdir(parents=True, exist_ok=True)
                (log / "000000.wal").write_bytes(b"")
            for number in range(40):
                shutil.rmtree(spool / f"run-{number}", ignore_errors=True)

    deleter = threading.Thread(target=delete_and_remake)
    deleter.start()
    try:
        for _ in range(300):
            found = logs_under(spool)
            assert kept in found
            assert all(path.name.startswith("p-") for path in found)
    finally:
        stop.set()
        deleter.join()
    assert logs_under(spool) == [kept]
    assert logs_under(tmp_path / "no-such") == []
    assert logs_under(kept) == [kept]
