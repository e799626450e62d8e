"""Where the write-ahead logs go: never by default onto a filesystem that hosts share."""

from __future__ import annotations

from pathlib import Path

from rlpulse.producers.delivery.spool_root import (
    filesystem_type,
    node_local_default,
    resolve_spool_root,
)
from rlpulse.producers.delivery.wal import run_wal_dir
from rlpulse.settings import Settings


def mountinfo(*mounts: tuple[str, str]) -> str:
    """Lines of /proc/self/mountinfo for (mount point, type) pairs."""
    return "\n".join(
        f"{n} 1 0:{n} / {point} rw,relatime shared:{n} - {kind} src rw"
        for n, (point, kind) in enumerate(mounts, start=20)
    )


MACHINE = mountinfo(("/", "ext4"), ("/home", "nfs4"), ("/scratch", "lustre"), ("/tmp", "tmpfs"))


def test_a_home_on_nfs_sends_the_default_spool_to_this_node(tmp_path: Path) -> None:
    home = Path("/home/alice/.cache/rlpulse")
    chosen = resolve_spool_root(Settings(home=home), MACHINE)
    assert chosen.path == node_local_default()
    assert chosen.path.is_relative_to("/var/tmp")
    assert chosen.filesystem == "ext4"
    assert chosen.note is not None
    assert "/home/alice/.cache/rlpulse is on nfs4, which several hosts share" in chosen.note
    assert str(node_local_default()) in chosen.note


def test_a_spool_dir_set_on_a_shared_filesystem_is_kept_with_a_warning() -> None:
    settings = Settings().updated({"producer.spool_dir": Path("/scratch/alice/spool")})
    chosen = resolve_spool_root(settings, MACHINE)
    assert chosen.path == Path("/scratch/alice/spool")
    assert chosen.filesystem == "lustre"
    assert chosen.note is not None and "is on lustre, which several hosts share" in chosen.note


def test_a_local_spool_is_used_as_configured_and_says_nothing() -> None:
    home = Path("/opt/rl/.cache/rlpulse")
    chosen = resolve_spool_root(Settings(home=home), MACHINE)
    assert (chosen.path, chosen.filesystem, chosen.note) == (home / "spool", "ext4", None)
    tmp = Settings().updated({"producer.spool_dir": Path("/tmp/spool")})
    assert resolve_spool_root(tmp, MACHINE).filesystem == "tmpfs"


def test_the_longest_mount_point_holds_a_path_and_escapes_are_read() -> None:
    table = mountinfo(("/", "ext4"), ("/data", "xfs"), ("/data/my\\040share", "cifs"))
    assert filesystem_type(Path("/data/my share/x/y"), table) == "cifs"
    assert filesystem_type(Path("/data/mine"), table) == "xfs"
    assert filesystem_type(Path("/database"), table) == "ext4"
    assert filesystem_type(Path("/anything"), "") is None  # no mount table: nothing is shared


def test_each_host_of_a_run_has_a_directory_of_its_own() -> None:
    root = Path("/spool")
    assert run_wal_dir(root, "grpo/7b run", "node-3") == Path("/spool/grpo_7b_run/node-3")
    assert run_wal_dir(root, "r", "..") == Path("/spool/r/_")
