"""ReadTracker: a delivery past the next offset wanted names the offsets missing before it."""

from __future__ import annotations

from rlpulse.streams.worker.read_tracker import ReadTracker

TP = ("events", 0)


def missing(tracker: ReadTracker, offsets: list[int]) -> list[list[int]]:
    return [list(tracker.delivered(TP, offset)) for offset in offsets]


def test_contiguous_deliveries_miss_nothing() -> None:
    tracker = ReadTracker()
    assert missing(tracker, [5, 6, 7]) == [[], [], []]
    assert tracker.next_offset(TP) == 8


def test_a_gap_names_the_offsets_skipped_once() -> None:
    tracker = ReadTracker()
    assert missing(tracker, [10, 11, 14]) == [[], [], [12, 13]]
    assert tracker.next_offset(TP) == 15
    # the agent read 12 and 13 itself: the partition reads on from 15
    assert missing(tracker, [15, 16]) == [[], []]


def test_a_first_delivery_past_the_expected_start_is_a_gap() -> None:
    """At a takeover the committed offset is known: skipping from it is caught too."""
    tracker = ReadTracker()
    tracker.expect(TP, 414)
    assert missing(tracker, [416]) == [[414, 415]]
    tracker.expect(TP, 3)  # only before the first delivery
    assert tracker.next_offset(TP) == 417


def test_deliveries_from_before_the_next_wanted_miss_nothing() -> None:
    """Deliveries again (after a seek, or from before the committed offset) are processed."""
    tracker = ReadTracker()
    tracker.expect(TP, 10)
    assert missing(tracker, [8, 9, 10, 11]) == [[], [], [], []]
    assert missing(tracker, [1, 2, 12]) == [[], [], []]
    assert tracker.next_offset(TP) == 13


def test_forget_starts_over() -> None:
    tracker = ReadTracker()
    assert missing(tracker, [1, 2, 3]) == [[], [], []]
    tracker.forget()
    assert tracker.next_offset(TP) is None
    assert missing(tracker, [9]) == [[]]


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
