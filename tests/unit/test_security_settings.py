"""The security settings: where secrets may come from, that nothing shows them, what clients get."""

from __future__ import annotations

import json
import os
import ssl
import time
from pathlib import Path

import pytest
from faust.auth import SASLCredentials, SSLCredentials
from pydantic import SecretStr, ValidationError
from typer.testing import CliRunner

from rlpulse.cli import app
from rlpulse.exceptions import SettingsError
from rlpulse.local.tls import ensure_broker_tls
from rlpulse.settings import SecuritySettings, Settings, load_settings, masked
from rlpulse.transport.bootstrap import BROKER_MAIN_CLASS, BrokerRecord
from rlpulse.transport.clients import client_properties, faust_broker_options
from tests.recorded_process import process_running

PASSWORD = "s3cret-Password-that-must-never-show"
KEY = "a-signing-key-that-is-long-enough-0123456789"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("RLPULSE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("RLPULSE_HOME", str(tmp_path / "home"))


def sasl_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLPULSE_SECURITY__PROTOCOL", "sasl_ssl")
    monkeypatch.setenv("RLPULSE_SECURITY__USERNAME", "alice")
    monkeypatch.setenv("RLPULSE_SECURITY__PASSWORD", PASSWORD)


def test_the_default_is_plaintext_and_clients_are_unchanged() -> None:
    settings = Settings()
    assert settings.security.protocol == "PLAINTEXT"
    assert client_properties(settings) == {
        "bootstrap.servers": "127.0.0.1:9092",
        "reconnect.backoff.max.ms": 1000,
    }
    assert faust_broker_options(settings) == {"broker": "kafka://127.0.0.1:9092"}
    assert settings.security.signing_key() is None


def test_the_password_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    sasl_env(monkeypatch)
    security = load_settings().security
    assert (security.protocol, security.username) == ("SASL_SSL", "alice")
    assert security.sasl_password() == PASSWORD
    assert PASSWORD not in repr(security) and PASSWORD not in str(load_settings())


def test_or_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text(PASSWORD + "\n")
    security = SecuritySettings(protocol="SASL_SSL", username="alice", password_file=secret)
    assert security.sasl_password() == PASSWORD
    secret.write_text("")
    with pytest.raises(SettingsError, match="is empty"):
        security.sasl_password()
    secret.unlink()
    with pytest.raises(SettingsError, match="cannot read") as info:
        security.sasl_password()
    assert PASSWORD not in str(info.value)


@pytest.mark.parametrize("name", ["security.password", "security.control_signing_key"])
def test_a_secret_is_refused_as_a_flag(name: str) -> None:
    with pytest.raises(SettingsError, match="never written there") as info:
        load_settings({name: PASSWORD})
    assert PASSWORD not in str(info.value)
    assert "RLPULSE_SECURITY__" in str(info.value) and f"{name}_file" in str(info.value)


@pytest.mark.parametrize("field", ["password", "control_signing_key"])
def test_a_secret_is_refused_in_the_config_file(tmp_path: Path, field: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"security:\n  {field}: {PASSWORD}\n")
    with pytest.raises(SettingsError, match=f"sets security.{field}") as info:
        load_settings(config_file=config)
    assert PASSWORD not in str(info.value)
    result = CliRunner().invoke(app, ["config", "show", "--config", str(config)])
    assert result.exit_code == 1 and PASSWORD not in result.output


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"protocol": "SASL_SSL", "password": PASSWORD}, "needs a username"),
        ({"protocol": "SASL_SSL", "username": "a"}, "needs a password"),
        ({"username": "a", "password": PASSWORD}, "sends none"),
        ({"ca_file": "/ca.pem"}, "does not use TLS"),
        ({"protocol": "SSL", "cert_file": "/c.pem"}, "both cert_file and key_file"),
        (
            {"protocol": "SASL_SSL", "username": "a", "password": PASSWORD, "password_file": "/p"},
            "not both",
        ),
        ({"control_signing_key": "short"}, "at least 32 bytes"),
        ({"protocol": "KERBEROS"}, "PLAINTEXT"),
    ],
)
def test_inconsistent_security_is_refused_without_showing_secrets(
    section: dict[str, str], problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValidationError, match=problem) as info:
        Settings(security=section)  # type: ignore[arg-type]
    assert PASSWORD not in str(info.value)
    secrets = ("password", "control_signing_key")
    flags = {f"security.{k}": v for k, v in section.items() if k not in secrets}
    for name in secrets:
        if name in section:
            monkeypatch.setenv(f"RLPULSE_SECURITY__{name.upper()}", section[name])
    with pytest.raises(SettingsError, match=problem) as loaded:
        load_settings(flags)
    assert PASSWORD not in str(loaded.value)


def test_a_short_signing_key_file_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("short\n")
    with pytest.raises(SettingsError, match="at least 32 bytes"):
        SecuritySettings(control_signing_key_file=key).signing_key()
    key.write_text(KEY + "\n")
    assert SecuritySettings(control_signing_key_file=key).signing_key() == KEY.encode()


