"""The one settings tree: defaults, the four sources and their order, errors, config show."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from rlpulse.cli import app
from rlpulse.exceptions import SettingsError
from rlpulse.settings import Settings, environment_names, explain, load_settings, masked
from rlpulse.transport.bootstrap import BROKER_MAIN_CLASS, BrokerRecord, bootstrap_servers
from rlpulse.transport.clients import client_properties
from tests.recorded_process import process_running


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No RLPULSE_* from the machine; a home of the test's own."""
    import os

    for name in list(os.environ):
        if name.startswith("RLPULSE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("RLPULSE_HOME", str(tmp_path / "home"))
    return tmp_path


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_defaults() -> None:
    settings = Settings()
    assert settings.bootstrap is None
    assert settings.prefix == "rlpulse"
    assert (settings.producer.linger_ms, settings.producer.compression) == (5, "lz4")
    assert (settings.worker.grace_s, settings.worker.late_window_s) == (30.0, 600.0)
    assert (settings.worker.partitions, settings.worker.rules) == (6, "topic")
    assert settings.worker.metrics_host == "0.0.0.0"
    assert settings.limits.max_metrics == 1024
    assert settings.worker_group == "rlpulse-worker"
    assert settings.spool_root == settings.home / "spool"
    assert settings.worker_data_dir == settings.home / "worker-data" / "rlpulse-worker"


def test_each_source_wins_over_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """flag > RLPULSE_* > config file > default, for one setting changed through each."""
    name = "worker.grace_s"
    assert load_settings().worker.grace_s == 30.0
    assert explain()[name] == "default"

    config = write_config(tmp_path / "rlpulse.yaml", "worker:\n  grace_s: 11\n")
    assert load_settings(config_file=config).worker.grace_s == 11.0
    assert explain(config_file=config)[name] == f"file {config}"
    monkeypatch.setenv("RLPULSE_CONFIG", str(config))  # the same file, named by the environment
    assert load_settings().worker.grace_s == 11.0

    monkeypatch.setenv("RLPULSE_WORKER__GRACE_S", "12")
    assert load_settings(config_file=config).worker.grace_s == 12.0
    assert explain(config_file=config)[name] == "env RLPULSE_WORKER__GRACE_S"

    flags = {name: 13.0, "worker.partitions": None}  # None: a flag not given
    assert load_settings(flags, config).worker.grace_s == 13.0
    assert load_settings(flags, config).worker.partitions == 6
    assert explain(flags, config)[name] == "flag"
    # the other settings of the same section keep their own sources
    assert explain(flags, config)["worker.late_window_s"] == "default"


def test_top_level_environment_names(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RLPULSE_BOOTSTRAP", "kafka-1:9092,kafka-2:9092")
    monkeypatch.setenv("RLPULSE_PREFIX", "team-a")
    monkeypatch.setenv("RLPULSE_HOME", str(tmp_path / "elsewhere"))
    settings = Settings()
    assert (settings.bootstrap, settings.prefix) == ("kafka-1:9092,kafka-2:9092", "team-a")
    assert settings.home == tmp_path / "elsewhere"
    assert Settings(bootstrap="other:1").bootstrap == "other:1"  # code wins over env


def test_blank_bootstrap_means_unset_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLPULSE_BOOTSTRAP", "  ")
    settings = Settings()
    assert settings.bootstrap is None
    assert bootstrap_servers(settings) == "127.0.0.1:9092"
    assert client_properties(settings)["bootstrap.servers"] == "127.0.0.1:9092"
    assert load_settings({"bootstrap": " "}).bootstrap is None


def test_unset_bootstrap_finds_the_local_broker(tmp_path: Path) -> None:
    import os

    settings = Settings()
    with process_running(BROKER_MAIN_CLASS) as broker_pid:
        record = BrokerRecord(
            pid=broker_pid,
            port=39092,
            controller_port=39093,
            bootstrap="127.0.0.1:39092",
            kafka_version="4.1.1",
            log_file="x",
            started_ns=0,
        )
        record.write(settings.home / "broker")
        assert bootstrap_servers(settings) == "127.0.0.1:39092"
        assert bootstrap_servers(Settings(bootstrap="k:1")) == "k:1"
    assert bootstrap_servers(settings) == "127.0.0.1:9092"  # it ended
    dead = BrokerRecord(**{**record.__dict__, "pid": 2**22 + 12345})
    dead.write(settings.home / "broker")
    assert bootstrap_servers(settings) == "127.0.0.1:9092"
    # a record whose pid now belongs to another process (pids are reused) is no broker
    reused = BrokerRecord(**{**record.__dict__, "pid": os.getpid()})
    reused.write(settings.home / "broker")
    assert BrokerRecord.read(settings.home / "broker") is None
    assert bootstrap_servers(settings) == "127.0.0.1:9092"


def test_unset_bootstrap_without_a_broker_falls_back_to_the_broker_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RLPULSE_BROKER__PORT", "29092")
    assert bootstrap_servers(Settings()) == "127.0.0.1:29092"
    assert client_properties(Settings())["bootstrap.servers"] == "127.0.0.1:29092"
    monkeypatch.setenv("RLPULSE_BROKER__PORT", "0")  # free ports: only a running one has one
    assert bootstrap_servers(Settings()) == "127.0.0.1:9092"


def test_bad_values_are_refused_naming_their_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path / "c.yaml", "worker:\n  partitions: 0\n")
    with pytest.raises(SettingsError, match=rf"worker.partitions \(from file {config}\)"):
        load_settings(config_file=config)
    monkeypatch.setenv("RLPULSE_PRODUCER__COMPRESSION", "brotli")
    with pytest.raises(SettingsError, match=r"producer.compression \(from env"):
        load_settings()
    monkeypatch.delenv("RLPULSE_PRODUCER__COMPRESSION")
    with pytest.raises(SettingsError, match=r"worker.grace_s \(from flag\)"):
        load_settings({"worker.grace_s": 0})
    with pytest.raises(SettingsError, match="straggler_min"):
        load_settings({"worker.straggler_min": 20})
    with pytest.raises(SettingsError, match="Kafka topic characters"):
        load_settings({"prefix": "bad prefix"})
    with pytest.raises(SettingsError, match="Extra inputs"):
        load_settings(config_file=write_config(tmp_path / "typo.yaml", "workr: {}\n"))
    typo = write_config(tmp_path / "typo2.yaml", "worker:\n  grace_sx: 3\n")
    with pytest.raises(SettingsError, match=rf"worker.grace_sx \(from file {typo}\): Extra"):
        load_settings(config_file=typo)
    monkeypatch.setenv("RLPULSE_WORKER__GRACEX", "3")
    with pytest.raises(
        SettingsError, match="RLPULSE_WORKER__GRACEX names no setting; did you mean"
    ):
        load_settings()
    monkeypatch.delenv("RLPULSE_WORKER__GRACEX")
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(config_file=tmp_path / "missing.yaml")
    with pytest.raises(SettingsError, match="not valid YAML"):
        load_settings(config_file=write_config(tmp_path / "bad.yaml", "worker: [\n"))


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("RLPULSE_EXPORTER_PORT", "RLPULSE_EXPORTER__PORT"),  # one underscore
        ("RLPULSE_WORKR__GRACE_S", "RLPULSE_WORKER__GRACE_S"),  # no such section
        ("RLPULSE_BOOTSTRAPP", "RLPULSE_BOOTSTRAP"),
    ],
)
def test_a_misspelt_environment_name_is_refused_with_a_did_you_mean(
    monkeypatch: pytest.MonkeyPatch, name: str, meant: str
) -> None:
    monkeypatch.setenv(name, "10")
    expected = f"environment variable {name} names no setting; did you mean {meant}?"
    with pytest.raises(SettingsError, match=re.escape(expected)):
        Settings()
    with pytest.raises(SettingsError, match=re.escape(expected)):
        load_settings()
    shown = CliRunner().invoke(app, ["config", "show"], env={"COLUMNS": "200"})
    assert shown.exit_code == 1 and expected in " ".join(shown.stderr.split())
    assert "Traceback" not in shown.output


