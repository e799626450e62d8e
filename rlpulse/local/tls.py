"""The TLS files of the secured local broker: a CA and the broker's certificate, made once.

``rlpulse broker up --secure`` calls :func:`ensure_broker_tls` before every start: the first
time it makes a CA (valid ten years) and a broker certificate signed by it (one year,
``CN=broker``, for ``localhost``, ``127.0.0.1`` and the host clients are told to use, usable
as server and as client since the broker also dials its own TLS listeners); later it reuses
them, renewing the broker certificate when it has less than :data:`RENEW_BEFORE` left or
does not name a host asked for. Clients trust ``ca.pem``.

Keys are EC P-256, unencrypted PKCS#8, written with mode 0600: Kafka's JDK cannot read the
PBES2-encrypted keys ``cryptography`` writes, and a password next to the key would protect
nothing. The broker reads its key and certificate chain from one PEM file
(``ssl.keystore.location``). No other certificate is ever issued with ``CN=broker`` -- that
name is a super user of the broker.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rlpulse.local.private_files import write_private

__all__ = ["BROKER_COMMON_NAME", "RENEW_BEFORE", "BrokerTls", "ensure_broker_tls"]

BROKER_COMMON_NAME = "broker"
CA_COMMON_NAME = "rlpulse local broker CA"
CA_LIFETIME = datetime.timedelta(days=3650)
BROKER_LIFETIME = datetime.timedelta(days=365)
RENEW_BEFORE = datetime.timedelta(days=30)
_BACKDATE = datetime.timedelta(minutes=5)  # clocks of clients that run slightly behind


@dataclass(frozen=True)
class BrokerTls:
    """Where the TLS files of one local broker live."""

    directory: Path

    @property
    def ca_file(self) -> Path:
        """The CA certificate clients verify the broker with (PEM)."""
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        """The CA's private key (0600), kept to renew the broker certificate."""
        return self.directory / "ca.key"

    @property
    def keystore(self) -> Path:
        """The broker's key, certificate and the CA, in one PEM file (0600)."""
        return self.directory / "broker-keystore.pem"


def ensure_broker_tls(
    directory: Path, now: datetime.datetime | None = None, hosts: tuple[str, ...] = ()
) -> BrokerTls:
    """The broker's TLS files in ``directory``, made or renewed as needed (see the module).

    ``hosts``: names or addresses the certificate must hold besides localhost and 127.0.0.1.
    """
    tls = BrokerTls(directory)
    moment = now or datetime.datetime.now(datetime.UTC)
    if tls.ca_file.exists() and tls.ca_key.exists():
        ca_cert = x509.load_pem_x509_certificate(tls.ca_file.read_bytes())
        ca_key = _load_key(tls.ca_key.read_bytes())
    else:
        ca_key = _new_key()
        ca_cert = _ca_certificate(ca_key, moment)
        write_private(tls.ca_key, _key_pem(ca_key))
        tls.ca_file.write_bytes(_cert_pem(ca_cert))
    names = _subject_names(hosts)
    if _still_valid(tls.keystore, ca_cert, moment, names):
        return tls
    broker_key = _new_key()
    broker_cert = _broker_certificate(broker_key, ca_key, ca_cert, moment, names)
    write_private(tls.keystore, _key_pem(broker_key) + _cert_pem(broker_cert) + _cert_pem(ca_cert))
    return tls


def _subject_names(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    """localhost, 127.0.0.1 and ``hosts``, each as a DNS name or an IP address."""
    names: list[x509.GeneralName] = []
    for host in ("localhost", "127.0.0.1", *hosts):
        try:
            name: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            name = x509.DNSName(host)
        if name not in names:
            names.append(name)
    return names


def _still_valid(
    keystore: Path,
    ca_cert: x509.Certificate,
    moment: datetime.datetime,
    names: list[x509.GeneralName],
) -> bool:
    """Whether the keystore holds a broker certificate of this CA, for ``names``, good a while."""
    if not keystore.exists():
        return False
    leaf = x509.load_pem_x509_certificates(keystore.read_bytes())[0]
    held = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return (
        leaf.issuer == ca_cert.subject
        and leaf.not_valid_after_utc - RENEW_BEFORE > moment
        and ca_cert.not_valid_after_utc > moment
        and all(name in held for name in names)
    )


def _new_key() -> EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _load_key(data: bytes) -> EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(data, password=None)
    if not isinstance(key, EllipticCurvePrivateKey):
        raise ValueError("the local broker's CA key is not an EC key")
    return key


def _key_pem(key: EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not ca,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _ca_certificate(key: EllipticCurvePrivateKey, moment: datetime.datetime) -> x509.Certificate:
    return (
        x509.CertificateBuilder()
        .subject_name(_name(CA_COMMON_NAME))
        .issuer_name(_name(CA_COMMON_NAME))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(moment - _BACKDATE)
        .not_valid_after(moment + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _broker_certificate(
    key: EllipticCurvePrivateKey,
    ca_key: EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    moment: datetime.datetime,
    names: list[x509.GeneralName],
) -> x509.Certificate:
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    return (
        x509.CertificateBuilder()
        .subject_name(_name(BROKER_COMMON_NAME))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(moment - _BACKDATE)
        .not_valid_after(min(moment + BROKER_LIFETIME, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
