"""Every Kafka client rlpulse uses is built here, from :class:`~rlpulse.settings.Settings`.

confluent-kafka clients (trainer producer and control client, operator commands, rules
publishing, the exporter's and archiver's consumers, admin calls) get their properties from
:func:`client_properties` plus what their role needs; the worker's faust app (aiokafka)
gets its connection options from :func:`faust_broker_options`. Each confluent client's
librdkafka log lines and errors go to ``logging`` once per kind of trouble (a broker that
is down makes librdkafka repeat itself every few hundred milliseconds). Creating a client
starts librdkafka's threads, so callers create them lazily; none of these functions does
network I/O itself.

Security comes from the ``security`` settings, for every client alike: the SASL mechanism
and credentials, the CA that signs the brokers' certificates, a client certificate for
mutual TLS. Failures that retrying cannot fix -- refused credentials, a certificate that
does not verify -- are told apart from a broker that is merely down (:func:`security_failure`):
librdkafka itself retries them forever, so each client logs them once as an error with a
sentence that says what to check, and start-up waits give up on them at once.
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from rlpulse.diagnostics import WarnOnce
from rlpulse.settings import Settings
from rlpulse.transport.bootstrap import BrokerRecord, bootstrap_servers, local_broker_dir
from rlpulse.transport.exceptions import ClientConfigError
from rlpulse.transport.partitioning import PARTITIONER

__all__ = [
    "QUEUE_MAX_MESSAGES",
    "ClientDiagnostics",
    "ca_file",
    "client_hooks",
    "client_properties",
    "faust_broker_options",
    "is_fatal",
    "kafka_error_of",
    "new_admin",
    "new_consumer",
    "new_producer",
    "security_failure",
    "ssl_context",
    "trainer_producer",
]

QUEUE_MAX_MESSAGES = 1_000_000
_LOG = logging.getLogger("rlpulse.librdkafka")
RECONNECT_BACKOFF_MAX_MS = 1000
_BROKER_HEAD = re.compile(r"^(?:[a-z_]+://)?\S+/\w+: ")


def security_failure(error: KafkaError, settings: Settings) -> str | None:
    """One sentence for an error that retrying cannot fix, else None.

    Those are refused credentials (``_AUTHENTICATION``, ``SASL_AUTHENTICATION_FAILED``) and
    a TLS handshake that failed (``_SSL``: an untrusted certificate, a wrong host name).
    """
    code = error.code()
    where = f"Kafka at {bootstrap_servers(settings)}"
    security = settings.security
    if code in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
        who = f"user {security.username!r}" if security.username else "this client"
        return (
            f"{where} refused the credentials of {who} ({security.protocol}, "
            f"{security.sasl_mechanism}): {_librdkafka_reason(error)}; check "
            "security.username, the password and security.sasl_mechanism"
        )
    if code == KafkaError._SSL:
        return (
            f"the TLS handshake with {where} failed: {_librdkafka_reason(error)}; check "
            "security.ca_file (the CA that signed the brokers' certificates) and "
            "security.verify_hostname"
        )
    return None


def is_fatal(error: KafkaError) -> bool:
    """Whether ``error`` ends its client for good: close the client, do not wait on it.

    E.g. a static consumer fenced by another member with its ``group.instance.id``.
    """
    return bool(error.fatal()) or error.code() == KafkaError._FATAL


def kafka_error_of(exc: BaseException) -> KafkaError | None:
    """The ``KafkaError`` behind ``exc``, or None.

    A ``KafkaException`` carries it; so does the ``SystemError`` confluent-kafka raises from
    ``poll``/``flush`` when a delivery callback runs after a fatal error was raised there
    (an idempotent producer of a user who may write no topic at all): it is the cause.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KafkaException) and seen.args and isinstance(seen.args[0], KafkaError):
            return seen.args[0]
        seen = seen.__cause__ or seen.__context__
    return None


def _librdkafka_reason(error: KafkaError) -> str:
    """The error's text without librdkafka's broker head and timing tail.

    The head is ``sasl_ssl://host:port/bootstrap: `` (``host:port/1: `` in plain text), the
    tail ``(after 301ms in state ...)``.
    """
    text = _BROKER_HEAD.sub("", error.str())
    cut = text.rfind(" (after ")
    return text[:cut] if cut > 0 else text


