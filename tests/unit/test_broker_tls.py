"""The secured local broker's certificates: made once, valid for the broker, renewed in time."""

from __future__ import annotations

import datetime
import ipaddress
import stat
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from rlpulse.local.tls import BROKER_COMMON_NAME, RENEW_BEFORE, ensure_broker_tls

NOW = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)


def leaf_and_chain(keystore: Path) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(keystore.read_bytes())


def test_a_ca_and_a_broker_certificate_signed_by_it(tmp_path: Path) -> None:
    tls = ensure_broker_tls(tmp_path / "tls", now=NOW)
    ca = x509.load_pem_x509_certificate(tls.ca_file.read_bytes())
    leaf, chain_ca = leaf_and_chain(tls.keystore)
    assert chain_ca == ca
    leaf.verify_directly_issued_by(ca)
    assert leaf.subject.rfc4514_string() == f"CN={BROKER_COMMON_NAME}"
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    usage = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert b"BEGIN PRIVATE KEY" in tls.keystore.read_bytes()  # unencrypted PKCS#8 first
    for private in (tls.keystore, tls.ca_key):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600


def test_reused_until_the_broker_certificate_nears_its_end(tmp_path: Path) -> None:
    tls = ensure_broker_tls(tmp_path / "tls", now=NOW)
    first = leaf_and_chain(tls.keystore)[0]
    assert leaf_and_chain(ensure_broker_tls(tls.directory, now=NOW).keystore)[0] == first
    late = first.not_valid_after_utc - RENEW_BEFORE + datetime.timedelta(days=1)
    renewed = leaf_and_chain(ensure_broker_tls(tls.directory, now=late).keystore)[0]
    assert renewed != first and renewed.not_valid_after_utc > first.not_valid_after_utc
    ca = x509.load_pem_x509_certificate(tls.ca_file.read_bytes())
    renewed.verify_directly_issued_by(ca)  # the same CA: clients keep trusting it
    assert isinstance(renewed.public_key(), ec.EllipticCurvePublicKey)


def test_a_broker_other_nodes_reach_is_certified_for_its_advertised_host(tmp_path: Path) -> None:
    tls = ensure_broker_tls(tmp_path / "tls", now=NOW)
    first = leaf_and_chain(tls.keystore)[0]
    for host, kind, value in (
        ("10.1.2.3", x509.IPAddress, ipaddress.ip_address("10.1.2.3")),
        ("login1.cluster", x509.DNSName, "login1.cluster"),
    ):
        leaf = leaf_and_chain(ensure_broker_tls(tls.directory, now=NOW, hosts=(host,)).keystore)[0]
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert value in names.get_values_for_type(kind)
        assert "localhost" in names.get_values_for_type(x509.DNSName)  # the broker dials itself
        assert leaf != first
    same = ensure_broker_tls(tls.directory, now=NOW, hosts=("login1.cluster",))
    assert leaf_and_chain(same.keystore)[0] == leaf  # already holds it: kept
