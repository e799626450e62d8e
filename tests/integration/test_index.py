"""``rlpulse index`` on a real OpenSearch node: the step's logs, errors in a window, once each.

A 4-rank run on two hosts in three phases (:mod:`tests.integration.log_run`: records at
every level, trace ids, a reward spike at step 13), a worker publishing its step summaries,
and an indexer that is SIGKILLed while it indexes the second phase and started again. Then
everything is asked of OpenSearch's REST API and compared with what the ranks wrote to their
local files (every record a rank accepted is a line there, with its producer id and seq).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import pytest

from rlpulse.local.child_process import free_port
from rlpulse.local.opensearch import request_json
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers import EventLogger
from rlpulse.schemas.topics import REASON_HEADER, SOURCE_HEADER, Topics
from rlpulse.transport.topics import ensure_topics
from tests.integration.holding_proxy import HoldingProxy
from tests.integration.log_run import (
    HOSTS,
    RANKS,
    SPIKE_STEP,
    planned,
    record_id,
    start_ranks,
)
from tests.kafka import read_all, settings_at
from tests.support.indexer_process import IndexerProcess
from tests.waiting import wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PHASES = ((0, 10), (10, 20), (20, 30))
LAST_STEP = 29
WAIT_S = 120.0


class IndexedRun:
    """The scripted run, played once per module with an indexer that is killed midway."""

    def __init__(self, bootstrap: str, url: str, topics: Topics, work: Path) -> None:
        self.bootstrap = bootstrap
        self.url = url
        self.topics = topics
        self.work = work
        self.run_id = f"index-{uuid.uuid4().hex[:8]}"
        self.log_dir = work / "logs"
        self.phase_ends: list[int] = []
        self.killed_at_count = 0
        self.restarted_log = ""

    def ranks(self, first: int, end: int) -> list[subprocess.Popen[bytes]]:
        return start_ranks(
            self.run_id, (first, end), LAST_STEP, self.bootstrap, self.topics.prefix, self.work
        )

    def search(self, kind: str, query: dict[str, Any], size: int = 10_000) -> list[dict[str, Any]]:
        status, body = request_json(
            "POST",
            f"{self.url}/{self.topics.prefix}-{kind}-*/_search",
            {"query": query, "size": size, "track_total_hits": True},
        )
        assert status == 200, body
        assert body["hits"]["total"]["value"] == len(body["hits"]["hits"]), "raise size"
        return [{"_id": hit["_id"], **hit["_source"]} for hit in body["hits"]["hits"]]

    def count(self, kind: str, query: dict[str, Any]) -> int:
        request_json("POST", f"{self.url}/{self.topics.prefix}-{kind}-*/_refresh")
        status, body = request_json(
            "POST", f"{self.url}/{self.topics.prefix}-{kind}-*/_count", {"query": query}
        )
        return int(body["count"]) if status == 200 else 0

    def of_run(self, *clauses: dict[str, Any]) -> dict[str, Any]:
        return {"bool": {"filter": [{"term": {"run_id": self.run_id}}, *clauses]}}

    def written(self) -> list[dict[str, Any]]:
        """Every log record the ranks accepted: the ``"kind": "log"`` lines of their files."""
        lines = []
        for path in sorted(self.log_dir.glob("*.jsonl")):
            for text in path.read_text().splitlines():
                line = json.loads(text)
                if line.get("kind") == "log":
                    lines.append(line)
        return lines


def doc_id(line: dict[str, Any]) -> str:
    return f"{line['producer_id']}:{line['seq']}"


@pytest.fixture(scope="module")
def indexed_run(
    kafka_bootstrap: str, opensearch_url: str, tmp_path_factory: pytest.TempPathFactory
) -> IndexedRun:
    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}")
    ensure_topics(settings_at(kafka_bootstrap), topics, partitions=3)
    work = tmp_path_factory.mktemp("indexed-run")
    run = IndexedRun(kafka_bootstrap, opensearch_url, topics, work)
    small_bulks = {
        "index.bulk_max_docs": 50,
        "index.bulk_max_wait_s": 0.1,
        "index.session_timeout_s": 6,  # the killed member's partitions move on sooner
        "worker.partitions": 3,
    }

    def indexer(name: str) -> IndexerProcess:
        return IndexerProcess(
            kafka_bootstrap, topics.prefix, opensearch_url, work / name, small_bulks
        )

    worker = WorkerProcess(
        kafka_bootstrap, topics.prefix, work / "worker.log", rules="seed", partitions=3
    )
    target = urllib.parse.urlsplit(opensearch_url)
    with contextlib.ExitStack() as running:
        proxy = running.enter_context(HoldingProxy(target.hostname or "", target.port or 9200))
        first = IndexerProcess(
            kafka_bootstrap, topics.prefix, proxy.url, work / "indexer-1.log", small_bulks
        )
        running.enter_context(worker)
        running.enter_context(first)
        worker.wait_consuming()
        for process in run.ranks(*PHASES[0]):
            assert process.wait(timeout=WAIT_S) == 0
        run.phase_ends.append(time.time_ns())
        phase_0 = len(run.written())
        wait_for(lambda: run.count("logs", run.of_run()) == phase_0, "the first phase in the index")
        wait_for(  # else the held request may hold only the first phase's last summaries
            lambda: run.count("steps", run.of_run()) >= PHASES[0][1],
            "the first phase's step summaries in the index",
        )
        # Mid-bulk: the engine took a request of the second phase, the indexer never heard.
        proxy.hold_next_bulk()
        processes = run.ranks(*PHASES[1])
        wait_for(proxy.holding.is_set, "a _bulk request of the second phase answered and held")
        first.kill()
        run.killed_at_count = run.count("logs", run.of_run())
        for process in processes:
            assert process.wait(timeout=WAIT_S) == 0
        run.phase_ends.append(time.time_ns())
        with indexer("indexer-2.log") as second:
            for process in run.ranks(*PHASES[2]):
                assert process.wait(timeout=WAIT_S) == 0
            run.phase_ends.append(time.time_ns())
            total = len(run.written())
            wait_for(lambda: run.count("logs", run.of_run()) >= total, "every record in the index")
            wait_for(
                lambda: run.count("steps", run.of_run()) >= LAST_STEP + 1,
                "every step summary in the index",
            )
            time.sleep(1.0)  # anything indexed twice would show now
        assert second.process is not None and second.process.returncode == 0, second.log_text()
        run.restarted_log = second.log_text()
    return run


def test_a_step_s_query_returns_exactly_that_step_s_records_on_every_rank(
    indexed_run: IndexedRun,
) -> None:
    found = indexed_run.search("logs", indexed_run.of_run({"term": {"step": SPIKE_STEP}}))
    expected = [line for line in indexed_run.written() if line["step"] == SPIKE_STEP]
    assert sorted(hit["_id"] for hit in found) == sorted(doc_id(line) for line in expected)
    trainer = {record_id(hit["message"]) for hit in found if hit["logger"] == "trainer"}
    assert trainer == {p.id for rank in range(RANKS) for p in planned(rank, SPIKE_STEP)}
    assert {hit["rank"] for hit in found} == set(range(RANKS))
    assert {hit["hostname"] for hit in found} == set(HOSTS.values())


def test_errors_in_a_time_window_are_exactly_the_expected_records(indexed_run: IndexedRun) -> None:
    start, end = indexed_run.phase_ends[0] // 10**6, indexed_run.phase_ends[1] // 10**6
    window = {"range": {"@timestamp": {"gte": start, "lt": end}}}
    found = indexed_run.search("logs", indexed_run.of_run({"term": {"level": "ERROR"}}, window))
    expected = [
        line
        for line in indexed_run.written()
        if line["level"] == "ERROR" and start <= line["timestamp_ns"] // 10**6 < end
    ]
    assert expected, "the window holds the second phase's errors"
    assert sorted(hit["_id"] for hit in found) == sorted(doc_id(line) for line in expected)
    assert all(hit["step"] in range(*PHASES[1]) for hit in found)
    with_traceback = [hit for hit in found if hit["exception"]]
    assert with_traceback and all("MemoryError" in hit["exception"] for hit in with_traceback)


def test_a_trace_and_a_message_are_found(indexed_run: IndexedRun) -> None:
    traced = indexed_run.search("logs", indexed_run.of_run({"term": {"trace_id": "trace-step-12"}}))
    assert {hit["step"] for hit in traced} == {12}
    assert len(traced) == sum(
        1 for line in indexed_run.written() if line.get("trace_id") == "trace-step-12"
    )
    words = indexed_run.search(
        "logs", indexed_run.of_run({"match_phrase": {"message": "critical on rank 2"}})
    )
    assert {hit["step"] for hit in words} == {step for step in range(30) if step % 5 == 0}


def test_the_killed_indexer_left_every_record_indexed_exactly_once(indexed_run: IndexedRun) -> None:
    written = indexed_run.written()
    total = len(written)
    assert indexed_run.count("logs", indexed_run.of_run()) == total
    assert len({doc_id(line) for line in written}) == total
    assert phase_0_of(indexed_run) < indexed_run.killed_at_count < total, "killed mid-run"
    stopped = re.search(
        r"indexer stopped: \d+ documents indexed \((\d+) of them were there already\)",
        " ".join(indexed_run.restarted_log.split()),
    )
    assert stopped, indexed_run.restarted_log
    assert int(stopped[1]) >= 1, "the held request's documents were indexed again"


def phase_0_of(run: IndexedRun) -> int:
    return sum(1 for line in run.written() if line["step"] < PHASES[1][0])


def test_each_step_summary_is_one_document_with_its_metrics(indexed_run: IndexedRun) -> None:
    steps = indexed_run.search("steps", indexed_run.of_run())
    firsts = [hit for hit in steps if hit["revision"] == 1]
    assert sorted(hit["step"] for hit in firsts) == list(range(LAST_STEP + 1))
    # Rank 0 ends the run while another rank still logs its last steps: those steps' summaries
    # are revised (revision 2, every rank) and the revision is a document of its own.
    revised = [hit for hit in steps if hit["revision"] > 1]
    assert all(hit["step"] >= PHASES[2][0] for hit in revised)
    assert len({hit["summary_id"] for hit in steps}) == len(steps)
    spike = next(hit for hit in firsts if hit["step"] == SPIKE_STEP)
    reward = next(m for m in spike["metrics"] if m["name"] == "reward_mean")
    assert reward["mean"] == 6.0 and reward["count"] == RANKS
    status, body = request_json(
        "POST",
        f"{indexed_run.url}/{indexed_run.topics.prefix}-steps-*/_search",
        {
            "query": indexed_run.of_run(
                {
                    "nested": {
                        "path": "metrics",
                        "query": {
                            "bool": {
                                "filter": [
                                    {"term": {"metrics.name": "reward_mean"}},
                                    {"range": {"metrics.mean": {"gt": 5}}},
                                ]
                            }
                        },
                    }
                }
            )
        },
    )
    assert status == 200, body
    assert [hit["_source"]["step"] for hit in body["hits"]["hits"]] == [SPIKE_STEP]


def test_indexing_everything_again_overwrites_and_never_adds(indexed_run: IndexedRun) -> None:
    """A second group reads both topics from the start: every document is there already."""
    run = indexed_run
    logs_before = run.count("logs", {"match_all": {}})
    steps_before = run.count("steps", {"match_all": {}})
    replay = IndexerProcess(
        run.bootstrap,
        run.topics.prefix,
        run.url,
        run.work / "indexer-replay.log",
        {"index.group_id": f"{run.topics.prefix}-replay", "worker.partitions": 3},
    )
    with replay:
        wait_for(
            lambda: (
                "indexing into" in replay.log_text()
                and run.count("logs", {"match_all": {}}) == logs_before
                and _updated(run) >= logs_before + steps_before
            ),
            "every document indexed again",
        )
    assert replay.process is not None and replay.process.returncode == 0, replay.log_text()
    again = logs_before + steps_before
    assert f"indexer stopped: {again} documents indexed ({again} of them were there" in " ".join(
        replay.log_text().split()
    )
    assert run.count("logs", {"match_all": {}}) == logs_before
    assert run.count("steps", {"match_all": {}}) == steps_before


def _updated(run: IndexedRun) -> int:
    """Documents of the run's indices written more than once (their ``_version`` above 1)."""
    status, body = request_json(
        "POST",
        f"{run.url}/{run.topics.prefix}-*/_search",
        {"query": {"match_all": {}}, "size": 10_000, "version": True, "_source": False},
    )
    assert status == 200, body
    return sum(1 for hit in body["hits"]["hits"] if hit["_version"] > 1)