def test_config_show_masks_every_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    sasl_env(monkeypatch)
    monkeypatch.setenv("RLPULSE_SECURITY__CONTROL_SIGNING_KEY", KEY)
    monkeypatch.setenv("RLPULSE_LIBRDKAFKA", json.dumps({"ssl.key.password": PASSWORD}))
    for extra in ([], ["--json"]):
        result = CliRunner().invoke(app, ["config", "show", *extra], env={"COLUMNS": "250"})
        assert result.exit_code == 0, result.output
        assert PASSWORD not in result.output and KEY not in result.output
        assert "********" in result.output
    flat = masked(load_settings())
    assert flat["security.password"] == flat["security.control_signing_key"] == "********"
    assert flat["librdkafka"] == {"ssl.key.password": "********"}
    assert flat["security.username"] == "alice"


def test_sasl_ssl_client_properties(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    sasl_env(monkeypatch)
    monkeypatch.setenv("RLPULSE_SECURITY__CA_FILE", str(tmp_path / "ca.pem"))
    monkeypatch.setenv("RLPULSE_BOOTSTRAP", "kafka-1:9093")
    assert client_properties(load_settings()) == {
        "bootstrap.servers": "kafka-1:9093",
        "reconnect.backoff.max.ms": 1000,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "alice",
        "sasl.password": PASSWORD,
        "ssl.ca.location": str(tmp_path / "ca.pem"),
        "ssl.endpoint.identification.algorithm": "https",
    }


def test_mutual_tls_client_properties(tmp_path: Path) -> None:
    security = SecuritySettings(
        protocol="SSL",
        cert_file=tmp_path / "client.pem",
        key_file=tmp_path / "client.key",
        verify_hostname=False,
    )
    properties = client_properties(Settings(bootstrap="kafka-1:9093", security=security))
    assert properties == {
        "bootstrap.servers": "kafka-1:9093",
        "reconnect.backoff.max.ms": 1000,
        "security.protocol": "SSL",
        "ssl.certificate.location": str(tmp_path / "client.pem"),
        "ssl.key.location": str(tmp_path / "client.key"),
        "ssl.endpoint.identification.algorithm": "none",
    }


def test_the_local_secured_broker_lends_its_ca(tmp_path: Path) -> None:
    """With bootstrap unset, a TLS client trusts the CA the local broker recorded."""
    settings = Settings(security=SecuritySettings(protocol="SSL"))
    with process_running(BROKER_MAIN_CLASS) as broker_pid:
        BrokerRecord(
            pid=broker_pid,
            port=9092,
            controller_port=9093,
            bootstrap="127.0.0.1:9092",
            kafka_version="4.1.1",
            log_file="x",
            started_ns=time.time_ns(),
            secure=True,
            ca_file=str(tmp_path / "ca.pem"),
        ).write(settings.home / "broker")
        assert client_properties(settings)["ssl.ca.location"] == str(tmp_path / "ca.pem")
        elsewhere = settings.model_copy(update={"bootstrap": "kafka-1:9093"})
        assert "ssl.ca.location" not in client_properties(elsewhere)


def test_faust_gets_the_same_security(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tls = ensure_broker_tls(tmp_path / "tls")
    sasl_env(monkeypatch)
    monkeypatch.setenv("RLPULSE_SECURITY__CA_FILE", str(tls.ca_file))
    options = faust_broker_options(load_settings())
    credentials = options["broker_credentials"]
    assert isinstance(credentials, SASLCredentials)
    assert (credentials.username, credentials.password) == ("alice", PASSWORD)
    assert credentials.mechanism.value == "SCRAM-SHA-512"
    assert credentials.protocol.value == "SASL_SSL"
    assert isinstance(credentials.ssl_context, ssl.SSLContext)
    assert credentials.ssl_context.check_hostname and PASSWORD not in repr(credentials)
    plain_sasl = SecuritySettings(
        protocol="SASL_PLAINTEXT", username="a", password=SecretStr(PASSWORD)
    )
    options = faust_broker_options(Settings(security=plain_sasl))
    assert options["broker_credentials"].protocol.value == "SASL_PLAINTEXT"
    only_tls = SecuritySettings(protocol="SSL", ca_file=tls.ca_file)
    assert isinstance(
        faust_broker_options(Settings(security=only_tls))["broker_credentials"], SSLCredentials
    )


def test_local_broker_control_reads_no_security_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``broker down|status`` act on a local process: half-set credentials do not stop them."""
    monkeypatch.setenv("RLPULSE_SECURITY__PROTOCOL", "SASL_SSL")  # no username, no password
    with pytest.raises(SettingsError):
        load_settings()  # a client would be refused
    status = CliRunner().invoke(app, ["broker", "status"])
    assert status.exit_code == 1  # down
    assert status.stdout.startswith("Kafka is down"), status.output
    assert "security" not in status.output
    down = CliRunner().invoke(app, ["broker", "down"])
    assert (down.exit_code, down.stdout) == (0, "Kafka was not running\n")
    monkeypatch.setenv("RLPULSE_BROKER__PORT", "-1")  # the sections it reads are still checked
    bad = CliRunner().invoke(app, ["broker", "status"])
    assert bad.exit_code == 1 and "broker.port (from env RLPULSE_BROKER__PORT)" in bad.stderr
