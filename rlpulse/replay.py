"""``rlpulse replay DIR``: send the events a dead trainer process left in its spool.

Also runs on its own: ``python -m rlpulse.replay DIR [--bootstrap ...] [--prefix ...]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlpulse.config import resolve_bootstrap
from rlpulse.producers import ProducerConfig
from rlpulse.producers.config import default_spool_root
from rlpulse.producers.replay import replay_spool
from rlpulse.schemas.topics import DEFAULT_PREFIX

DEFAULT_TIMEOUT_S = 60.0


def replay_command(
    directory: Path,
    bootstrap: str | None = None,
    prefix: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> int:
    """Replay the spool files under ``directory``; print a summary; return the exit status.

    ``bootstrap``: ``--bootstrap``, else ``RLPULSE_BOOTSTRAP``, else the local broker.
    ``prefix``: send to ``<prefix>.events`` instead of the topic each event was spooled
    for. Exit status 0 when every event was delivered (or there was none), 1 otherwise.
    """
    config = ProducerConfig(
        bootstrap_servers=resolve_bootstrap(bootstrap), topic_prefix=prefix or DEFAULT_PREFIX
    )
    topic = None if prefix is None else config.topics.events
    report = replay_spool(directory, config, topic=topic, timeout_s=timeout_s)
    print(
        f"replayed {report.delivered} event(s) from {report.files} spool file(s) under "
        f"{directory} to {config.bootstrap_servers}"
    )
    if report.busy_producers:
        print(f"skipped {report.busy_producers} spool(s) held by a live process")
    if report.unreadable_lines:
        print(f"skipped {report.unreadable_lines} unreadable line(s)")
    if not report.complete:
        print(
            f"{report.undelivered} event(s) not delivered within {timeout_s:.0f} s; "
            "their files are kept: run the replay again",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line of ``python -m rlpulse.replay``."""
    parser = argparse.ArgumentParser(
        prog="rlpulse replay", description="Send spooled trainer events to Kafka again."
    )
    parser.add_argument(
        "directory",
        type=Path,
        nargs="?",
        default=default_spool_root(),
        help="a spool directory (searched recursively); default: every run's spool",
    )
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers")
    parser.add_argument("--prefix", help="send to <prefix>.events instead of the spooled topic")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per file")
    args = parser.parse_args(argv)
    return replay_command(args.directory, args.bootstrap, args.prefix, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