def test_a_document_the_engine_refuses_goes_to_the_dlq_and_the_rest_is_indexed(
    indexed_run: IndexedRun,
) -> None:
    """A record with more extra fields than an index may map: refused for good, not retried."""
    run = indexed_run
    run_id = f"refused-{uuid.uuid4().hex[:8]}"
    settings = settings_at(run.bootstrap, run.topics)
    with EventLogger(run_id, settings=settings) as events:
        many = {f"f{number}": "x" for number in range(1100)}
        events.log_record("INFO", 20, "trainer", "before", step=1)
        events.log_record("INFO", 20, "trainer", "too many fields", step=2, fields=many)
        events.log_record("INFO", 20, "trainer", "after", step=3)
        assert events.flush(30) == 0
    indexer = IndexerProcess(
        run.bootstrap,
        run.topics.prefix,
        run.url,
        run.work / "indexer-refused.log",
        {"worker.partitions": 3},
    )
    of_run = {"bool": {"filter": [{"term": {"run_id": run_id}}]}}
    with indexer:
        wait_for(lambda: run.count("logs", of_run) == 2, "the two records that fit")
        dead = read_all(
            run.bootstrap,
            run.topics.dlq,
            lambda found: any(m.key() == run_id.encode() for m in found),
            WAIT_S,
        )
    assert indexer.process is not None and indexer.process.returncode == 0, indexer.log_text()
    assert {hit["message"] for hit in run.search("logs", of_run)} == {"before", "after"}
    (letter,) = [m for m in dead if m.key() == run_id.encode()]
    headers = dict(letter.headers() or [])
    assert headers[REASON_HEADER].startswith(b"rejected: the search engine refused it: 400 ")
    assert b"Limit of total fields" in headers[REASON_HEADER]
    assert headers[SOURCE_HEADER].startswith(f"{run.topics.logs}/".encode())
    assert json.loads(letter.value())["message"] == "too many fields"
    assert "1 refused" in " ".join(indexer.log_text().split())


