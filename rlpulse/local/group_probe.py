"""Whether a consumer group is stable with members: asked in this process or in a child.

librdkafka 2.x can abort the whole process in ``DescribeConsumerGroups`` on a multi-broker
cluster (``rd_kafka_enq_once_del_source_return: Assertion `eonce->refcnt > 0'``, librdkafka
issue 4605, open): seen here on a fresh three-node cluster while its group coordinator moves.
So on a cluster of several brokers the question is asked by a child process
(``python -m rlpulse.local.group_probe BOOTSTRAP GROUP [CLIENT_ID]``, exit 0 when stable, 1
when not), and an abort costs one answer, not the caller.
"""

from __future__ import annotations

import subprocess
import sys

from confluent_kafka.admin import AdminClient

from rlpulse.settings import load_settings
from rlpulse.transport.clients import new_admin

__all__ = ["group_stable", "group_stable_in_child"]

_CHILD_TIMEOUT_S = 60.0


def group_stable(admin: AdminClient, group: str, client_id: str | None = None) -> bool:
    """Whether ``group`` is stable and has members (False while it does not exist).

    With ``client_id``, one of the members must be that client: a group is still stable with
    a dead member in it until the member's session times out.
    """
    futures = admin.describe_consumer_groups([group], request_timeout=10)
    try:
        found = futures[group].result()
    except Exception:  # the group does not exist until its first member joins
        return False
    members = found.members
    if client_id is not None:
        members = [member for member in members if member.client_id == client_id]
    return str(found.state).endswith("STABLE") and bool(members)


def group_stable_in_child(bootstrap: str, group: str, client_id: str | None = None) -> bool:
    """:func:`group_stable`, asked by a child process (unsecured clusters); False if it died."""
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-P",  # not the working directory: a ./rlpulse there is not the package
                "-m",
                "rlpulse.local.group_probe",
                bootstrap,
                group,
                *(() if client_id is None else (client_id,)),
            ],
            capture_output=True,
            timeout=_CHILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


def main(argv: list[str]) -> int:
    """Exit status 0 when the group ``argv[1]`` at ``argv[0]`` is stable with members, else 1.

    ``argv[2]``, when given, is a client id that must be among the members.
    """
    bootstrap, group, *client_id = argv
    admin = new_admin(load_settings({"bootstrap": bootstrap}), "group probe")
    return 0 if group_stable(admin, group, client_id[0] if client_id else None) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
