"""ReadTracker: gaps in delivered offsets become one seek back; re-reads are processed."""

from __future__ import annotations

from rlpulse.streams.worker.read_tracker import ReadTracker

TP = ("events", 0)


def verdicts(tracker: ReadTracker, offsets: list[int]) -> list[str]:
    return [tracker.delivered(TP, offset).value for offset in offsets]


def test_contiguous_deliveries_are_processed() -> None:
    tracker = ReadTracker()
    assert verdicts(tracker, [5, 6, 7]) == ["process"] * 3
    assert tracker.next_offset(TP) == 8


def test_a_gap_seeks_back_once_and_skips_stale_deliveries_until_the_re_read() -> None:
    tracker = ReadTracker()
    assert verdicts(tracker, [10, 11, 14]) == ["process", "process", "seek"]
    assert tracker.seek_target(TP) == 12
    # 15 was already buffered before the seek; then the re-read starts at 12
    assert verdicts(tracker, [15, 12, 13, 14, 15]) == ["skip"] + ["process"] * 4
    assert tracker.next_offset(TP) == 16


def test_a_first_delivery_past_the_expected_start_is_a_gap() -> None:
    """At a takeover the committed offset is known: skipping from it is caught too."""
    tracker = ReadTracker()
    tracker.expect(TP, 414)
    assert verdicts(tracker, [416]) == ["seek"]
    assert tracker.seek_target(TP) == 414
    assert verdicts(tracker, [414, 415, 416]) == ["process"] * 3
    tracker.expect(TP, 3)  # only before the first delivery
    assert tracker.next_offset(TP) == 417


def test_deliveries_from_before_the_expected_start_are_processed() -> None:
    tracker = ReadTracker()
    tracker.expect(TP, 10)
    assert verdicts(tracker, [8, 9, 10, 11]) == ["process"] * 4
    assert tracker.next_offset(TP) == 12


def test_a_gap_that_never_fills_is_accepted_after_max_skip() -> None:
    tracker = ReadTracker(max_skip=2)
    assert verdicts(tracker, [1, 3]) == ["process", "seek"]
    assert verdicts(tracker, [3, 3, 3, 4]) == ["skip", "skip", "process", "process"]


def test_deliveries_again_after_a_seek_are_processed_and_forget_starts_over() -> None:
    tracker = ReadTracker()
    assert verdicts(tracker, [1, 2, 3, 1, 2]) == ["process"] * 5
    assert tracker.next_offset(TP) == 4
    tracker.forget()
    assert tracker.next_offset(TP) is None
    assert verdicts(tracker, [9]) == ["process"]


def test_stall_count_grows_while_the_wanted_offset_stands_still_with_messages_unread() -> None:
    tracker = ReadTracker()
    assert [tracker.stalled_ticks(TP, 40, unread=5) for _ in range(4)] == [0, 1, 2, 3]
    # delivery moved on: the count starts over
    assert tracker.stalled_ticks(TP, 43, unread=2) == 0
    assert tracker.stalled_ticks(TP, 43, unread=2) == 1


def test_a_burst_of_ticks_counts_once_per_gap() -> None:
    """Ticks that piled up while a partition had no owner are read at once: one stall tick."""
    tracker = ReadTracker(min_tick_gap_s=0.9)
    burst = [tracker.stalled_ticks(TP, 40, unread=5, now=10.0 + i * 0.001) for i in range(6)]
    assert burst == [0, 0, 0, 0, 0, 0]
    assert [tracker.stalled_ticks(TP, 40, unread=5, now=t) for t in (11.0, 12.0, 13.0)] == [
        1,
        2,
        3,
    ]


def test_nothing_unread_or_nothing_known_is_never_a_stall() -> None:
    tracker = ReadTracker()
    assert [tracker.stalled_ticks(TP, 40, unread=0) for _ in range(3)] == [0, 0, 0]
    assert [tracker.stalled_ticks(TP, None, unread=0) for _ in range(3)] == [0, 0, 0]


def test_after_a_rewind_or_a_revocation_the_stall_count_starts_over() -> None:
    tracker = ReadTracker()
    for _ in range(3):
        tracker.stalled_ticks(TP, 40, unread=5)
    tracker.rewound(TP)
    assert tracker.stalled_ticks(TP, 40, unread=5) == 0
    tracker.stalled_ticks(TP, 40, unread=5)
    tracker.forget()
    assert tracker.stalled_ticks(TP, 40, unread=5) == 0