def test_every_response_with_a_phrase_is_found_across_a_run(indexed_run: IndexedRun) -> None:
    """The chosen samples' texts are indexed: a phrase search finds them, step after step."""
    run = indexed_run
    run_id = f"texts-{uuid.uuid4().hex[:8]}"
    settings = settings_at(run.bootstrap, run.topics)
    with EventLogger(run_id, settings=settings) as events:
        for step in range(3):
            samples: list[dict[str, object]] = [
                {"prompt": f"q{index}", "response": f"plain answer {index}", "reward": 0.5}
                for index in range(8)
            ]
            samples[2] = {"prompt": "q2", "response": "I think I think I think so", "reward": 1.0}
            events.log_samples(samples, step)
        assert events.flush(30) == 0
    indexer = IndexerProcess(
        run.bootstrap,
        run.topics.prefix,
        run.url,
        run.work / "indexer-texts.log",
        {"worker.partitions": 3},
    )
    of_run = {"term": {"run_id": run_id}}
    phrase = {"match_phrase": {"response_head": "I think so"}}
    with indexer:
        wait_for(
            lambda: run.count("sample-texts", {"bool": {"filter": [of_run]}}) > 0,
            "the chosen samples' texts",
        )
        wait_for(
            lambda: (
                run.count("sample-texts", {"bool": {"filter": [of_run], "must": [phrase]}}) == 3
            ),
            "the response with the phrase at each of the 3 steps",
        )
    found = run.search("sample-texts", {"bool": {"filter": [of_run], "must": [phrase]}})
    assert sorted(hit["step"] for hit in found) == [0, 1, 2]
    assert all(hit["reward"] == 1.0 and "best" in hit["chosen"] for hit in found)


