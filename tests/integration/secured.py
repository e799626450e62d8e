"""A secured local broker for tests: started by `rlpulse broker up --secure`, users by role.

The broker gets free ports and a state directory of its own; every user is made with
`rlpulse broker user add` (the command line under test), so its password lives in the
broker's state directory and reaches clients through ``security.password_file``.
"""

from __future__ import annotations

import datetime
import os
import re
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from confluent_kafka import TopicPartition
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rlpulse.local.broker import LocalBroker
from rlpulse.local.private_files import write_private
from rlpulse.schemas.topics import Topics
from rlpulse.settings import ProducerSettings, SecuritySettings, Settings
from rlpulse.transport.bootstrap import BrokerRecord
from rlpulse.transport.clients import new_consumer

T = TypeVar("T")


def rlpulse(
    *args: str, env: Mapping[str, str] | None = None, timeout_s: float = 180.0
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m rlpulse ARGS`` with no RLPULSE_* from the machine but ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RLPULSE_")}
    return subprocess.run(
        [sys.executable, "-m", "rlpulse", *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=timeout_s,
        check=False,
    )


@dataclass
class SecuredBroker:
    """A running ``--secure`` broker, the users made on it, and where their files are."""

    state_dir: Path
    record: BrokerRecord
    topics: Topics
    work_dir: Path
    signing_key_file: Path
    passwords: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    """What the broker's own commands ran with (``start_secured_broker``'s ``env``)."""

    @property
    def bootstrap(self) -> str:
        return self.record.bootstrap

    @property
    def ca_file(self) -> Path:
        assert self.record.ca_file is not None
        return Path(self.record.ca_file)

    @property
    def local(self) -> LocalBroker:
        return LocalBroker(Settings(), state_dir=self.state_dir, secure=True)

    def admin(self) -> Settings:
        """The broker's admin (a super user), on this broker's prefix."""
        settings = self.local.client_settings(self.bootstrap)
        return settings.model_copy(update={"prefix": self.topics.prefix})

    def add_user(self, name: str, role: str) -> None:
        made = rlpulse(
            "broker", "user", "add", name, "--role", role,
            "--prefix", self.topics.prefix, "--state-dir", str(self.state_dir), env=self.env,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        self.passwords[name] = self.local.user_password_file(name).read_text().strip()

    def security(self, user: str, *, signing: bool = False, **changes: Any) -> dict[str, Any]:
        """The ``security`` section of ``user`` (no password in it: a password file)."""
        section: dict[str, Any] = {
            "protocol": "SASL_SSL",
            "username": user,
            "password_file": str(self.local.user_password_file(user)),
            "ca_file": str(self.ca_file),
        }
        if signing:
            section["control_signing_key_file"] = str(self.signing_key_file)
        section.update(changes)
        return section

    def settings(self, user: str, *, signing: bool = False, **changes: Any) -> Settings:
        """Client settings of ``user`` on this broker and prefix."""
        spool = Path(self.work_dir / f"spool-{uuid.uuid4().hex[:6]}")
        return Settings(
            bootstrap=self.bootstrap,
            prefix=self.topics.prefix,
            producer=ProducerSettings(spool_dir=spool),
            security=SecuritySettings(**self.security(user, signing=signing, **changes)),
        )

    def config_file(self, user: str, *, signing: bool = False, **changes: Any) -> Path:
        """A YAML config file for ``user`` (bootstrap, prefix, security)."""
        path = self.work_dir / f"{user}-{uuid.uuid4().hex[:6]}.yaml"
        tree = {
            "bootstrap": self.bootstrap,
            "prefix": self.topics.prefix,
            "security": self.security(user, signing=signing, **changes),
        }
        path.write_text(yaml.safe_dump(tree))
        return path

    def secrets(self) -> list[str]:
        """Every password and key a log or an output must never show."""
        admin = self.local.admin_password_file.read_text().strip()
        return [admin, self.signing_key_file.read_text().strip(), *self.passwords.values()]

    def broker_log_size(self) -> int:
        return Path(self.record.log_file).stat().st_size

    def denials_since(self, offset: int) -> list[str]:
        """The authorizer's denials the broker logged after byte ``offset`` of its log."""
        with Path(self.record.log_file).open("rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        return [line for line in text.splitlines() if "is Denied operation" in line]


def start_secured_broker(
    base: Path, env: Mapping[str, str] | None = None
) -> Iterator[SecuredBroker]:
    """`rlpulse broker up --secure` on free ports in ``base``; stopped when the caller is done.

    ``env``: more variables for the broker's commands (another host, a PATH without java).
    """
    state_dir = base / "broker"
    env = dict(env or {})
    up = rlpulse("broker", "up", "--secure", "--port", "0", "--state-dir", str(state_dir), env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        said = " ".join(up.stdout.split())
        assert re.search(r"secured: SASL_SSL, SCRAM-SHA-512, ACLs; CA \S*ca\.pem", said), said
        record = BrokerRecord.read(state_dir)
        assert record is not None and record.secure
        key_file = base / "signing.key"
        write_private(key_file, secrets.token_urlsafe(32).encode() + b"\n")
        topics = Topics(prefix=f"sec-{uuid.uuid4().hex[:8]}")
        work = base / "work"
        work.mkdir()
        yield SecuredBroker(state_dir, record, topics, work, key_file, env=env)
    finally:
        down = rlpulse("broker", "down", "--state-dir", str(state_dir), env=env)
        assert down.returncode == 0, down.stderr


def read_topic(
    settings: Settings,
    topic: str,
    decode: Callable[[bytes], T],
    done: Callable[[list[T]], bool],
    *,
    timeout_s: float = 60.0,
    role: str = "reader",
) -> list[T]:
    """Decode ``topic`` from offset 0 (as ``settings``' user) until ``done`` or the deadline.

    The consumer's group is one the ``role`` may use (``<prefix>-<role>-...``).
    """
    group = f"{settings.prefix}-{role}-{uuid.uuid4().hex}"
    consumer = new_consumer(settings, group, "test read")
    try:
        metadata = consumer.list_topics(topic=topic, timeout=timeout_s)
        partitions = metadata.topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records: list[T] = []
        deadline = time.monotonic() + timeout_s
        while not done(records) and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.2):
                if message.error() is None:
                    records.append(decode(message.value() or b""))
        return records
    finally:
        consumer.close()


def issue_client_certificate(tls_dir: Path, common_name: str, out: Path) -> tuple[Path, Path]:
    """A client certificate ``CN=<common_name>`` signed by the local broker's CA: (cert, key)."""
    assert common_name != "broker"  # that name is the broker's super user
    ca_key = serialization.load_pem_private_key((tls_dir / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    ca = x509.load_pem_x509_certificate((tls_dir / "ca.pem").read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_file, key_file = out / f"{common_name}.pem", out / f"{common_name}.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    write_private(
        key_file,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    return cert_file, key_file
