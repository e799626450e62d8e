"""Where the local broker listens, what it tells clients, and when it refuses to start."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlpulse.local.broker import LocalBroker
from rlpulse.local.exceptions import BrokerError
from rlpulse.settings import BrokerSettings, Settings
from rlpulse.transport.bootstrap import bootstrap_servers


def broker(tmp_path: Path, **section: object) -> LocalBroker:
    settings = Settings(home=tmp_path / "home", broker=BrokerSettings(**section))  # type: ignore[arg-type]
    return LocalBroker(settings, state_dir=tmp_path / "state", port=0)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "login1.cluster", "::"])
def test_beyond_loopback_a_plaintext_broker_is_refused_before_anything_starts(
    tmp_path: Path, host: str
) -> None:
    with pytest.raises(BrokerError, match=rf"^broker\.host {host} is beyond loopback: .* --secure"):
        broker(tmp_path, host=host).launch()
    assert not (tmp_path / "state").exists()  # no config, no storage, no process


def test_another_loopback_address_needs_no_tls_and_is_what_clients_are_told(
    tmp_path: Path,
) -> None:
    local = broker(tmp_path, host="127.0.0.2")
    local._check_reach()  # loopback: only this machine's users reach it, as on 127.0.0.1
    assert local.advertised_host == "127.0.0.2"
    every = broker(tmp_path, host="0.0.0.0", advertised_host="login1.cluster")
    assert every.advertised_host == "login1.cluster"
    shared = Settings(broker=BrokerSettings(advertised_host="login1.cluster", port=9092))
    assert bootstrap_servers(shared) == "login1.cluster:9092"  # compute nodes sharing a config


def test_data_goes_where_broker_data_dir_says(tmp_path: Path) -> None:
    assert broker(tmp_path).data_dir == tmp_path / "state" / "data"  # /tmp: not shared
    assert broker(tmp_path, data_dir=tmp_path / "local").data_dir == tmp_path / "local"
