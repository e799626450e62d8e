"""The ACLs of each role: what it may touch under the prefix, and the kafka-acls.sh lines."""

from __future__ import annotations

import shlex

import pytest
from typer.testing import CliRunner

from rlpulse.cli import app
from rlpulse.schemas.topics import Topics
from rlpulse.transport.roles import ROLES, Grant, kafka_acls_commands, role_grants

TOPICS = Topics("p")


def allowed(role: str, operation: str) -> set[str]:
    """Literal topic names the role may ``operation``; prefixed grants end in ``*``."""
    return {
        grant.name + ("*" if grant.pattern == "prefixed" else "")
        for grant in role_grants(role, "p", "p-worker")  # type: ignore[arg-type]
        if grant.resource == "topic" and operation in grant.operations
    }


def test_trainer_writes_events_logs_samples_acks_and_reads_control_acks_and_its_own_back() -> None:
    own = {TOPICS.events, "p.logs", TOPICS.samples, TOPICS.sample_texts}
    assert allowed("trainer", "WRITE") == {*own, TOPICS.acks}
    assert allowed("trainer", "READ") == {TOPICS.control, TOPICS.acks, *own}
    assert allowed("trainer", "CREATE") == set()


def test_worker_topics() -> None:
    assert allowed("worker", "READ") == {
        TOPICS.events, TOPICS.acks, TOPICS.rules, TOPICS.ticks, "p-worker-*",
    }  # fmt: skip
    assert allowed("worker", "WRITE") == {
        TOPICS.steps, TOPICS.control, TOPICS.verdicts, TOPICS.dlq, TOPICS.ticks, "p-worker-*",
    }  # fmt: skip
    assert allowed("worker", "CREATE") == {"p.*", "p-worker-*"}


def test_operator_writes_control_and_rules_and_reads_acks_steps_and_verdicts() -> None:
    assert allowed("operator", "WRITE") == {TOPICS.control, TOPICS.rules}
    assert allowed("operator", "READ") == {TOPICS.acks, TOPICS.steps, TOPICS.verdicts}


def test_reader_reads_everything_but_the_samples_texts_and_writes_nothing() -> None:
    grants = role_grants("reader", "p", "p-worker")
    assert allowed("reader", "READ") == set(TOPICS.all()) - {TOPICS.sample_texts}
    assert allowed("text_reader", "READ") == set(TOPICS.all())
    assert allowed("archiver", "READ") == set(TOPICS.all())
    assert all(set(g.operations) <= {"READ", "DESCRIBE"} for g in grants)
    groups = {(g.name, g.pattern, g.operations) for g in grants if g.resource == "group"}
    assert ("p-worker", "literal", ("DESCRIBE",)) in groups  # sees the worker's lag, cannot join
    assert ("p-exporter", "literal", ("READ",)) in groups


def test_an_archiver_is_a_text_reader_that_writes_only_audit_reports() -> None:
    texts = role_grants("text_reader", "p", "p-worker")
    archiver = role_grants("archiver", "p", "p-worker")
    assert archiver[: len(texts)] == texts
    assert set(texts) - set(role_grants("reader", "p", "p-worker")) == {
        Grant("topic", TOPICS.sample_texts, "literal", ("READ",))
    }
    assert allowed("archiver", "WRITE") == {TOPICS.audits}


@pytest.mark.parametrize("role", ROLES)
def test_only_a_worker_may_use_the_worker_group(role: str) -> None:
    joins = [
        g
        for g in role_grants(role, "p", "p-worker")  # type: ignore[arg-type]
        if g.resource == "group" and g.name == "p-worker" and "READ" in g.operations
    ]
    assert bool(joins) == (role == "worker")


@pytest.mark.parametrize("role", ROLES)
def test_nothing_outside_the_prefix(role: str) -> None:
    for grant in role_grants(role, "p", "p-worker", ("p-dashboards",)):  # type: ignore[arg-type]
        assert grant.name.startswith(("p.", "p-")), grant


def test_kafka_acls_lines() -> None:
    lines = kafka_acls_commands(
        "User:o1",
        [
            Grant("topic", "p.", "prefixed", ("READ",)),
            Grant("group", "g", "literal", ("READ", "DESCRIBE")),
        ],
    )
    assert [shlex.split(line)[6:] for line in lines] == [
        ["--allow-principal", "User:o1", "--operation", "Read", "--topic", "p.",
         "--resource-pattern-type", "prefixed"],
        ["--allow-principal", "User:o1", "--operation", "Read", "--operation", "Describe",
         "--group", "g"],
    ]  # fmt: skip
    assert all(
        line.startswith('kafka-acls.sh --bootstrap-server "$KAFKA_BOOTSTRAP"') for line in lines
    )


def test_acl_print_command() -> None:
    result = CliRunner().invoke(
        app, ["broker", "acl", "print", "--role", "trainer", "--user", "t1", "--prefix", "p"]
    )
    assert result.exit_code == 0, result.output
    commands = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    assert len(commands) == len(role_grants("trainer", "p", "p-worker"))
    assert "--topic p.control" in result.stdout and "User:t1" in result.stdout
    unknown = CliRunner().invoke(app, ["broker", "acl", "print", "--role", "boss"])
    assert unknown.exit_code == 1 and "unknown role 'boss'" in unknown.stderr
