"""A lease's container ports: the ports a bid asks to expose (`clean_ports`), the
endpoints a runner reports for them (`clean_endpoints`) and how a buyer reads one
(`endpoint_text`). No database access.
"""

from __future__ import annotations

import re

from marketplace.errors import InvalidInput
from marketplace.models import Lease

MAX_PORTS = 8
_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9.:-]*[A-Za-z0-9])?$")


def clean_ports(ports: list[int] | None, *, field: str = "ports") -> list[int]:
    """A bid's container ports to expose: at most MAX_PORTS distinct TCP ports, each
    1–65535 (booleans refused); returned sorted. None or [] → []. Raises InvalidInput
    naming `field`."""
    if not ports:
        return []
    if not isinstance(ports, list) or len(ports) > MAX_PORTS:
        raise InvalidInput(f"must be a list of at most {MAX_PORTS} ports", field=field)
    for port in ports:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise InvalidInput(f"{port!r} is not a TCP port (1 to 65535)", field=field)
    if len(set(ports)) != len(ports):
        raise InvalidInput("lists a port twice", field=field)
    return sorted(ports)


PORT_ROLES = ("ssh", "jupyter", "http")


def clean_port_roles(roles: dict | None, ports: list[int], *,
                     field: str = "port_roles") -> dict[str, str]:
    """A bid's port roles ({"8888": "jupyter"}): each key a port of `ports` as a string,
    each role one of PORT_ROLES. None or {} → {}. Raises InvalidInput naming `field`."""
    if not roles:
        return {}
    if not isinstance(roles, dict):
        raise InvalidInput("must be an object of port: role", field=field)
    for port, role in roles.items():
        if not isinstance(port, str) or not port.isdigit() or int(port) not in ports:
            raise InvalidInput(f"{port!r} is not one of the exposed ports", field=field)
        if role not in PORT_ROLES:
            raise InvalidInput(f"must be one of {', '.join(PORT_ROLES)}", field=f"{field}.{port}")
    return dict(roles)


def clean_endpoints(lease: Lease, endpoints: list[dict] | None) -> list[dict]:
    """The endpoints a runner reports for `lease` ([{container_port, host, host_port}]),
    checked: each container_port one the lease asked for, at most once; host a host name
    or an IP address (no scheme, no path, not 0.0.0.0 or ::, which nobody can reach);
    host_port 1–65535. Returned in container-port order. Raises InvalidInput naming
    `endpoints[i].<field>`."""
    out, seen = [], set()
    for i, e in enumerate(endpoints or []):
        port, host, host_port = e.get("container_port"), e.get("host"), e.get("host_port")
        if port not in (lease.ports or []):
            raise InvalidInput(f"port {port} is not one this lease exposes "
                               f"({', '.join(map(str, lease.ports)) or 'none'})",
                               field=f"endpoints[{i}].container_port")
        if port in seen:
            raise InvalidInput("is reported twice", field=f"endpoints[{i}].container_port")
        seen.add(port)
        if not isinstance(host, str) or not _HOST.match(host) or host in ("0.0.0.0", "::"):
            raise InvalidInput("must be the host name or IP address buyers connect to",
                               field=f"endpoints[{i}].host")
        if isinstance(host_port, bool) or not isinstance(host_port, int) \
                or not 1 <= host_port <= 65535:
            raise InvalidInput("must be a TCP port (1 to 65535)",
                               field=f"endpoints[{i}].host_port")
        out.append({"container_port": port, "host": host, "host_port": host_port})
    return sorted(out, key=lambda e: e["container_port"])


def endpoint_text(endpoint: dict) -> str:
    """"host:port" ("[v6]:port" for an IPv6 address), as the buyer connects to it."""
    host = endpoint["host"]
    return f"[{host}]:{endpoint['host_port']}" if ":" in host else \
        f"{host}:{endpoint['host_port']}"


SSH_PORT = 22


def with_ssh(ports: list[int] | None, port_roles: dict | None,
             ssh: bool) -> tuple[list[int], dict[str, str]]:
    """A bid's (ports, port_roles) once `ssh` is applied: with ssh and no port of role
    "ssh" yet, port 22 is added with that role (docs: issue 12's contract). Ports sorted;
    roles keyed by the port as a string."""
    ports = sorted(ports or [])  # a port twice stays twice: clean_ports refuses it
    roles = {str(k): str(v) for k, v in (port_roles or {}).items()}
    if ssh and "ssh" not in roles.values():
        if SSH_PORT not in ports:
            ports = sorted([*ports, SSH_PORT])
        roles[str(SSH_PORT)] = "ssh"
    return ports, roles


def ssh_endpoint(lease: Lease) -> dict | None:
    """The endpoint of the lease's port of role "ssh" (port 22 when the lease has `ssh`
    and names no role), or None when the runner published none."""
    roles = lease.port_roles or {}
    ssh_ports = {int(p) for p, role in roles.items() if role == "ssh"}
    if not ssh_ports and lease.ssh:
        ssh_ports = {SSH_PORT}
    for endpoint in lease.endpoints or []:
        if endpoint.get("container_port") in ssh_ports:
            return endpoint
    return None


def ssh_command(lease: Lease) -> str | None:
    """"ssh -p <host_port> root@<host>" for the lease's published SSH port, else None."""
    endpoint = ssh_endpoint(lease)
    if endpoint is None:
        return None
    host = endpoint["host"]
    return f"ssh -p {endpoint['host_port']} root@{host}"


def role_links(lease: Lease, role: str) -> list[str]:
    """["http://host:port/", …] of the lease's reported endpoints whose port has `role`."""
    ports = {int(p) for p, r in (lease.port_roles or {}).items() if r == role}
    return [f"http://{endpoint_text(e)}/" for e in lease.endpoints or []
            if e.get("container_port") in ports]
