"""What each kind of rlpulse client may do on a secured cluster: its ACLs, under the prefix.

A role is a list of grants (:class:`Grant`), each an ACL without its principal: ``rlpulse broker
user add NAME --role ROLE`` creates them for ``User:NAME`` on the local broker, and
``rlpulse broker acl print --role ROLE`` prints the ``kafka-acls.sh`` commands that create
the same ones on a production cluster. With ``allow.everyone.if.no.acl.found=false``,
anything not granted is denied.

- ``trainer``: writes events, its text log records, its rollout samples and their texts, and
  acks; reads the control topic, and the acks topic at start (to rebuild which commands it
  applied, so it never applies one twice); reads its run's partition of what it writes back
  before it sends records again after a failed delivery or a kill (so that none arrives
  twice); its control client's consumer groups.
- ``worker``: reads events, acks (for the verdicts), rules and its grace-timer ticks;
  writes summaries, commands, verdicts, dead letters and ticks; owns faust's internal
  topics (changelogs, the assignor's leader topic, all named ``<group>-...``; it may raise
  their ``max.message.bytes`` to ``worker.state_max_bytes``) and its consumer group;
  creates rlpulse's topics at start-up, so it may see and create every topic under the
  prefix (it reads none it was not granted).
- ``operator``: writes commands and rules; reads acks, summaries and verdicts.
- ``reader`` (exporter, dashboards, ``rlpulse query``): reads every rlpulse topic but the
  rollout samples' texts (``<prefix>.sample-texts``: prompts and responses may be data that
  only some people may see) and writes nothing but the offsets of its own consumer groups
  (the exporter's, the archiver's, and any named ``<prefix>-reader-...``); it may look at the
  worker group's committed offsets (the exporter shows the worker's lag) but not join or
  commit to it.
- ``text_reader``: a reader that may read the samples' texts too (the run page, the indexer
  of the texts, whoever may see them).
- ``archiver``: a reader of every topic, the texts included, that also writes the audit
  reports of the runs it archived to ``<prefix>.audits`` (and nothing else).

The grants use the topic names of :class:`~rlpulse.schemas.topics.Topics`, so they follow
the prefix; consumer groups of the clients that never commit (control clients, the rules
follower) are named ``<prefix>-control-...`` and ``<prefix>-rules-...`` for that reason.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from rlpulse.schemas.topics import Topics

__all__ = [
    "ROLES",
    "Grant",
    "Role",
    "control_group_prefix",
    "kafka_acls_commands",
    "role_grants",
    "rules_group_prefix",
]

Role = Literal["trainer", "worker", "operator", "reader", "text_reader", "archiver"]
ROLES: tuple[str, ...] = get_args(Role)
Resource = Literal["topic", "group"]
Pattern = Literal["literal", "prefixed"]
Operation = Literal["READ", "WRITE", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"]


@dataclass(frozen=True)
class Grant:
    """One ACL without its principal: ``operations`` allowed on a topic or group."""

    resource: Resource
    name: str
    pattern: Pattern
    operations: tuple[Operation, ...]

    def describe(self) -> str:
        """``READ, WRITE on topic rlpulse.acks``; prefixed names end in ``*``."""
        star = "*" if self.pattern == "prefixed" else ""
        return f"{', '.join(self.operations)} on {self.resource} {self.name}{star}"


def control_group_prefix(prefix: str) -> str:
    """Start of the consumer group ids of trainers' control clients."""
    return f"{prefix}-control-"


def rules_group_prefix(prefix: str) -> str:
    """Start of the consumer group ids of workers' rules-topic followers."""
    return f"{prefix}-rules-"


def _topic(name: str, *operations: Operation, prefixed: bool = False) -> Grant:
    return Grant("topic", name, "prefixed" if prefixed else "literal", operations)


def _group(name: str, *operations: Operation, prefixed: bool = False) -> Grant:
    return Grant("group", name, "prefixed" if prefixed else "literal", operations)


def role_grants(
    role: Role, prefix: str, worker_group: str, extra_groups: Sequence[str] = ()
) -> list[Grant]:
    """The ACLs of ``role`` for the deployment with topic ``prefix`` (see the module docstring).

    ``worker_group`` is the worker's consumer group and faust app id; ``extra_groups`` are
    further consumer groups (literal names) the principal may use.
    """
    topics = Topics(prefix)
    grants: list[Grant]
    if role == "trainer":
        grants = [
            _topic(topics.events, "READ", "WRITE"),
            _topic(topics.logs, "READ", "WRITE"),
            _topic(topics.samples, "READ", "WRITE"),
            _topic(topics.sample_texts, "READ", "WRITE"),
            _topic(topics.acks, "READ", "WRITE"),
            _topic(topics.control, "READ"),
            _group(control_group_prefix(prefix), "READ", prefixed=True),
        ]
    elif role == "worker":
        grants = [
            _topic(f"{prefix}.", "DESCRIBE", "CREATE", prefixed=True),
            _topic(topics.events, "READ"),
            _topic(topics.acks, "READ"),
            _topic(topics.rules, "READ"),
            _topic(topics.ticks, "READ", "WRITE"),
            _topic(topics.steps, "WRITE"),
            _topic(topics.control, "WRITE"),
            _topic(topics.verdicts, "WRITE"),
            _topic(topics.dlq, "WRITE"),
            _topic(
                f"{worker_group}-",
                "READ",
                "WRITE",
                "CREATE",
                "DESCRIBE_CONFIGS",
                "ALTER_CONFIGS",
                prefixed=True,
            ),
            _group(worker_group, "READ"),
            _group(rules_group_prefix(prefix), "READ", prefixed=True),
        ]
    elif role == "operator":
        grants = [
            _topic(topics.control, "WRITE"),
            _topic(topics.rules, "WRITE"),
            _topic(topics.acks, "READ"),
            _topic(topics.steps, "READ"),
            _topic(topics.verdicts, "READ"),
            _group(f"{prefix}-operator-", "READ", prefixed=True),
        ]
    elif role in ("reader", "text_reader", "archiver"):
        readable = [name for name in topics.all() if name != topics.sample_texts]
        if role != "reader":
            readable.append(topics.sample_texts)
        grants = [
            *(_topic(name, "READ") for name in readable),
            _group(f"{prefix}-exporter", "READ"),
            _group(f"{prefix}-archive", "READ"),
            _group(f"{prefix}-reader-", "READ", prefixed=True),
            _group(worker_group, "DESCRIBE"),
        ]
        if role == "archiver":
            grants.append(_topic(topics.audits, "WRITE"))
    else:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    return grants + [_group(name, "READ") for name in extra_groups]


def kafka_acls_commands(principal: str, grants: Iterable[Grant]) -> list[str]:
    """The ``kafka-acls.sh`` command lines that create ``grants`` for ``principal``.

    They read the cluster's address and an admin client config from ``$KAFKA_BOOTSTRAP``
    and ``$KAFKA_ADMIN_CONFIG``.
    """
    lines = []
    for grant in grants:
        words = [
            "kafka-acls.sh",
            "--bootstrap-server",
            '"$KAFKA_BOOTSTRAP"',
            "--command-config",
            '"$KAFKA_ADMIN_CONFIG"',
            "--add",
            "--allow-principal",
            shlex.quote(principal),
        ]
        for operation in grant.operations:
            words += ["--operation", operation.capitalize()]
        words += [f"--{grant.resource}", shlex.quote(grant.name)]
        if grant.pattern == "prefixed":
            words += ["--resource-pattern-type", "prefixed"]
        lines.append(" ".join(words))
    return lines
