"""Environment templates (the data: marketplace/templates.json) and CUDA compatibility.

A bid or sealed bid names a template (`template`) or brings its own image; `resolve`
turns either into the container terms the order keeps: image, command, ports,
port_roles ({"22": "ssh"}), env, min_cuda ("12.4" or ""), ssh. Explicit fields override
the template's; the conflicts it refuses, and why: README "Templates".

CUDA versions compare as (major, minor) tuples. A node's `cuda_version` (what its runner
read from NVML or the dump: "12.2") that does not parse qualifies for no bid with a
min_cuda. The engine compares `cuda_key` integers (major × 1000 + minor; 0: none).
Rules: docs/MATCHING.md "CUDA compatibility". No database access.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from marketplace.errors import InvalidInput
from marketplace.ports import PORT_ROLES as ROLES
from marketplace.ports import SSH_PORT, clean_ports
from marketplace.workload_env import clean_vars

MIN_CUDA = re.compile(r"\A([1-9][0-9]{0,2})\.([0-9]{1,3})\Z")
_NODE_CUDA = re.compile(r"\A\s*([0-9]{1,3})\.([0-9]{1,3})(?:\.[0-9]+)?\s*\Z")
DATA = Path(__file__).with_name("templates.json")


class Template(NamedTuple):
    """One template: ports as ((port, role), …); min_cuda "" when it needs none."""

    id: str
    title: str
    image: str
    command: list[str] | None
    ports: tuple[tuple[int, str], ...]
    env: dict[str, str]
    min_cuda: str
    needs_shell_user: bool
    cuda_source: str

    def as_api(self) -> dict[str, Any]:
        """The GET /api/v1/templates/ item (contract: id, title, image, command, ports
        [{port, role}], env, min_cuda, needs_shell_user; and cuda_source)."""
        return {"id": self.id, "title": self.title, "image": self.image,
                "command": self.command,
                "ports": [{"port": p, "role": r} for p, r in self.ports],
                "env": dict(self.env), "min_cuda": self.min_cuda,
                "needs_shell_user": self.needs_shell_user, "cuda_source": self.cuda_source}


def parse_min_cuda(value: str) -> tuple[int, int] | None:
    """(major, minor) of a requirement "12.4"; None for "". Raises InvalidInput naming
    `min_cuda` for anything but MAJOR.MINOR (1–3 digits each, MAJOR 1 or more: a need of
    "0.x" would read as none in the engine)."""
    if value == "":
        return None
    m = MIN_CUDA.match(value) if isinstance(value, str) else None
    if m is None:
        raise InvalidInput('must be a CUDA version "MAJOR.MINOR", such as "12.4"',
                           field="min_cuda")
    return int(m[1]), int(m[2])


def clean_min_cuda(value: str) -> str:
    """The requirement, normalised ("12.04" → "12.4"; "" stays ""). InvalidInput as
    parse_min_cuda."""
    parsed = parse_min_cuda(value)
    return "" if parsed is None else f"{parsed[0]}.{parsed[1]}"


@lru_cache(maxsize=256)
def node_cuda(version: str) -> tuple[int, int] | None:
    """(major, minor) of a node's reported CUDA version ("12.2", "12.2.1"), or None
    when it is empty or does not parse."""
    m = _NODE_CUDA.match(version or "")
    return (int(m[1]), int(m[2])) if m else None


@lru_cache(maxsize=256)
def cuda_key(version: str) -> int:
    """The engine's integer for a version ("12.4" → 12004; "" or unparsed → 0)."""
    v = node_cuda(version)
    return v[0] * 1000 + v[1] if v else 0


def cuda_ok(node_version: str, min_cuda: str) -> bool:
    """Whether a node reporting `node_version` may run what needs `min_cuda`."""
    if not min_cuda:
        return True
    have = node_cuda(node_version)
    return have is not None and have >= parse_min_cuda(min_cuda)


def _load() -> dict[str, Template]:
    raw = json.loads(DATA.read_text(encoding="utf-8"))
    out: dict[str, Template] = {}
    for t in raw["templates"]:
        ports = tuple((int(p["port"]), p["role"]) for p in t["ports"])
        if any(role not in ROLES for _, role in ports) or t["id"] in out:
            raise ValueError(f"templates.json: bad template {t['id']!r}")
        clean_ports([p for p, _ in ports])
        out[t["id"]] = Template(t["id"], t["title"], t["image"], t["command"], ports,
                                dict(t["env"]), clean_min_cuda(t["min_cuda"]),
                                bool(t["needs_shell_user"]), t["cuda_source"])
    return out


TEMPLATES: dict[str, Template] = _load()  # as templates.json says; templates() as served
CUSTOM = "custom"


