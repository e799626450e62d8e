"""SCRAM users and their ACLs on a secured cluster, through Kafka's admin API.

What ``rlpulse broker user add`` does with the local broker's admin credentials: set a
user's SCRAM-SHA-512 password, then replace every ACL of ``User:<name>`` with the grants of
its role (:mod:`rlpulse.transport.roles`). Kafka applies new credentials and ACLs within
moments; nothing needs a restart.
"""

from __future__ import annotations

import re
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

# confluent_kafka.admin re-exports these without declaring it; the type checker wants their home.
from confluent_kafka.admin._acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
)
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType
from confluent_kafka.admin._scram import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from rlpulse.transport.exceptions import TransportError
from rlpulse.transport.roles import Grant

__all__ = ["SCRAM_ITERATIONS", "USER_NAME", "principal", "replace_acls", "set_scram_password"]

SCRAM_ITERATIONS = 8192
USER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""User names rlpulse creates: no characters SCRAM or ACL principals would need escaped."""

_RESOURCES = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP}
_PATTERNS = {"literal": ResourcePatternType.LITERAL, "prefixed": ResourcePatternType.PREFIXED}


def principal(user: str) -> str:
    """The Kafka principal of a SCRAM user: ``User:<name>``."""
    return f"User:{user}"


def set_scram_password(admin: AdminClient, user: str, password: str, timeout_s: float) -> None:
    """Create ``user`` or change its SCRAM-SHA-512 password."""
    upsert = UserScramCredentialUpsertion(
        user,
        ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
        password.encode(),
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        _wait(future, timeout_s, f"could not set the password of user {user!r}")


def bindings(user: str, grants: list[Grant]) -> list[AclBinding]:
    """The confluent-kafka ACL bindings of ``grants`` for ``user``, from any host."""
    return [
        AclBinding(
            _RESOURCES[grant.resource],
            grant.name,
            _PATTERNS[grant.pattern],
            principal(user),
            "*",
            AclOperation[operation],
            AclPermissionType.ALLOW,
        )
        for grant in grants
        for operation in grant.operations
    ]


def replace_acls(admin: AdminClient, user: str, grants: list[Grant], timeout_s: float) -> int:
    """Make ``grants`` the only ACLs of ``user``; return how many bindings it now has."""
    every_acl = AclBindingFilter(  # a None name or host matches any (the hints say str)
        ResourceType.ANY,
        None,  # type: ignore[arg-type]
        ResourcePatternType.ANY,
        principal(user),
        None,  # type: ignore[arg-type]
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    for future in admin.delete_acls([every_acl], request_timeout=timeout_s).values():
        _wait(future, timeout_s, f"could not remove the old ACLs of user {user!r}")
    wanted = bindings(user, grants)
    for future in admin.create_acls(wanted, request_timeout=timeout_s).values():
        _wait(future, timeout_s, f"could not create the ACLs of user {user!r}")
    return len(wanted)


def _wait(future: Future[Any], timeout_s: float, failure: str) -> None:
    try:
        future.result(timeout=timeout_s)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        raise TransportError(f"{failure}: {getattr(error, 'str', error.__str__)()}") from exc
    except TimeoutError:
        raise TransportError(f"{failure}: no answer within {timeout_s:.0f} s") from None