def test_environment_names_outside_the_tree_and_free_keys_still_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("RLPULSE_CONFIG", "RLPULSE_TRACE_CONTEXT", "RLPULSE_FUZZ_SEED", "RLPULSE_LOG_DIR"):
        monkeypatch.setenv(name, "")
    monkeypatch.setenv("RLPULSE_WORKER", '{"grace_s": 4}')  # a whole section, as JSON
    monkeypatch.setenv("RLPULSE_LIBRDKAFKA__SOCKET_TIMEOUT_MS", "5000")
    settings = Settings()
    assert settings.worker.grace_s == 4
    assert settings.librdkafka == {"socket_timeout_ms": "5000"}


# Names the tests below set on purpose to see them refused.
_MISSPELT_ON_PURPOSE = {
    "RLPULSE_WORKER__GRACEX", "RLPULSE_EXPORTER_PORT", "RLPULSE_WORKR__GRACE_S",
    "RLPULSE_BOOTSTRAPP",
}  # fmt: skip


def test_every_rlpulse_variable_the_repository_names_is_accepted() -> None:
    """A variable read outside the tree must be listed in OUTSIDE_ENV, or it would be refused."""
    root = Path(__file__).resolve().parents[2]
    found: dict[str, Path] = {}
    for folder in ("rlpulse", "tests", "benchmarks", "compose"):
        for path in (root / folder).rglob("*"):
            if path.is_file() and path.suffix in {".py", ".conf", ".yml", ".yaml", ".md", ""}:
                for name in re.findall(
                    r"\bRLPULSE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text("utf-8", "replace")
                ):
                    found.setdefault(name, path)
    known = environment_names()
    refused = {
        name: str(path.relative_to(root))
        for name, path in found.items()
        if name not in known
        and name not in _MISSPELT_ON_PURPOSE
        and not name.startswith("RLPULSE_LIBRDKAFKA__")
    }
    assert refused == {}


