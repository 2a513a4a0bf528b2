"""/ws/me/ lease messages carry how to connect (`connect.ssh`) to the lease's buyer only:
its provider hears of the lease, never of the way in."""

import json

import pytest
from asgiref.sync import async_to_sync

from marketplace import api_tokens, book, ssh_keys
from marketplace.leases import mark_running
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.frontend.conftest import call, connect, drain, recv
from tests.support.ssh import key_pair

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("clean_channel_layer")]
ENDPOINT = {"container_port": 22, "host": "gpu-host.example", "host_port": 40123}


def test_the_buyer_hears_the_ssh_command_and_the_provider_does_not():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    ssh_keys.add_key(owner_id=buyer.pk, public_key=key_pair().public_line, name="laptop")
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_490_000, gpus=2, available_until=in_a_day())
    paths = {u: f"/ws/me/?ticket={api_tokens.issue_ticket(user=u)[0]}"
             for u in (buyer, provider)}

    def lease_runs():
        [lease] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb",
                                 price=2_600_000, gpus=1, duration_seconds=3600,
                                 ssh=True).leases
        mark_running(lease=lease, container_id="c" * 64, endpoints=[ENDPOINT])
        return lease.pk

    async def scenario():
        comms = {}
        for user, path in paths.items():
            comm, connected, _ = await connect(path)
            assert connected
            await recv(comm)  # the snapshot
            comms[user] = comm
        lease_id = await call(lease_runs)
        frames = {user: await drain(comm, timeout=0.8) for user, comm in comms.items()}
        for comm in comms.values():
            await comm.disconnect()
        return lease_id, frames

    lease_id, frames = async_to_sync(scenario)()
    leases = [m["lease"] for m in map(json.loads, frames[buyer]) if m["type"] == "lease"]
    assert leases[-1]["id"] == lease_id and leases[-1]["status"] == "running"
    assert leases[-1]["connect"] == {"ssh": "ssh -p 40123 root@gpu-host.example",
                                     "jupyter": None, "http": []}
    theirs = [m["lease"] for m in map(json.loads, frames[provider]) if m["type"] == "lease"]
    assert theirs and all(le["connect"] is None for le in theirs)
    assert not any("ssh -p" in raw for raw in frames[provider])
