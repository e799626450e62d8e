"""``rlpulse broker up|down|status|fetch|user add|acl print``: the local Apache Kafka broker.

``fetch`` downloads the pinned Kafka jars ahead of time: into the cache, or ``--to DIR`` for
compute nodes without internet (``jars.offline_dir``).

``up --nodes 3`` starts a local three-node KRaft cluster instead
(:mod:`rlpulse.local.cluster`). ``up --secure`` runs it with SASL_SSL, SCRAM and ACLs;
``user add`` creates a user with the ACLs of a role there; ``acl print`` prints the
``kafka-acls.sh`` commands that give a role the same ACLs on any cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, cast

import typer

from rlpulse.cli.common import (
    LOCAL_CONTROL_SKIPS,
    ConfigFile,
    Prefix,
    default_note,
    fail,
    one_line_errors,
    out,
    say,
    setting_option,
    settings,
    state_dir_option,
)
from rlpulse.local.broker import KafkaJars, LocalBroker
from rlpulse.local.cluster import LocalCluster, is_cluster
from rlpulse.settings import Settings
from rlpulse.transport.roles import ROLES, Role, kafka_acls_commands, role_grants
from rlpulse.transport.users import principal

broker_app = typer.Typer(
    help="A local Apache Kafka broker (KRaft), on 127.0.0.1 unless broker.host says otherwise.",
    no_args_is_help=True,
)
user_app = typer.Typer(help="Users of the secured local broker.", no_args_is_help=True)
acl_app = typer.Typer(help="The ACLs of rlpulse's roles.", no_args_is_help=True)
broker_app.add_typer(user_app, name="user")
broker_app.add_typer(acl_app, name="acl")

StateDir = Annotated[Path | None, state_dir_option("the broker", "broker")]


def _kafka_dir(chosen: Settings, state_dir: Path | None) -> Path:
    """The directory of the local broker or cluster: ``--state-dir``, else ``home/broker``."""
    return state_dir or chosen.home / "broker"


def _local_kafka(config: Path | None, state_dir: Path | None) -> LocalBroker | LocalCluster:
    """The local cluster if its directory holds one, else the local broker."""
    chosen = settings(config, without=LOCAL_CONTROL_SKIPS)
    where = _kafka_dir(chosen, state_dir)
    if is_cluster(where):
        return LocalCluster(chosen, state_dir=where)
    return LocalBroker(chosen, state_dir=where)


@broker_app.command("up")
@one_line_errors
def broker_up(
    port: Annotated[
        int | None,
        setting_option("broker.port"),
    ] = None,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="SASL_SSL with SCRAM-SHA-512, TLS certificates made on first use, and ACLs "
            "(nothing is allowed without one). Add users with `rlpulse broker user add`.",
        ),
    ] = False,
    nodes: Annotated[
        int,
        typer.Option(
            min=1,
            help="Nodes of a local KRaft cluster (3: replication 3, min.insync.replicas 2); "
            "node i on port + 2(i-1).",
        ),
    ] = 1,
    state_dir: StateDir = None,
    config: ConfigFile = None,
) -> None:
    """Start the local broker, or a local cluster (or report the running one)."""
    chosen = settings(config, {"broker.port": port}, without=LOCAL_CONTROL_SKIPS)
    progress = lambda message: say(f"{message}…")  # noqa: E731
    where = _kafka_dir(chosen, state_dir)
    if nodes > 1 or is_cluster(where):
        if secure:
            raise fail(
                "--secure runs one broker; leave out --nodes"
                if nodes > 1
                else f"--secure runs one broker, and {where} holds a local cluster; "
                "use another --state-dir"
            )
        record = LocalCluster(chosen, nodes, state_dir=state_dir).up(progress)
        out.print(f"Kafka {record.kafka_version} cluster is up at [bold]{record.bootstrap}[/]")
        return
    broker = LocalBroker(chosen, state_dir=state_dir, secure=secure)
    info = broker.up(progress=progress)
    out.print(f"Kafka {info.kafka_version} is up at [bold]{info.bootstrap}[/] (pid {info.pid})")
    if info.secure:
        out.print(
            f"secured: SASL_SSL, SCRAM-SHA-512, ACLs; CA {info.ca_file}\n"
            "add users with: rlpulse broker user add NAME --role " + "|".join(ROLES),
            highlight=False,
            soft_wrap=True,
        )


@broker_app.command("down")
@one_line_errors
def broker_down(state_dir: StateDir = None, config: ConfigFile = None) -> None:
    """Stop the local broker (or every node of the local cluster): SIGTERM, then SIGKILL."""
    stopped = _local_kafka(config, state_dir).down()
    out.print("Kafka stopped" if stopped else "Kafka was not running")


@broker_app.command("status")
@one_line_errors
def broker_status(state_dir: StateDir = None, config: ConfigFile = None) -> None:
    """Say whether the local broker is up and where; exit 1 if it is down."""
    kafka = _local_kafka(config, state_dir)
    out.print(kafka.status(), highlight=False)
    running = kafka.running() if isinstance(kafka, LocalCluster) else kafka.info() is not None
    if not running:
        raise typer.Exit(1)


@broker_app.command("fetch")
@one_line_errors
def broker_fetch(
    to: Annotated[
        Path | None,
        typer.Option(
            "--to",
            help="Put the jars in this directory instead of the cache: copy it to a machine "
            "without internet and set jars.offline_dir there.",
            file_okay=False,
        ),
    ] = None,
    mirror: Annotated[str | None, setting_option("jars.mirror")] = None,
    config: ConfigFile = None,
) -> None:
    """Fetch the broker's pinned Kafka jars now, each checked against its SHA-256."""
    chosen = settings(config, {"jars.mirror": mirror}, without=LOCAL_CONTROL_SKIPS)
    jars = KafkaJars(chosen.home, chosen.jars)
    progress = lambda message: say(f"{message}…")  # noqa: E731
    where = jars.resolve(progress) if to is None else jars.fetch_to(to, progress)
    count = len(jars.pin_list.pins)
    out.print(
        f"{count} Apache Kafka {jars.kafka_version} jars, verified, in {where}",
        highlight=False,
        soft_wrap=True,
    )
    if to is not None:
        out.print(
            f"on a machine without internet: RLPULSE_JARS__OFFLINE_DIR={to.resolve()}",
            highlight=False,
            soft_wrap=True,
        )


