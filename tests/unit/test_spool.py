"""The spool's files: line format, size rotation, space cap, cut lines, claims (no broker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpulse.producers.spool import (
    Spool,
    SpoolClaim,
    SpooledEvent,
    read_spool_file,
    spool_file_name,
    spool_files,
)


def event(seq: int, producer_id: str = "p1", size: int = 10) -> SpooledEvent:
    return SpooledEvent("rlpulse.events", b"run-a", bytes(size), producer_id, seq)


@settings(max_examples=200, deadline=None)
@given(
    topic=st.text(min_size=1),
    key=st.none() | st.binary(),
    value=st.binary(),
    producer_id=st.text(),
    seq=st.integers(0, 2**63 - 1),
)
def test_line_round_trip(
    topic: str, key: bytes | None, value: bytes, producer_id: str, seq: int
) -> None:
    spooled = SpooledEvent(topic, key, value, producer_id, seq)
    line = spooled.to_line()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert SpooledEvent.from_line(line) == spooled
    record = json.loads(line)
    assert (record["producer_id"], record["seq"]) == (producer_id, seq)  # readable in clear


def test_nothing_touches_the_disk_before_the_first_write(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "run", "p1", file_bytes=4096, max_bytes=1 << 20)
    spool.rotate()
    spool.close()
    assert not (tmp_path / "run").exists()


def test_files_rotate_by_size_and_keep_every_event_in_order(tmp_path: Path) -> None:
    seqs = list(range(100, 131))  # three digits each: lines of one size
    line_size = len(event(100, size=100).to_line())
    spool = Spool(tmp_path, "p1", file_bytes=10 * line_size, max_bytes=1 << 20)
    assert spool.write([event(s, size=100) for s in seqs[:25]]) == 25
    assert spool.write([event(s, size=100) for s in seqs[25:]]) == 6
    assert spool.size == 31 * line_size
    assert len(spool.closed_files()) == 3  # 10 + 10 + 10 closed, 1 in the open file
    spool.rotate()
    files = spool.closed_files()
    assert [p.name for p in files] == [spool_file_name("p1", i) for i in range(1, 5)]
    assert [e.seq for path in files for e in read_spool_file(path)[0]] == seqs
    spool.remove(files[0])
    assert not files[0].exists() and spool.size == 21 * line_size
    spool.close()
    assert (tmp_path / "p1.lock").exists()  # files left: the lock file marks them
    assert list(spool_files(tmp_path)) == [(tmp_path, "p1")]


def test_the_space_cap_refuses_what_does_not_fit(tmp_path: Path) -> None:
    line_size = len(event(0).to_line())
    spool = Spool(tmp_path, "p1", file_bytes=4096, max_bytes=5 * line_size + 3)
    assert spool.write([event(s) for s in range(8)]) == 5
    assert spool.write([event(9)]) == 0
    spool.close()


def test_a_cut_last_line_is_skipped(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "p1", file_bytes=1 << 20, max_bytes=1 << 20)
    spool.write([event(0), event(1)])
    spool.close()
    (path,) = spool_files(tmp_path)[(tmp_path, "p1")]
    with path.open("ab") as handle:
        handle.write(event(2).to_line()[:30])  # killed in the middle of a write
    events, bad = read_spool_file(path)
    assert [e.seq for e in events] == [0, 1]
    assert bad == 1


def test_a_claim_is_exclusive_until_released(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "p1", file_bytes=4096, max_bytes=1 << 20)
    spool.write([event(0)])
    assert SpoolClaim.take(tmp_path, "p1") is None  # the writer holds it
    spool.close()
    claim = SpoolClaim.take(tmp_path, "p1")
    assert claim is not None
    assert SpoolClaim.take(tmp_path, "p1") is None
    assert len(claim.files()) == 1
    for path in claim.files():
        path.unlink()
    claim.release()
    assert not claim.lock_path.exists()  # no files left: no lock file either
    again = SpoolClaim.take(tmp_path, "p1")
    assert again is not None
    again.release()


def test_spool_files_are_grouped_by_directory_and_producer(tmp_path: Path) -> None:
    for run, producer in [("run-a", "p1"), ("run-a", "p2"), ("run-b", "p1")]:
        spool = Spool(tmp_path / run, producer, file_bytes=4096, max_bytes=1 << 20)
        spool.write([event(0, producer)])
        spool.close()
    (tmp_path / "run-a" / "notes.jsonl").write_text("not a spool file\n")
    assert sorted((d.name, p) for d, p in spool_files(tmp_path)) == [
        ("run-a", "p1"),
        ("run-a", "p2"),
        ("run-b", "p1"),
    ]
    assert spool_files(tmp_path / "missing") == {}


@pytest.mark.parametrize(
    "line",
    [b"{}", b'{"v": 2}', b"not json", b'{"v":1,"topic":"t","producer_id":"p","seq":1,"key":null}'],
)
def test_lines_that_are_not_events_are_refused(line: bytes) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        SpooledEvent.from_line(line)