class ClientDiagnostics:
    """Routes one client's librdkafka logs and errors to ``logging`` without flooding it.

    Each error code is logged once at WARNING (fatal ones at ERROR), repeats and log
    lines at DEBUG. A :func:`security_failure` is kept in :attr:`failure`, where callers
    that wait for the client look for it, and logged once at ERROR as its sentence -- unless
    ``logs_failure`` is false because the caller raises it itself; the errors that follow
    from it (all brokers down) are then only logged at DEBUG.

    A ``quiet`` client (a one-shot command that ends with one sentence) logs everything at
    DEBUG; its caller puts :meth:`cause` in that sentence.
    """

    def __init__(
        self,
        client: str,
        settings: Settings | None = None,
        *,
        logs_failure: bool = True,
        quiet: bool = False,
    ) -> None:
        self._client = client
        self._settings = settings
        self._logs_failure = logs_failure and not quiet
        self._quiet = quiet
        self._warn = WarnOnce(_LOG)
        self.failure: str | None = None
        """The first security failure this client met, as a sentence."""
        self.error: KafkaError | None = None
        """The first error this client met that says why (not "all brokers are down")."""

    def cause(self) -> str | None:
        """Why the client got nowhere, in a few words: :attr:`failure`, else :attr:`error`."""
        if self.failure is not None:
            return self.failure
        return None if self.error is None else _librdkafka_reason(self.error)

    def log(self, level: int, fmt: str, *args: object) -> None:
        """Receive a librdkafka log line (the ``logger`` property calls this)."""
        loud = level >= logging.CRITICAL and not self._quiet
        _LOG.log(level if loud else logging.DEBUG, fmt, *args)

    def error_cb(self, error: KafkaError) -> None:
        """Receive a librdkafka client error (the ``error_cb`` property calls this)."""
        if self.error is None and error.code() != KafkaError._ALL_BROKERS_DOWN:
            self.error = error
        sentence = None if self._settings is None else security_failure(error, self._settings)
        fmt = "%s: Kafka error %s: %s"
        if self._quiet:
            if sentence is not None and self.failure is None:
                self.failure = sentence
            _LOG.debug(fmt, self._client, error.name(), error.str())
            return
        if sentence is not None:
            if self.failure is None:
                self.failure = sentence
                level = logging.ERROR if self._logs_failure else logging.DEBUG
                _LOG.log(level, "%s: %s", self._client, sentence)
            return
        if self.failure is not None and not self._logs_failure:
            _LOG.debug(fmt, self._client, error.name(), error.str())
        elif error.fatal():
            _LOG.error(fmt, self._client, error.name(), error.str())
        else:
            self._warn(str(error.code()), fmt, self._client, error.name(), error.str())


def client_hooks(client: str, diagnostics: ClientDiagnostics | None = None) -> dict[str, Any]:
    """The ``logger`` and ``error_cb`` properties for one client named ``client``."""
    diagnostics = diagnostics or ClientDiagnostics(client)
    return {"logger": diagnostics, "error_cb": diagnostics.error_cb}


def ca_file(settings: Settings) -> Path | None:
    """The CA file TLS clients verify brokers with.

    ``security.ca_file``; unset, and with ``bootstrap`` unset too, the CA of the secured
    local broker ``rlpulse broker up --secure`` started; else None (the system's CAs).
    """
    security = settings.security
    if security.ca_file is not None or settings.bootstrap:
        return security.ca_file
    record = BrokerRecord.read(local_broker_dir(settings))
    if record is not None and record.secure and record.ca_file:
        return Path(record.ca_file)
    return None


def client_properties(settings: Settings) -> dict[str, Any]:
    """The librdkafka properties every client shares: where Kafka is, and how to reach it."""
    properties: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers(settings),
        # librdkafka doubles the wait between reconnects up to 10 s by default: a broker back
        # after an outage would go unused for up to 10 s (docs/worker.md, "What a broker
        # failure costs").
        "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
    }
    security = settings.security
    if security.protocol == "PLAINTEXT":
        return properties
    properties["security.protocol"] = security.protocol
    if security.uses_sasl:
        properties["sasl.mechanism"] = security.sasl_mechanism
        properties["sasl.username"] = security.username
        properties["sasl.password"] = security.sasl_password()
    if security.uses_tls:
        ca = ca_file(settings)
        if ca is not None:
            properties["ssl.ca.location"] = str(ca)
        if security.cert_file is not None and security.key_file is not None:
            properties["ssl.certificate.location"] = str(security.cert_file)
            properties["ssl.key.location"] = str(security.key_file)
        properties["ssl.endpoint.identification.algorithm"] = (
            "https" if security.verify_hostname else "none"
        )
    return properties


def _build(
    kind: type[Any],
    properties: Mapping[str, Any],
    client: str,
    settings: Settings,
    diagnostics: ClientDiagnostics | None,
) -> Any:
    hooks = client_hooks(client, diagnostics or ClientDiagnostics(client, settings))
    try:
        return kind({**properties, **hooks})
    except (KafkaException, ValueError, TypeError) as exc:
        raise ClientConfigError(f"{client}: librdkafka refused the settings: {exc}") from exc