def test_an_indexer_fenced_by_its_instance_id_exits_with_the_reason(
    kafka_bootstrap: str, opensearch_url: str, tmp_path: Path
) -> None:
    """Two indexers given one ``index.instance_id``: the first is fenced and says so.

    Each holds the one partition of the logs, steps and sample texts topics.
    """
    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}")
    ensure_topics(settings_at(kafka_bootstrap), topics, partitions=1)
    first, second = (
        IndexerProcess(
            kafka_bootstrap, topics.prefix, opensearch_url, tmp_path / f"indexer-{n}.log",
            {"index.instance_id": "the-same"},
        )
        for n in (1, 2)
    )  # fmt: skip
    try:
        first.start()
        wait_for(lambda: "indexing 3 partition(s)" in first.log_text(), "the first to join")
        second.start()
        wait_for(lambda: not first.alive(), "the fenced indexer to exit", 60.0)
        assert first.stop() == 1, first.log_text()
        assert "fatal Kafka error" in first.log_text()
        assert "index.instance_id" in first.log_text()
        wait_for(lambda: "indexing 3 partition(s)" in second.log_text(), "the second to join")
        assert second.alive(), second.log_text()
    finally:
        first.stop()
        second.stop()


def test_no_search_engine_is_one_clear_line_and_exit_1(kafka_bootstrap: str) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    command = [
        sys.executable, "-m", "rlpulse", "index", "--bootstrap", kafka_bootstrap,
        "--prefix", f"test-{uuid.uuid4().hex[:10]}", "--url", url, "--startup-timeout-s", "3",
    ]  # fmt: skip
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "250"},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"no search engine answered at {url} within 3 s" in done.stderr
    assert "rlpulse search up" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_dashboard_s_link_for_the_spike_s_point_finds_that_step_s_records(
    indexed_run: IndexedRun,
) -> None:
    """Grafana fills the link's variables; what Discover would run returns the step's records."""
    run = indexed_run
    dashboard = json.loads((REPO / "compose/grafana/dashboards/rlpulse.json").read_text())
    reward = next(panel for panel in dashboard["panels"] if panel["id"] == 2)
    logs_link = reward["fieldConfig"]["defaults"]["links"][0]
    start, end = run.phase_ends[0] - 60 * 10**9, run.phase_ends[-1] + 60 * 10**9
    filled = fill(
        logs_link["url"],
        {
            "search": "http://dashboards.example:5601",
            "__from:date:iso": iso(start),
            "__to:date:iso": iso(end),
            "index_prefix": run.topics.prefix,
            "run:percentencode": urllib.parse.quote(run.run_id, safe=""),
            "__data.fields.step": str(SPIKE_STEP),
        },
    )
    assert filled.startswith("http://dashboards.example:5601/app/discover#/?")
    index, lucene, (since, until) = discover_query(filled)
    assert index == f"{run.topics.prefix}-logs"
    assert lucene == f'run_id:"{run.run_id}" AND step:{SPIKE_STEP}'
    found = run.search(
        "logs",
        {
            "bool": {
                "filter": [
                    {"query_string": {"query": lucene}},
                    {"range": {"@timestamp": {"gte": since, "lte": until}}},
                ]
            }
        },
    )
    expected = [line for line in run.written() if line["step"] == SPIKE_STEP]
    assert sorted(hit["_id"] for hit in found) == sorted(doc_id(line) for line in expected)


