"""A lease's Jupyter token: made by the marketplace for a lease with a "jupyter" port role
(`secrets.token_urlsafe(32)`), sealed at rest (Lease.jupyter_token_sealed), handed to the
workload as the secret JUPYTER_TOKEN (JupyterLab reads it) and shown to the lease's buyer
only, as the link `connect.jupyter`. No database access. docs/SECRETS.md.
"""

from __future__ import annotations

import secrets

from marketplace.ports import endpoint_text
from marketplace.sealing import Unsealable, seal_text, unseal_text

JUPYTER_ROLE = "jupyter"
JUPYTER_SECRET = "JUPYTER_TOKEN"


def new_jupyter_token(port_roles: dict[str, str] | None) -> str:
    """A new sealed token when `port_roles` has a "jupyter" port, else ""."""
    if JUPYTER_ROLE not in (port_roles or {}).values():
        return ""
    return seal_text(secrets.token_urlsafe(32))


def jupyter_token(lease) -> str:
    """The lease's Jupyter token in clear ("" when it has none or it cannot be opened)."""
    try:
        return unseal_text(lease.jupyter_token_sealed)
    except Unsealable:
        return ""


def jupyter_link(lease) -> str | None:
    """`http://host:port/lab?token=…` for the lease's first "jupyter" port once the runner
    reported its endpoint; None before, or when the lease has no Jupyter port. For the
    lease's buyer only."""
    ports = sorted(int(p) for p, role in (lease.port_roles or {}).items()
                   if role == JUPYTER_ROLE)
    if not ports or not lease.jupyter_token_sealed:
        return None
    for endpoint in lease.endpoints or []:
        if endpoint.get("container_port") == ports[0]:
            token = jupyter_token(lease)
            return f"http://{endpoint_text(endpoint)}/lab?token={token}" if token else None
    return None
