"""SSH into a lease end to end, with real parts: the marketplace (live server,
PostgreSQL), the runner as its own process (each lease on a bridge network of its own) publishing
on 127.0.0.1, the real sshd image and a real client (paramiko).

The buyer's key logs in and another key is refused; a key deleted from the account is
not in the next lease (and a key added since is); after the lease ends its port is
closed."""

from __future__ import annotations

import re

import pytest

from marketplace import book, ssh_keys
from marketplace.models import Lease
from tests.factories import H100_DUMP, funded_buyer, in_a_day, registered_node
from tests.support.api import client_for
from tests.support.containers import inspected
from tests.support.ssh import key_pair, port_open, ssh_login
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker]
LEASE_S = 40  # long enough to log in twice on a loaded machine


def _ssh_port(buyer, lease_id: int) -> int | None:
    """The host port in the lease's connect.ssh, as the buyer reads it from the API."""
    body = client_for(buyer).get(f"/api/v1/leases/{lease_id}/").json()
    command = (body.get("connect") or {}).get("ssh")
    if body["status"] != "running" or not command:
        return None
    m = re.fullmatch(r"ssh -p (\d+) root@127\.0\.0\.1", command)
    assert m, command
    return int(m.group(1))


def _bid(buyer, image: str) -> Lease:
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb",
                             price=2_600_000, gpus=1, duration_seconds=LEASE_S, image=image,
                             ssh=True).leases
    return lease


def test_ssh_into_a_lease_with_the_account_s_keys_only(live_server, docker_client, ssh_image,
                                                       runner_factory):
    provider, node, token = registered_node(H100_DUMP, name="h100-ssh")
    node.gpus.all().delete()  # the runner registers them itself
    runner = runner_factory(live_server.url, token, H100_DUMP)
    assert runner.register().returncode == 0
    # the default network: a bridge of the lease's own (docs/RUNNER.md, "Lease isolation")
    runner.start(network="per-lease", extra=("--public-host", "127.0.0.1"))
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_490_000, gpus=2, available_until=in_a_day())

    buyer = funded_buyer(100)
    laptop, stranger, desk = key_pair(), key_pair(), key_pair("rsa-2048")
    laptop_key = ssh_keys.add_key(owner_id=buyer.pk, public_key=laptop.public_line,
                                  name="laptop")
    first = _bid(buyer, ssh_image)
    port = wait_until("the first lease's ssh command",
                      lambda: _ssh_port(buyer, first.pk), timeout=60)
    assert wait_until("the buyer's key to log in", lambda: ssh_login(port, laptop),
                      timeout=30) is True
    assert ssh_login(port, stranger) is False

    # the laptop key is deleted, the desk key added: the next lease has only the desk
    ssh_keys.delete_key(owner_id=buyer.pk, key_id=laptop_key.pk)
    ssh_keys.add_key(owner_id=buyer.pk, public_key=desk.public_line, name="desk")
    second = _bid(buyer, ssh_image)
    port2 = wait_until("the second lease's ssh command",
                       lambda: _ssh_port(buyer, second.pk), timeout=60)
    assert port2 != port
    assert wait_until("the desk key to log in", lambda: ssh_login(port2, desk),
                      timeout=30) is True
    assert ssh_login(port2, laptop) is False
    assert ssh_login(port, laptop) is True  # the first lease keeps the keys it was given

    for lease, p in ((first, port), (second, port2)):
        ended = wait_until("the lease to end", lambda lease=lease: Lease.objects.filter(
            pk=lease.pk, status__in=Lease.ENDED).first(), timeout=LEASE_S + 60)
        assert ended.status == "completed", ended.cause
        wait_until("its container to be removed", lambda lease=lease: not inspected(
            docker_client, label=f"gpumarket.lease={lease.pk}"), timeout=30)
        assert not port_open(p)
        assert ssh_login(p, desk) is None
    keys_dir = runner.state / "authorized_keys"
    assert not list(keys_dir.glob("lease-*")), runner.output()
