"""A lease's workspace (issue 15): a host directory per lease with a checkpoint store,
`<state dir>/workspaces/lease-<id>`, bind-mounted read-write at /workspace in its
container. checkpoint.py uploads from it and restores into it; it outlives the container
until the last upload is done, then it is removed.

The bound (the bid's `max_bytes`) is enforced by a size check: `usage()` sums the
regular files under the workspace (symlinks are never followed), and the agent fails a
running lease whose workspace is over its bound (checkpoint.CheckpointSync.over_bound,
at most every CHECK_INTERVAL_S); an upload of more than the bound is refused. A tmpfs
or loop device would bound it in the kernel but needs mount privileges the runner may
lack: docs/CHECKPOINTS.md.
"""

from __future__ import annotations

import os
import posixpath
import shutil
from pathlib import Path

MOUNT_POINT = "/workspace"
CHECK_INTERVAL_S = 5.0


class Workspaces:
    """The workspaces under `root` (created 0700 on first use; each lease's 0777 inside,
    so a container's user, whatever its uid, can write to it)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, lease_id: int) -> Path:
        return self.root / f"lease-{int(lease_id)}"

    def create(self, lease_id: int) -> Path:
        """The lease's workspace, made if missing (an existing one is kept: a runner
        restart re-adopts its container with it)."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.path(lease_id)
        path.mkdir(exist_ok=True)
        os.chmod(path, 0o777)  # noqa: S103 - inside the runner's 0700 state dir
        return path

    def exists(self, lease_id: int) -> bool:
        return self.path(lease_id).is_dir()

    def remove(self, lease_id: int) -> None:
        shutil.rmtree(self.path(lease_id), ignore_errors=True)

    def volumes(self, lease_id: int) -> list[str]:
        """The Docker SDK's `volumes=` entry: the workspace read-write at /workspace."""
        return [f"{self.path(lease_id)}:{MOUNT_POINT}:rw"]

    def host_path(self, lease_id: int, container_path: str) -> Path:
        """Where `container_path` (under /workspace, as the marketplace checked it) is on
        this host. ValueError for a path outside /workspace, or one that a symlink the
        workload made leads out of its workspace."""
        normal = posixpath.normpath(container_path)
        if normal == MOUNT_POINT:
            return self.path(lease_id)
        if not normal.startswith(MOUNT_POINT + "/") or "/../" in f"{normal}/":
            raise ValueError(f"{container_path} is not under {MOUNT_POINT}")
        path = self.path(lease_id) / normal[len(MOUNT_POINT) + 1:]
        top = os.path.realpath(self.path(lease_id))
        parent = os.path.realpath(path.parent)
        if parent != top and not parent.startswith(top + os.sep):
            raise ValueError(f"{container_path} leads out of the workspace (a symlink)")
        return path

    def usage(self, lease_id: int) -> int:
        """Bytes of the regular files in the lease's workspace (0 when it has none)."""
        return tree_bytes(self.path(lease_id))


def regular_files(top: Path) -> list[tuple[str, Path]]:
    """[(relative posix path, path)] of the regular files under `top` (itself, when it is
    a regular file), sorted; symlinks and special files are skipped, never followed."""
    try:
        if top.is_symlink() or not top.exists():
            return []
    except OSError:
        return []
    if top.is_file():
        return [(top.name, top)]
    found = []
    for folder, dirs, files in os.walk(top, followlinks=False):
        base = Path(folder)
        dirs[:] = [d for d in dirs if not (base / d).is_symlink()]
        for name in files:
            path = base / name
            if path.is_symlink() or not path.is_file():
                continue
            found.append((path.relative_to(top).as_posix(), path))
    return sorted(found)


def tree_bytes(top: Path) -> int:
    total = 0
    for _, path in regular_files(top):
        try:
            total += path.lstat().st_size
        except OSError:
            continue
    return total
