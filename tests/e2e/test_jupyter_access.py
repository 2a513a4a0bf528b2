"""Jupyter in a lease end to end, with real parts: the marketplace (live server,
PostgreSQL), the runner as its own process on a user-defined bridge network publishing on
127.0.0.1, and real JupyterLab (gpumarket/jupyter:local, scripts/build-jupyter-image.sh)
as the `pytorch-jupyter` template's image (GPUMARKET_TEMPLATE_IMAGES, as a site with no
registry sets it), running the template's own command.

The buyer's `connect.jupyter` link answers 200, and so does `/api/status` with its token;
without the token, or with another, JupyterLab refuses (403, or 302 to its login page);
the provider's view of the lease has no link; the token is not in the log tail; the
template's sshd lets the buyer's key in too; after the buyer stops the lease both ports
are closed. The `cuda-ssh` template mapped to the local sshd image runs its own command
there and lets the buyer in."""

from __future__ import annotations

import secrets
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from marketplace import ssh_keys
from marketplace.models import Lease
from providers.models import LeaseLog
from tests.conftest import DATA
from tests.factories import bid_body, funded_buyer, in_a_day, registered_node
from tests.support.api import client_for
from tests.support.containers import inspected
from tests.support.ssh import key_pair, port_open, ssh_login
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker]
H200_DUMP = DATA / "nvidia-smi" / "h200-x1.thamada-gls.q.txt"  # CUDA 12.4: the template's need


def _link(buyer, lease_id: int) -> str | None:
    """The lease's connect.jupyter as the buyer reads it, once it is running."""
    body = client_for(buyer).get(f"/api/v1/leases/{lease_id}/").json()
    return (body.get("connect") or {}).get("jupyter") if body["status"] == "running" else None


def _answers(url: str) -> httpx.Response | None:
    """JupyterLab's answer to a GET of `url` (redirects not followed); None while nothing
    answers there yet."""
    try:
        return httpx.get(url, timeout=5, follow_redirects=False)
    except httpx.TransportError:
        return None


