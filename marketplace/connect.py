"""How a lease's buyer connects (issue 12): the SSH command, the Jupyter link with its
token, the HTTP links — from the lease's endpoints and port roles. For the buyer's eyes
only (API lease answer, /ws/me/, leases page)."""

from __future__ import annotations

from marketplace.jupyter import jupyter_link
from marketplace.models import Lease
from marketplace.ports import role_links, ssh_command


def connect_info(lease: Lease) -> dict:
    """{"ssh": "ssh -p N root@host" | None, "jupyter": "http://host:port/lab?token=…" |
    None, "http": ["http://host:port/", …]}; None and [] until the runner reports
    endpoints (a Jupyter link also needs the lease's token)."""
    return {"ssh": ssh_command(lease), "jupyter": jupyter_link(lease),
            "http": role_links(lease, "http")}
