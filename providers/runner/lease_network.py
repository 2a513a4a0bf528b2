"""One Docker bridge network per lease (the runner's default `--network per-lease`): the
lease's container alone on it, inter-container communication off, created before the
container and removed after it. Ports are still published on --public-host (docker-proxy).

Whether one lease can reach another across their bridges is the host's routing, not the
network's: dockerd's own iptables rules (DOCKER-ISOLATION-STAGE-*) drop bridge-to-bridge
traffic; with `--iptables=false` and `net.ipv4.ip_forward=1` the host routes between them.
isolation_check() says which holds (doctor); docs/RUNNER.md, "Lease isolation", is the rule.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

PER_LEASE = "per-lease"
BRIDGE_PREFIX = "gm"  # every lease bridge's interface is gm<12 hex>: `iptables -i gm+`
#: the FORWARD rule a provider adds when dockerd runs with --iptables=false (RUNNER.md)
DROP_RULE = ["FORWARD", "-i", f"{BRIDGE_PREFIX}+", "-o", f"{BRIDGE_PREFIX}+", "-j", "DROP"]


def bridge_name(network_name: str) -> str:
    """The Linux interface of a lease network: "gm" + 12 hex of its name (15 chars max)."""
    return BRIDGE_PREFIX + hashlib.sha256(network_name.encode()).hexdigest()[:12]


def create(client, name: str, labels: dict[str, str]):
    """The lease's network `name` (created, or the one a previous start left)."""
    import docker

    try:
        return client.networks.create(
            name, driver="bridge", labels=labels, check_duplicate=True,
            options={"com.docker.network.bridge.enable_icc": "false",
                     "com.docker.network.bridge.name": bridge_name(name)})
    except docker.errors.APIError as exc:
        if exc.status_code != 409:
            raise
        return client.networks.get(name)


def remove(client, name: str) -> None:
    """Remove the lease's network if it exists (after its container is gone)."""
    import docker

    with contextlib.suppress(docker.errors.NotFound):
        client.networks.get(name).remove()


def _dockerd_iptables(proc: Path = Path("/proc"),
                      daemon_json: Path = Path("/etc/docker/daemon.json")) -> bool | None:
    """Whether the local dockerd manages iptables: False when its command line says
    `--iptables=false` (or daemon.json "iptables": false), True when a dockerd runs
    without that, None when no local dockerd is seen (a remote engine)."""
    seen = False
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if not args or os.path.basename(args[0]) != b"dockerd":
            continue
        seen = True
        for i, arg in enumerate(args):
            if arg in (b"--iptables=false", b"--iptables=0") or (
                    arg == b"--iptables" and i + 1 < len(args)
                    and args[i + 1] in (b"false", b"0")):
                return False
    if not seen:
        return None
    try:
        if json.loads(daemon_json.read_text()).get("iptables") is False:
            return False
    except (OSError, ValueError, AttributeError):
        pass
    return True


def _ip_forward(path: Path = Path("/proc/sys/net/ipv4/ip_forward")) -> bool | None:
    try:
        return path.read_text().strip() == "1"
    except OSError:
        return None


def _drop_rule_present() -> bool:
    import subprocess

    try:
        return subprocess.run(["iptables", "-C", *DROP_RULE], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def isolation_check(*, iptables: bool | None = None, forward: bool | None = None,
                    drop_rule: bool | None = None) -> tuple[bool | None, str, str]:
    """(ok, detail, fix) for doctor: can one lease bridge reach another on this host?
    Arguments override what is read from the host (dockerd's command line,
    /proc/sys/net/ipv4/ip_forward, `iptables -C` of DROP_RULE)."""
    iptables = _dockerd_iptables() if iptables is None else iptables
    if iptables is None:
        return None, "no local dockerd seen: cannot tell how its bridges are isolated", ""
    if iptables:
        return True, ("dockerd manages iptables: its isolation rules drop traffic between "
                      "lease bridges"), ""
    forward = _ip_forward() if forward is None else forward
    if forward is False:
        return True, ("dockerd runs with --iptables=false and net.ipv4.ip_forward=0: the "
                      "host routes nothing between lease bridges (nor out of them)"), ""
    drop_rule = _drop_rule_present() if drop_rule is None else drop_rule
    if drop_rule:
        return True, ("dockerd runs with --iptables=false; the rule `iptables "
                      f"-I {' '.join(DROP_RULE)}` drops traffic "
                      "between lease bridges"), ""
    return False, ("dockerd runs with --iptables=false and net.ipv4.ip_forward=1: the host "
                   "routes between lease bridges, so one lease reaches another's ports"), (
        "run dockerd with its iptables rules (drop `--iptables=false` / \"iptables\": "
        f"false), or add `iptables -I {' '.join(DROP_RULE)}` (docs/RUNNER.md, "
        "\"Lease isolation\")")