def templates() -> dict[str, Template]:
    """The templates this site offers: TEMPLATES with the operator's image in place of a
    template's own where settings.GPUMARKET_TEMPLATE_IMAGES names one (a registry mirror,
    or a local image; marketplace/template_images.py)."""
    from django.conf import settings

    mapped = getattr(settings, "GPUMARKET_TEMPLATE_IMAGES", None) or {}
    return {k: t._replace(image=mapped[k]) if k in mapped else t
            for k, t in TEMPLATES.items()}


def get_template(template_id: str) -> Template:
    """The template `template_id` as templates() serves it; InvalidInput naming
    `template`, listing the known."""
    t = templates().get(template_id)
    if t is None:
        known = ", ".join(sorted(TEMPLATES))
        raise InvalidInput(f"unknown template {template_id!r}: known templates are {known}",
                           field="template")
    return t


def clean_env(env: dict | None) -> dict[str, str]:
    """Non-secret environment {NAME: value}, as workload_env.clean_vars checks it (names,
    bounds, reserved prefixes). InvalidInput naming `env` or `env.NAME`."""
    return clean_vars(env, field="env")


def check_terms(*, ports: list[int], port_roles: dict | None, min_cuda: str,
                env: dict | None) -> None:
    """The stored shape of resolved terms (what resolve returns), for Python callers
    that pass them directly: min_cuda normalised, each port_roles key a port of `ports`
    with a known role, env as clean_env. InvalidInput naming the field."""
    if clean_min_cuda(min_cuda) != min_cuda:
        raise InvalidInput('must be a CUDA version "MAJOR.MINOR", such as "12.4"',
                           field="min_cuda")
    listed = {str(p) for p in ports}
    if any(k not in listed or v not in ROLES for k, v in (port_roles or {}).items()):
        raise InvalidInput("maps a port that is not in ports, or an unknown role",
                           field="port_roles")
    clean_env(env)


def resolve(*, template: str = "", image: str | None = None,
            command: list[str] | None = None, ports: list[int] | None = None,
            env: dict | None = None, min_cuda: str | None = None,
            ssh: bool | None = None) -> dict[str, Any]:
    """The container terms of a bid: the template's, with each field given (not None)
    overriding it; env merged name by name. Returns {template, image, command, ports
    (sorted), port_roles, env, min_cuda, ssh}.

    ssh defaults to whether the ports hold an "ssh" role; ssh true without one adds
    port 22 as "ssh". Refused (InvalidInput naming the field): an unknown template;
    `ports` that leave out a port of the template's while its image is kept (with
    an own image, the template's roles of the ports listed stay); a `min_cuda` below the template's
    while its image is kept; "custom" without an image; port 22 given another role;
    a malformed min_cuda or env."""
    t = get_template(template) if template else None
    roles: dict[int, str] = dict(t.ports) if t else {}
    if ports is not None:
        ports = clean_ports(ports)
        dropped = [f"{p} ({r})" for p, r in sorted(roles.items()) if p not in ports]
        if dropped and image in (None, "", t.image):
            raise InvalidInput(f"leaves out port {', '.join(dropped)} of template {t.id}'s "
                               "image: list it too, or bring your own image", field="ports")
        roles = {p: r for p, r in roles.items() if p in ports}  # own image: its ports
    else:
        ports = sorted(roles)
    wanted = clean_min_cuda(min_cuda) if min_cuda is not None else None
    if t and wanted is not None and image in (None, t.image) and t.min_cuda \
            and (parse_min_cuda(wanted) or (0, 0)) < parse_min_cuda(t.min_cuda):
        raise InvalidInput(f"template {t.id}'s image needs CUDA {t.min_cuda}; a lower "
                           "min_cuda needs your own image", field="min_cuda")
    final_image = image if image else (t.image if t else "")
    if t and t.id == CUSTOM and not final_image:
        raise InvalidInput("template custom is your own image: give one", field="image")
    has_ssh_role = "ssh" in roles.values()
    if ssh is None:
        ssh = has_ssh_role
    if ssh and not has_ssh_role:
        if roles.get(SSH_PORT) not in (None, "ssh"):
            raise InvalidInput(f"port {SSH_PORT} is the template's {roles[SSH_PORT]} port",
                               field="ssh")
        roles[SSH_PORT] = "ssh"
        if SSH_PORT not in ports:
            ports = clean_ports([*ports, SSH_PORT])
    merged = {**(t.env if t else {}), **clean_env(env)}
    return {"template": t.id if t else "", "image": final_image,
            "command": command if command is not None else (t.command if t else None),
            "ports": ports, "port_roles": {str(p): r for p, r in sorted(roles.items())},
            "env": merged,
            "min_cuda": wanted if wanted is not None else (t.min_cuda if t else ""),
            "ssh": bool(ssh)}