def new_producer(
    settings: Settings,
    client: str,
    overrides: Mapping[str, Any] | None = None,
    diagnostics: ClientDiagnostics | None = None,
) -> Producer:
    """A confluent ``Producer`` (``acks=all``, murmur2); ``settings.librdkafka`` is merged last.

    Every producer partitions keyed records with murmur2, the Java client's (and faust's)
    partitioner, so a run's records land on one partition whichever client wrote them
    (:mod:`rlpulse.transport.partitioning`).

    ``diagnostics`` (default: a new one) receives the client's errors.
    """
    properties = {
        **client_properties(settings),
        "acks": "all",
        "partitioner": PARTITIONER,
        **(overrides or {}),
        **settings.librdkafka,
    }
    producer: Producer = _build(Producer, properties, client, settings, diagnostics)
    return producer


def trainer_producer(
    settings: Settings, client: str, diagnostics: ClientDiagnostics | None = None
) -> Producer:
    """The trainer's idempotent, batched, compressed event producer.

    One request in flight per broker: with more, a request refused while its partition is
    being created (the metadata names the leader before that broker serves it) can be
    overtaken by the next one, after which Kafka before 4.5 refuses its retries and
    librdkafka reports its records delivered though none was written (KAFKA-15591; seen
    here: a trainer started with its topics losing its first event). A trainer may start
    before the worker creates the topics, so it cannot rely on them being ready.

    ``diagnostics`` (default: a new one) receives the client's errors.
    """
    producer_settings = settings.producer
    return new_producer(
        settings,
        client,
        {
            "enable.idempotence": True,
            "max.in.flight.requests.per.connection": 1,
            "linger.ms": producer_settings.linger_ms,
            "compression.type": producer_settings.compression,
            "queue.buffering.max.messages": QUEUE_MAX_MESSAGES,
            "message.timeout.ms": max(1, round(producer_settings.delivery_timeout_s * 1000)),
        },
        diagnostics,
    )


def new_consumer(
    settings: Settings,
    group_id: str,
    client: str,
    overrides: Mapping[str, Any] | None = None,
    diagnostics: ClientDiagnostics | None = None,
) -> Consumer:
    """A confluent ``Consumer`` that never commits unless ``overrides`` say so.

    ``diagnostics`` (default: a new one) receives the client's errors.
    """
    properties = {
        **client_properties(settings),
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        **(overrides or {}),
        **settings.librdkafka,
    }
    consumer: Consumer = _build(Consumer, properties, client, settings, diagnostics)
    return consumer


def new_admin(
    settings: Settings, client: str = "admin", diagnostics: ClientDiagnostics | None = None
) -> AdminClient:
    """A confluent ``AdminClient``; ``diagnostics`` (default: a new one) receives its errors.

    An admin client reports its errors only while something calls its ``poll()``.
    """
    admin: AdminClient = _build(
        AdminClient, {**client_properties(settings), **settings.librdkafka}, client, settings,
        diagnostics,
    )  # fmt: skip
    return admin


def ssl_context(settings: Settings) -> ssl.SSLContext:
    """The TLS context of aiokafka clients: the brokers' CA, and the client certificate if set."""
    security = settings.security
    ca = ca_file(settings)
    try:
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=None if ca is None else str(ca)
        )
        if security.cert_file is not None and security.key_file is not None:
            context.load_cert_chain(str(security.cert_file), str(security.key_file))
    except (OSError, ssl.SSLError) as exc:
        raise ClientConfigError(f"cannot load the TLS files of the security settings: {exc}") from (
            exc
        )
    context.check_hostname = security.verify_hostname
    return context


def worker_client_id(pid: int) -> str:
    """The Kafka client id of the worker process ``pid`` on this host (its group member's)."""
    return f"rlpulse-worker-{socket.gethostname()}-{pid}"


def faust_broker_options(settings: Settings) -> dict[str, Any]:
    """The connection options of the worker's ``faust.App`` (aiokafka underneath).

    ``broker_credentials`` carries the same security as :func:`client_properties`: faust's
    ``SASLCredentials`` (SASL_SSL when it has a TLS context, SASL_PLAINTEXT without) or
    ``SSLCredentials``.
    """
    options: dict[str, Any] = {"broker": f"kafka://{bootstrap_servers(settings)}"}
    security = settings.security
    if security.protocol == "PLAINTEXT":
        return options
    from faust.auth import SASLCredentials, SSLCredentials

    context = ssl_context(settings) if security.uses_tls else None
    if security.uses_sasl:
        options["broker_credentials"] = SASLCredentials(
            username=security.username,
            password=security.sasl_password(),
            mechanism=security.sasl_mechanism,
            ssl_context=context,
        )
    else:
        options["broker_credentials"] = SSLCredentials(context)
    return options