RoleOption = Annotated[
    str, typer.Option("--role", help=f"One of: {', '.join(ROLES)}.", show_default=False)
]
Groups = Annotated[
    list[str] | None,
    typer.Option("--group", help="A further consumer group the user may use (repeatable)."),
]


def _role(name: str) -> Role:
    if name not in ROLES:
        raise fail(f"unknown role {name!r}; roles: {', '.join(ROLES)}")
    return cast(Role, name)


@user_app.command("add")
@one_line_errors
def user_add(
    name: Annotated[str, typer.Argument(help="The user name (letters, digits, . _ -).")],
    role: RoleOption,
    password_file: Annotated[
        Path | None,
        typer.Option(
            help="Take the password from this file. "
            + default_note("keep the user's, or make one"),
            dir_okay=False,
            exists=True,
        ),
    ] = None,
    group: Groups = None,
    prefix: Prefix = None,
    state_dir: StateDir = None,
    config: ConfigFile = None,
) -> None:
    """Create a SCRAM user on the secured local broker with exactly the ACLs of a role."""
    chosen = settings(config, {"prefix": prefix}, without=LOCAL_CONTROL_SKIPS)
    password = None if password_file is None else password_file.read_text().strip()
    if password_file is not None and not password:
        raise fail(f"{password_file} is empty")
    broker = LocalBroker(chosen, state_dir=state_dir, secure=True)
    user = broker.add_user(
        name,
        _role(role),
        prefix=chosen.prefix,
        worker_group=chosen.worker_group,
        extra_groups=tuple(group or ()),
        password=password,
    )
    out.print(
        f"user {user.name} ({user.role}, prefix {chosen.prefix}): {user.acls} ACLs; "
        f"password in {user.password_file}",
        highlight=False,
        soft_wrap=True,
    )
    info = broker.info()
    ca = "" if info is None else f" RLPULSE_SECURITY__CA_FILE={info.ca_file}"
    out.print(
        "connect with: RLPULSE_SECURITY__PROTOCOL=SASL_SSL "
        f"RLPULSE_SECURITY__USERNAME={user.name} "
        f"RLPULSE_SECURITY__PASSWORD_FILE={user.password_file}{ca}",
        highlight=False,
        soft_wrap=True,
    )


@acl_app.command("print")
@one_line_errors
def acl_print(
    role: RoleOption,
    user: Annotated[str, typer.Option(help="The user the ACLs are for.")] = "NAME",
    group: Groups = None,
    prefix: Prefix = None,
    config: ConfigFile = None,
) -> None:
    """Print the kafka-acls.sh commands that give a user a role's ACLs on a cluster.

    Set KAFKA_BOOTSTRAP to the cluster and KAFKA_ADMIN_CONFIG to an admin client config.
    """
    chosen = settings(config, {"prefix": prefix})
    grants = role_grants(_role(role), chosen.prefix, chosen.worker_group, tuple(group or ()))
    typer.echo(f"# role {role}, prefix {chosen.prefix}, user {user}")
    for grant in grants:
        typer.echo(f"#   {grant.describe()}")
    typer.echo(
        "# create the user first (SCRAM): kafka-configs.sh --bootstrap-server "
        '"$KAFKA_BOOTSTRAP" --command-config "$KAFKA_ADMIN_CONFIG" --alter --entity-type '
        f"users --entity-name {user} --add-config 'SCRAM-SHA-512=[password=...]'"
    )
    for line in kafka_acls_commands(principal(user), grants):
        typer.echo(line)
