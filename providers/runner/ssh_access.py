"""A lease's SSH access on the runner's side: the buyer's public keys
(RunnerLease.ssh_authorized_keys) written to a per-lease `authorized_keys` file in the
runner's state dir (`<state dir>/authorized_keys/lease-<id>`), which the Docker runtime
bind-mounts READ-ONLY at MOUNT_POINTS; never baked into an image; removed when the
lease's container is. docs/RUNNER.md, "SSH access"."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .runtime_common import RuntimeFailure

# the image's root user's own path, and one that no image ships (our sshd image reads
# both: scripts/build-ssh-image.sh)
MOUNT_POINTS = ("/root/.ssh/authorized_keys", "/etc/gpumarket/authorized_keys")
_LINE = re.compile(r"^(ssh-ed25519|ecdsa-sha2-nistp(256|384|521)|ssh-rsa) [A-Za-z0-9+/=]+"
                   r"( [^\x00-\x1f\x7f]*)?$")


def keys_path(keys_dir: Path, lease_id: int) -> Path:
    return keys_dir / f"lease-{int(lease_id)}"


def write_keys(keys_dir: Path, lease_id: int, lines: list[str]) -> Path:
    """Write the lease's authorized_keys (one key a line; mode 0644, in a 0700 directory
    of the runner's) and return its path. A line that is not one plain public key (an
    options prefix, a second line hidden in it) is refused: RuntimeFailure, nothing
    written — the marketplace checked them, the runner does not trust that alone."""
    for i, line in enumerate(lines):
        if not isinstance(line, str) or not _LINE.match(line):
            raise RuntimeFailure(f"ssh_authorized_keys[{i}] is not one OpenSSH public key "
                                 "line; not starting the lease")
    keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = keys_path(keys_dir, lease_id)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as out:
        out.write("".join(f"{line}\n" for line in lines))
    os.chmod(tmp, 0o644)  # whatever the umask: sshd in the container reads it
    os.replace(tmp, path)
    return path


def remove_keys(keys_dir: Path | None, lease_id: int) -> None:
    if keys_dir is not None:
        keys_path(keys_dir, lease_id).unlink(missing_ok=True)


def volumes(path: Path) -> list[str]:
    """The Docker SDK's `volumes=`: `path` bound read-only at each of MOUNT_POINTS."""
    return [f"{path}:{point}:ro" for point in MOUNT_POINTS]
