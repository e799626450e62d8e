"""``rlpulse replay [DIR]``: the old spelling of ``rlpulse spool send [DIR]``, kept for scripts."""

from __future__ import annotations

from rlpulse.cli.common import Bootstrap, ConfigFile, err
from rlpulse.cli.spool import LogsDir, Prefix, SendTimeout, spool_send


def replay(
    directory: LogsDir = None,
    bootstrap: Bootstrap = None,
    prefix: Prefix = None,
    timeout: SendTimeout = 60.0,
    config: ConfigFile = None,
) -> None:
    """Deprecated: use `rlpulse spool send [DIR]`, which this runs.

    Without DIR it sends this host's logs under the spool root, as `rlpulse spool send` does.
    """
    err.print("rlpulse replay is deprecated: use `rlpulse spool send [DIR]`", highlight=False)
    spool_send(directory, bootstrap=bootstrap, prefix=prefix, timeout=timeout, config=config)
