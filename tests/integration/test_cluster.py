"""The worker on a real three-node Apache Kafka cluster (KRaft) on 127.0.0.1.

``LocalCluster`` (``rlpulse broker up --nodes 3``) runs three nodes from the same jars:
replication 3, ``min.insync.replicas`` 2. The worker must create every topic it uses (its own
and faust's) with three replicas, warn with the fix about a topic left at one, and keep the
control loop running through the loss of a broker: the broker leading the run's events
partition is SIGKILLed at step 30 of a run logging a step every 0.3 s, and comes back 20 s
later (step ~97). KL passes 0.3 from step 60, so kl-guard is due for step 62, while that broker
is still down. Bound: the stop is applied by step 70. Leader fail-over costs the broker's
session timeout (``broker.session.timeout.ms``, 9 s in KRaft: 30 steps) after the kill at step
30, so the worker resumes around step 60; it then catches up at its drain rate (a few hundred
events a second against 13 a second here) and has issued the command by step 62 plus its
command latency (well under a second: 3 steps). 70 leaves a margin of about 5 steps.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewTopic

from rlpulse.local.cluster import LocalCluster
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.producers import RunLink
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import ControlCommand, StepSummary
from rlpulse.schemas.topics import Topics
from rlpulse.settings import BrokerSettings, Settings
from rlpulse.transport.partitioning import partition_for
from rlpulse.transport.topics import ensure_topics
from tests.integration.topic_reader import read_until
from tests.kafka import settings_at

pytestmark = [pytest.mark.broker, pytest.mark.timeout(600)]

RANKS = 4
STEP_S = 0.3
KILL_AT_STEP = 30
OUTAGE_S = 20.0
KL_FROM = 60
KL_GUARD_STEP = 62
STOP_BY_STEP = 70
LAST_STEP = 120


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Three local Kafka nodes, stopped after this module's tests."""
    settings = Settings(broker=BrokerSettings(heap="512m"))
    state = settings.home / f"test-cluster-{uuid.uuid4().hex[:8]}"
    local = LocalCluster(settings, nodes=3, state_dir=state, port=0)
    local.up()
    try:
        yield local
    finally:
        local.down()


def replicas(admin: AdminClient) -> dict[str, set[int]]:
    topics = admin.list_topics(timeout=10).topics
    return {n: {len(p.replicas) for p in t.partitions.values()} for n, t in topics.items()}


def min_insync(admin: AdminClient, topic: str) -> str:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return str(admin.describe_configs([resource])[resource].result()["min.insync.replicas"].value)


def test_the_worker_replicates_every_topic_and_warns_about_one_left_at_one_copy(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    app_id = f"{topics.prefix}-worker"
    single = f"{app_id}-joiner-groups-changelog"  # as an earlier worker, at faust's default
    admin.create_topics([NewTopic(single, num_partitions=3, replication_factor=1)])[single].result()
    worker = WorkerProcess(cluster.bootstrap, topics.prefix, tmp_path / "worker.log", partitions=3)
    try:
        worker.start()
        worker.wait_consuming(timeout_s=120.0)
        found = replicas(admin)
        mine = {n: r for n, r in found.items() if n.startswith((topics.prefix + ".", app_id))}
        assert set(topics.all()) <= set(mine)
        assert {f"{app_id}-rule-state-changelog", f"{app_id}-__assignor-__leader"} <= set(mine)
        assert {n: r for n, r in mine.items() if r != {3}} == {single: {1}}
        for name in (topics.events, topics.steps, topics.control, f"{app_id}-rule-state-changelog"):
            assert min_insync(admin, name) == "2", name
        log = worker.log_file.read_text()
        assert (
            f"1 topic(s) have fewer than 3 replicas on this 3-broker cluster: {single} (1)" in log
        )
        plan_file = worker.data_dir / "replication-plan.json"
        assert f"--reassignment-json-file {plan_file} --execute" in log
        plan = json.loads(plan_file.read_text())
        assert {(p["topic"], len(set(p["replicas"]))) for p in plan["partitions"]} == {(single, 3)}
    finally:
        worker.stop()


def test_a_dead_leader_costs_the_fail_over_not_the_outage(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    topics = Topics(prefix=f"test-{uuid.uuid4().hex[:10]}")
    settings = settings_at(cluster.bootstrap, topics)
    ensure_topics(settings, topics, partitions=3)
    run_id = f"failover-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    partition = partition_for(run_id.encode(), 3)
    metadata = admin.list_topics(topic=topics.events, timeout=10)  # asks for it, not a cache
    leader = metadata.topics[topics.events].partitions[partition].leader
    worker = WorkerProcess(cluster.bootstrap, topics.prefix, tmp_path / "worker.log", partitions=3)
    links = [RunLink(run_id, rank=r, world_size=RANKS, settings=settings) for r in range(RANKS)]
    outage: list[threading.Thread] = []

    def kill_then_restart() -> None:
        cluster.kill(leader)
        time.sleep(OUTAGE_S)
        cluster.start(leader)

    stop: ControlCommand | None = None
    applied_at: int | None = None
    try:
        worker.start()
        worker.wait_consuming(timeout_s=120.0)
        links[0].run_start(1)
        step = 0
        for step in range(1, LAST_STEP + 1):
            began = time.monotonic()
            if step == KILL_AT_STEP:
                outage.append(threading.Thread(target=kill_then_restart, daemon=True))
                outage[0].start()
            kl = 0.5 if step >= KL_FROM else 0.1
            for rank, link in enumerate(links):
                link.log({"kl_divergence": kl + rank / 1000, "reward_mean": 1.0}, step, "actor")
            for command in links[0].poll_commands():
                if command["rule_id"] == "kl-guard":
                    stop, applied_at = command, step
            if stop is not None:
                break
            time.sleep(max(0.0, STEP_S - (time.monotonic() - began)))
        assert stop is not None, f"kl-guard never arrived by step {step}:\n{worker.log_file}"
        assert stop["step"] == KL_GUARD_STEP
        print(f"kill at step {KILL_AT_STEP}, stop applied at step {applied_at}")  # the figure
        assert applied_at is not None and applied_at <= STOP_BY_STEP, applied_at
        assert worker.alive()
        for link in links:
            assert link.flush(timeout_s=60.0) == 0
        codec = default_codec()
        summaries: list[StepSummary] = read_until(
            cluster.bootstrap,
            topics.steps,
            codec.decode_summary,
            lambda found: all(
                step in {s["step"] for s in found if len(s["ranks_reported"]) == RANKS}
                for step in range(1, applied_at + 1)
            ),
            timeout_s=120.0,
            keep=lambda s: s["run_id"] == run_id,
        )
        ids = [s["summary_id"] for s in summaries]
        assert len(ids) == len(set(ids)), "a summary was published twice"
        per_step = [s["step"] for s in summaries if s["revision"] == 1]
        assert sorted(per_step) == list(range(1, applied_at + 1))  # one summary per step
        # Nothing lost: a step whose last ranks arrived after its grace period (while the
        # leader was down) was closed by grace and has a revision with every rank.
        latest: dict[int, StepSummary] = {}
        for summary in summaries:
            if summary["revision"] >= latest.get(summary["step"], summary)["revision"]:
                latest[summary["step"]] = summary
        counts = {n: len(s["ranks_reported"]) for n, s in latest.items()}
        short = {n: count for n, count in counts.items() if count != RANKS}
        assert short == {}, short
    finally:
        for link in links:
            link.close(10)
        worker.stop()
        for thread in outage:
            thread.join(timeout=OUTAGE_S + 120)
        if leader not in cluster.running():
            cluster.start(leader)