def test_settings_are_frozen_and_updated_by_copy(tmp_path: Path) -> None:
    settings = Settings()
    with pytest.raises(ValidationError):
        settings.prefix = "other"
    changed = settings.updated({"producer.spool_dir": tmp_path, "prefix": "p"})
    assert (changed.producer.spool_dir, changed.prefix) == (tmp_path, "p")
    assert changed.producer.linger_ms == settings.producer.linger_ms
    with pytest.raises(SettingsError):
        settings.updated({"producer.linger_ms": -1})


def test_config_show_prints_values_and_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_config(tmp_path / "c.yaml", "prefix: from-file\nworker: {partitions: 3}\n")
    monkeypatch.setenv("RLPULSE_WORKER__GRACE_S", "9")
    result = CliRunner().invoke(
        app,
        ["config", "show", "--json", "--config", str(config), "--set", "worker.batch_max=500"],
    )
    assert result.exit_code == 0, result.output
    shown = {row["name"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert shown["prefix"] == {"name": "prefix", "value": "from-file", "source": f"file {config}"}
    assert shown["worker.partitions"]["value"] == 3
    assert (shown["worker.grace_s"]["value"], shown["worker.grace_s"]["source"]) == (
        9.0,
        "env RLPULSE_WORKER__GRACE_S",
    )
    assert (shown["worker.batch_max"]["value"], shown["worker.batch_max"]["source"]) == (
        500,
        "flag",
    )
    assert shown["worker.late_window_s"]["source"] == "default"
    table = CliRunner().invoke(app, ["config", "show"], env={"COLUMNS": "200"})
    assert table.exit_code == 0 and "worker.grace_s" in table.stdout


def test_config_show_refuses_bad_settings_in_one_line() -> None:
    result = CliRunner().invoke(app, ["config", "show", "--set", "worker.partitions=zero"])
    assert result.exit_code == 1
    assert "worker.partitions (from flag)" in result.stderr
    assert "Traceback" not in result.output


def test_masked_lists_every_setting_once() -> None:
    flat = masked(Settings())
    assert "worker.grace_s" in flat and "producer.linger_ms" in flat and "bootstrap" in flat
    assert set(flat) == set(explain())


def test_s3_settings_take_the_secret_from_the_environment_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RLPULSE_ARCHIVE__ROOT", "s3://bucket/rlpulse")
    monkeypatch.setenv("RLPULSE_ARCHIVE__S3_ENDPOINT", "http://127.0.0.1:9000/")
    monkeypatch.setenv("RLPULSE_ARCHIVE__S3_ACCESS_KEY_ID", "minio")
    monkeypatch.setenv("RLPULSE_ARCHIVE__S3_SECRET_ACCESS_KEY", "from-the-environment")
    archive = load_settings().archive
    assert (archive.s3_endpoint, archive.s3_secret()) == (
        "http://127.0.0.1:9000",
        "from-the-environment",
    )
    assert masked(load_settings())["archive.s3_secret_access_key"] == "********"
    with pytest.raises(SettingsError, match="RLPULSE_ARCHIVE__S3_SECRET_ACCESS_KEY"):
        load_settings({"archive.s3_secret_access_key": "on-the-command-line"})
    config = write_config(tmp_path / "c.yaml", "archive: {s3_secret_access_key: in-a-file}\n")
    with pytest.raises(SettingsError, match="a secret is never written there"):
        load_settings(config_file=config)
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-its-file\n")
    monkeypatch.delenv("RLPULSE_ARCHIVE__S3_SECRET_ACCESS_KEY")
    with_file = load_settings({"archive.s3_secret_access_key_file": str(secret_file)}).archive
    assert with_file.s3_secret() == "from-its-file"


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        ({"archive.s3_access_key_id": "id"}, "s3_access_key_id needs its secret"),
        ({"archive.s3_secret_access_key_file": "/k"}, "without s3_access_key_id"),
        ({"archive.s3_endpoint": "127.0.0.1:9000"}, "must be a URL with a scheme"),
        ({"archive.s3_endpoint": "http://minio:9000/bucket"}, "and no path"),
    ],
)
def test_incomplete_s3_settings_are_refused(flags: dict[str, str], problem: str) -> None:
    with pytest.raises(SettingsError, match=problem):
        load_settings(flags)


def test_opensearch_url_is_the_setting_else_the_local_node_else_the_search_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rlpulse.local.opensearch import LAUNCHER_CLASS, SearchRecord, search_url

    assert search_url(Settings()) == "http://127.0.0.1:9200"
    monkeypatch.setenv("RLPULSE_SEARCH__PORT", "9201")
    assert search_url(Settings()) == "http://127.0.0.1:9201"
    with process_running(LAUNCHER_CLASS) as node_pid:
        record = SearchRecord(
            pid=node_pid, url="http://127.0.0.1:39200", http_port=39200, transport_port=39300,
            version="2.19.6", heap="512m", log_file="x", started_ns=0,
        )  # fmt: skip
        record.write(Settings().home / "search")
        assert search_url(Settings()) == "http://127.0.0.1:39200"
    monkeypatch.setenv("RLPULSE_OPENSEARCH_URL", " https://search.example:9200/ ")
    assert search_url(Settings()) == "https://search.example:9200"
    monkeypatch.setenv("RLPULSE_OPENSEARCH_URL", "")
    assert Settings().opensearch_url is None
