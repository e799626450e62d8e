"""Where the write-ahead logs live: node-local disk, never by default a filesystem hosts share.

A GPU cluster's home directory is usually on NFS, Lustre or GPFS, so the default spool under
``<home>/spool`` would be one directory that every rank of a run on every node writes and
looks into: lock attempts over the network, and each host seeing every other host's logs.
:func:`resolve_spool_root` keeps the default on this node instead: when ``<home>`` is on a
shared filesystem and ``producer.spool_dir`` is unset, the logs go to
``/var/tmp/rlpulse-<user>/spool`` (kept across reboots, unlike a tmpfs ``/tmp``). A
``spool_dir`` set explicitly on a shared filesystem is used, with a warning: each host's logs
stay in a directory of their own (:func:`~rlpulse.producers.delivery.wal.run_wal_dir`), so no host
adopts another's, but every lock and listing crosses the network.

The filesystem is read from ``/proc/self/mountinfo`` (Linux); elsewhere nothing is shared.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from rlpulse.settings import Settings

__all__ = [
    "SHARED_FILESYSTEMS",
    "SpoolRoot",
    "filesystem_type",
    "node_local_base",
    "resolve_spool_root",
]

SHARED_FILESYSTEMS: Final = frozenset(
    {
        "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "ceph", "fuse.ceph",
        "cephfs", "beegfs", "glusterfs", "fuse.glusterfs", "fuse.sshfs", "9p", "afs",
        "panfs", "wekafs", "fuse.weka", "orangefs", "pvfs2", "fuse.juicefs", "virtiofs",
    }
)  # fmt: skip
"""Filesystem types that several hosts mount (``/proc/self/mountinfo``'s names)."""

_MOUNTINFO: Final = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class SpoolRoot:
    """The spool root chosen, the filesystem it is on, and what to tell the user (or None)."""

    path: Path
    filesystem: str | None
    note: str | None = None


def node_local_base() -> Path:
    """``/var/tmp/rlpulse-<user>``: where node-local files go when ``<home>`` is shared."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = str(os.getuid())
    return Path("/var/tmp") / f"rlpulse-{user}"


def node_local_default() -> Path:
    """The spool root used when ``<home>`` is on a shared filesystem."""
    return node_local_base() / "spool"


def resolve_spool_root(settings: Settings, mountinfo: str | None = None) -> SpoolRoot:
    """Where this process keeps its write-ahead logs (see the module docstring).

    ``mountinfo`` replaces the text of ``/proc/self/mountinfo`` (tests).
    """
    table = _mount_table(mountinfo)
    configured = settings.producer.spool_dir
    wanted = configured if configured is not None else settings.home / "spool"
    kind = _filesystem_in(wanted, table)
    if kind not in SHARED_FILESYSTEMS:
        return SpoolRoot(wanted, kind)
    if configured is not None:
        return SpoolRoot(
            wanted,
            kind,
            f"producer.spool_dir {wanted} is on {kind}, which several hosts share: each host's "
            "write-ahead logs stay apart, but every write, lock and look for a dead "
            "producer's log crosses the network; a node-local directory is faster",
        )
    local = node_local_default()
    return SpoolRoot(
        local,
        _filesystem_in(local, table),
        f"{settings.home} is on {kind}, which several hosts share: write-ahead logs go to "
        f"{local} on this node (set producer.spool_dir to choose another node-local place)",
    )


def filesystem_type(path: Path, mountinfo: str | None = None) -> str | None:
    """The type of the filesystem that holds ``path`` (or would hold it, if it does not exist).

    None where it cannot be told (no ``/proc``).
    """
    return _filesystem_in(path, _mount_table(mountinfo))


def _filesystem_in(path: Path, table: list[tuple[str, str]]) -> str | None:
    if not table:
        return None
    target = os.path.realpath(path)  # links resolved as far as the path exists
    best: tuple[int, str] | None = None
    for mount_point, kind in table:
        inside = mount_point in (target, "/") or target.startswith(mount_point + "/")
        if inside and (best is None or len(mount_point) >= best[0]):
            best = (len(mount_point), kind)
    return None if best is None else best[1]


def _mount_table(mountinfo: str | None) -> list[tuple[str, str]]:
    """(mount point, filesystem type) per line of mountinfo, in mount order."""
    if mountinfo is None:
        try:
            mountinfo = _MOUNTINFO.read_text()
        except OSError:
            return []
    table = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if after:
            table.append((_unescape(fields[4]), after[0]))
    return table


def _unescape(field: str) -> str:
    """A path as mountinfo writes it: space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field
