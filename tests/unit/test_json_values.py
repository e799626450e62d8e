"""Table values kept as JSON bytes (the worker's compact form for released steps)."""

from __future__ import annotations

import gc
import math

from rlpulse.streams.worker.json_values import JsonValues, dumps, loads


def test_documents_round_trip_through_bytes_with_nan_and_infinities() -> None:
    store: dict[str, bytes] = {}
    values = JsonValues(store)
    group = {"ranks": {"0": {"loss": [math.nan, 3]}}, "inf": [math.inf, -math.inf], "n": 1}
    values["run|0|actor|7"] = group
    assert store["run|0|actor|7"] == dumps(group)
    assert isinstance(store["run|0|actor|7"], bytes)
    back = values["run|0|actor|7"]
    assert math.isnan(back["ranks"]["0"]["loss"][0]) and back["inf"] == [math.inf, -math.inf]
    assert values.get("missing") is None and values.get("missing", 5) == 5
    assert ("run|0|actor|7" in values, len(values), list(values)) == (True, 1, ["run|0|actor|7"])
    del values["run|0|actor|7"]
    assert store == {} and len(values) == 0


def test_a_read_is_a_fresh_document_until_it_is_assigned_back() -> None:
    values = JsonValues({})
    values["k"] = {"revision": 1}
    changed = values["k"]
    changed["revision"] = 2
    assert values["k"] == {"revision": 1}  # as with a faust table: assign to persist
    values["k"] = changed
    assert values["k"] == {"revision": 2}


def test_stored_values_are_invisible_to_the_garbage_collector() -> None:
    """Why the worker keeps released steps this way: bytes hold no references, so the cyclic
    collector never walks them, however many are kept."""
    store: dict[str, bytes] = {}
    JsonValues(store)["k"] = {"ranks": {str(r): {"m": [1.0, r]} for r in range(8)}}
    assert not gc.is_tracked(store["k"])
    assert gc.is_tracked(loads(store["k"]))  # the decoded document would be