def fill(template: str, values: dict[str, str]) -> str:
    """Grafana's interpolation of ``${name}`` and ``${name:format}`` in a data link."""
    filled = re.sub(r"\$\{([^}]+)\}", lambda match: values[match[1]], template)
    assert "$" not in filled, filled
    return filled


def iso(ns: int) -> str:
    moment = datetime.datetime.fromtimestamp(ns / 10**9, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def discover_query(url: str) -> tuple[str, str, tuple[str, str]]:
    """The index pattern, the Lucene query and the time range of a Discover URL's state."""
    state = urllib.parse.unquote(url.split("#/?", 1)[1])
    index = re.search(r"index:'([^']*)'", state)
    query = re.search(r"query:\(language:lucene,query:'((?:[^'!]|!.)*)'\)", state)
    time_range = re.search(r"time:\(from:'([^']*)',to:'([^']*)'\)", state)
    assert index and query and time_range, state
    lucene = re.sub(r"!(.)", r"\1", query[1])  # rison's escapes
    return index[1], lucene, (time_range[1], time_range[2])


def test_a_stop_while_a_request_hangs_commits_nothing_past_it(
    kafka_bootstrap: str, opensearch_url: str, tmp_path: Path
) -> None:
    """SIGTERM while a request never reached the engine: no later request commits past it.

    Fresh topics; two messages of records (100, then 200). The first request, half of the
    first message, is swallowed on its way; the next one, the rest of that message, waits
    behind it. Stopped then, the indexer must commit nothing: the next one indexes all 300.
    """
    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}")
    ensure_topics(settings_at(kafka_bootstrap), topics, partitions=3)
    run = IndexedRun(kafka_bootstrap, opensearch_url, topics, tmp_path)
    settings = {"worker.partitions": 3, "index.bulk_max_docs": 50}
    target = urllib.parse.urlsplit(opensearch_url)
    with HoldingProxy(target.hostname or "", target.port or 9200) as proxy:
        hanging = IndexerProcess(
            kafka_bootstrap,
            topics.prefix,
            proxy.url,
            tmp_path / "indexer-hanging.log",
            {**settings, "index.request_timeout_s": 10},  # hangs until after the SIGTERM
        )
        with hanging:
            wait_for(lambda: "indexing into" in hanging.log_text(), "the indexer's start")
            proxy.hold_next_bulk(forward=False)
            with EventLogger(run.run_id, settings=settings_at(kafka_bootstrap, topics)) as events:
                for part in (range(100), range(100, 300)):
                    for number in part:
                        events.log_record("INFO", 20, "trainer", f"record {number}", step=number)
                    assert events.flush(30) == 0  # a message each
            wait_for(proxy.holding.is_set, "the first request swallowed")
            time.sleep(1.0)  # the indexer builds the next requests meanwhile
            assert hanging.stop(timeout_s=30) == 0, hanging.log_text()
        assert not hanging.killed_after_timeout
    assert run.count("logs", run.of_run()) < 300
    with IndexerProcess(
        kafka_bootstrap, topics.prefix, opensearch_url, tmp_path / "indexer-after.log", settings
    ) as after:
        wait_for(lambda: run.count("logs", run.of_run()) >= 300, "the run's 300 records", 60)
        time.sleep(1.0)
    assert run.count("logs", run.of_run()) == 300, after.log_text()
