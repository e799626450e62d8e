"""The worker's tables read back from their changelogs exactly what they wrote (no broker).

A faust changelog is written by the worker (write-behind, with the table's serializers) and
read by faust during recovery (with the changelog topic's serializers). Both must be the
codec that keeps NaN and infinities: with faust's json codec and orjson installed, a NaN in
a rule window or a metric would make recovery fail after a restart.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

from faust.serializers import codecs

from rlpulse.rules import load_preset
from rlpulse.settings import Settings
from rlpulse.streams.rulebook import RuleBook
from rlpulse.streams.worker.app import WorkerApp
from rlpulse.streams.worker.json_values import dumps, loads


def test_every_changelog_reads_back_what_the_worker_writes(tmp_path: Path) -> None:
    settings = Settings(bootstrap="127.0.0.1:1").updated({"worker.data_dir": tmp_path})
    worker = WorkerApp(settings, RuleBook(load_preset("seed"), "<preset seed>"))
    document = {"window": [[3, math.nan], [4, math.inf]], "n": -math.inf}
    for view in worker._tables:
        table = view.table
        topic = table.changelog_topic
        stored = dumps(document) if view is worker.groups else document  # groups: JsonValues
        key = codecs.dumps(table.key_serializer, "run|0|actor|3")
        value = codecs.dumps(table.value_serializer, stored)
        assert codecs.loads(topic.key_serializer, key) == "run|0|actor|3", table.name
        back = codecs.loads(topic.value_serializer, value)
        if view is worker.groups:
            assert back == value  # bytes in the store, decoded by JsonValues on access
            back = loads(back)
        assert math.isnan(back["window"][0][1]) and back["window"][1][1] == math.inf, table.name
        assert back["n"] == -math.inf and topic.partitions == settings.worker.partitions


def test_a_revoked_partition_forgets_what_this_worker_put_in_its_indexes(tmp_path: Path) -> None:
    settings = Settings(bootstrap="127.0.0.1:1").updated({"worker.data_dir": tmp_path})
    worker = WorkerApp(settings, RuleBook(load_preset("seed"), "<preset seed>"))
    worker._indexed_stages.add("run|0|actor")
    worker._indexed_runs.add("run|0")
    asyncio.run(worker._on_revoked(None, signal=None))
    # Back after a rebalance, the next event of each puts it in the table's index again.
    assert (worker._indexed_stages, worker._indexed_runs) == (set(), set())