def test_the_buyer_s_jupyter_link_opens_jupyterlab_and_nothing_else_does(
        live_server, settings, docker_client, jupyter_image, lease_network, runner_factory):
    settings.GPUMARKET_TEMPLATE_IMAGES = {"pytorch-jupyter": jupyter_image}
    provider, node, token = registered_node(H200_DUMP, name="h200-jupyter")
    node.gpus.all().delete()  # the runner registers them itself
    runner = runner_factory(live_server.url, token, H200_DUMP)
    assert runner.register().returncode == 0
    runner.start(network=lease_network, extra=("--public-host", "127.0.0.1"))
    gpu = node.gpus.select_related("gpu_class").first()
    assert client_for(provider).post("/api/v1/orders/", {
        "side": "ask", "node": node.pk, "price": "3.00", "gpus": 1,
        "available_until": in_a_day().isoformat()}, format="json").status_code == 201

    buyer = funded_buyer(100)
    laptop = key_pair()
    ssh_keys.add_key(owner_id=buyer.pk, public_key=laptop.public_line, name="laptop")
    placed = client_for(buyer).post("/api/v1/orders/", bid_body(
        gpu_class=gpu.gpu_class.slug, price="3.50", gpus=1, hours=1,
        template="pytorch-jupyter"), format="json")
    assert placed.status_code == 201, placed.json()
    [lease_id] = placed.json()["leases"]
    lease = Lease.objects.get(pk=lease_id)
    assert lease.image == jupyter_image and lease.port_roles["8888"] == "jupyter"

    link = wait_until("the lease's Jupyter link", lambda: _link(buyer, lease_id), timeout=60)
    parts = urlsplit(link)
    assert parts.hostname == "127.0.0.1" and parts.path == "/lab"
    jupyter_token = parse_qs(parts.query)["token"][0]
    base = f"http://127.0.0.1:{parts.port}"
    status = wait_until("JupyterLab to answer with the token", lambda: (
        r := _answers(f"{base}/api/status?token={jupyter_token}")) and r.status_code == 200
        and r, timeout=60)
    assert "started" in status.json()
    assert _answers(link).status_code == 200  # the link itself: JupyterLab's page
    assert _answers(f"{base}/api/status").status_code == 403
    assert _answers(f"{base}/api/status?token={secrets.token_urlsafe(32)}").status_code == 403
    no_token = _answers(f"{base}/lab")
    assert no_token.status_code == 302 and "/login" in no_token.headers["location"]
    wrong = _answers(f"{base}/lab?token={secrets.token_urlsafe(32)}")
    assert wrong.status_code in (302, 403)
    assert wrong.status_code == 403 or "/login" in wrong.headers["location"]

    seen_by_provider = client_for(provider).get(f"/api/v1/leases/{lease_id}/")
    assert seen_by_provider.status_code == 200
    assert seen_by_provider.json()["connect"] is None
    assert jupyter_token not in seen_by_provider.content.decode()
    tail = wait_until("JupyterLab's start in the lease's log tail", lambda: (
        row := LeaseLog.objects.filter(lease_id=lease_id).first()) and "is running at"
        in row.tail and row.tail, timeout=60)
    assert jupyter_token not in tail

    ssh = client_for(buyer).get(f"/api/v1/leases/{lease_id}/").json()["connect"]["ssh"]
    ssh_port = int(ssh.split()[2])
    assert ssh == f"ssh -p {ssh_port} root@127.0.0.1"
    assert wait_until("the buyer's key to log in", lambda: ssh_login(ssh_port, laptop),
                      timeout=30) is True

    stopped = client_for(buyer).post(f"/api/v1/leases/{lease_id}/stop/")
    assert stopped.status_code == 200 and stopped.json()["status"] == "cancelled"
    wait_until("the container to be removed", lambda: not inspected(
        docker_client, label=f"gpumarket.lease={lease_id}"), timeout=30)
    assert not port_open(parts.port) and not port_open(ssh_port)
    assert _link(buyer, lease_id) is None


def test_the_cuda_ssh_template_mapped_to_the_local_sshd_image_lets_the_buyer_in(
        live_server, settings, docker_client, ssh_image, lease_network, runner_factory):
    settings.GPUMARKET_TEMPLATE_IMAGES = {"cuda-ssh": ssh_image}
    provider, node, token = registered_node(H200_DUMP, name="h200-cuda-ssh")
    node.gpus.all().delete()
    runner = runner_factory(live_server.url, token, H200_DUMP)
    assert runner.register().returncode == 0
    runner.start(network=lease_network, extra=("--public-host", "127.0.0.1"))
    gpu = node.gpus.select_related("gpu_class").first()
    assert client_for(provider).post("/api/v1/orders/", {
        "side": "ask", "node": node.pk, "price": "3.00", "gpus": 1,
        "available_until": in_a_day().isoformat()}, format="json").status_code == 201
    buyer = funded_buyer(100)
    laptop = key_pair()
    ssh_keys.add_key(owner_id=buyer.pk, public_key=laptop.public_line, name="laptop")
    placed = client_for(buyer).post("/api/v1/orders/", bid_body(
        gpu_class=gpu.gpu_class.slug, price="3.50", gpus=1, hours=1, template="cuda-ssh"),
        format="json")
    assert placed.status_code == 201, placed.json()
    [lease_id] = placed.json()["leases"]
    lease = Lease.objects.get(pk=lease_id)
    assert lease.image == ssh_image and lease.command[0] == "/bin/sh"  # the template's

    def ssh_command():
        body = client_for(buyer).get(f"/api/v1/leases/{lease_id}/").json()
        return body["status"] == "running" and (body.get("connect") or {}).get("ssh")

    port = int(wait_until("the lease's ssh command", ssh_command, timeout=60).split()[2])
    assert wait_until("the buyer's key to log in", lambda: ssh_login(port, laptop),
                      timeout=30) is True
    assert ssh_login(port, key_pair()) is False
