"""A template bid end to end, with real parts: the runner (its own process) registers a
recorded dump and so reports that driver's CUDA version; a template bid needing more
rests and says why; the same template with a local image and the node's own CUDA level
runs in a real Docker container with the template's env merged with the buyer's, and
never a lease on a node below its need."""

from __future__ import annotations

import pytest

from marketplace import book
from marketplace.env_templates import resolve
from marketplace.models import Lease, Order
from marketplace.selectors import cuda_match_note
from tests.factories import H100, H100_DUMP, funded_buyer, in_a_day, registered_node
from tests.support.containers import inspected
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker]


def _running(lease_id: int):
    lease = Lease.objects.get(pk=lease_id)
    return lease if lease.status in ("running", "completed", "failed") else None


def test_a_template_lease_runs_with_its_env_only_where_its_cuda_is_met(
        live_server, docker_client, test_image, runner_factory):
    provider, node, token = registered_node(H100_DUMP, name="h100-templates")
    node.gpus.all().delete()
    node.cuda_version = ""
    node.save(update_fields=["cuda_version"])
    runner = runner_factory(live_server.url, token, H100_DUMP)
    assert runner.register().returncode == 0
    node.refresh_from_db()
    assert node.cuda_version == "12.2"  # what the runner read from the driver-535 dump
    runner.start()
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_000_000, gpus=4, available_until=in_a_day())
    buyer = funded_buyer(100, ssh_key=True)  # the template has ssh

    needs_more = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=2_600_000, gpus=1,
                                duration_seconds=60,
                                **resolve(template="pytorch-jupyter", image=test_image))
    assert needs_more.leases == []
    assert cuda_match_note(needs_more.order) == \
        "needs CUDA 12.4: 0 of 1 nodes with asks qualify"

    terms = resolve(template="pytorch-jupyter", image=test_image, command=["sleep", "3600"],
                    min_cuda="12.2", env={"WANDB_MODE": "offline"})
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=2_600_000, gpus=1,
                             duration_seconds=60, **terms).leases
    running = wait_until("the template lease to run", lambda: _running(lease.pk), timeout=30)
    assert running.status == "running", running.cause
    [container] = inspected(docker_client, label=f"gpumarket.lease={lease.pk}")
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    assert env["PYTHONUNBUFFERED"] == "1" and env["WANDB_MODE"] == "offline"
    assert env["GPUMARKET_LEASE_ID"] == str(lease.pk)
    assert running.port_roles == {"22": "ssh", "8888": "jupyter"}
    assert running.template == "pytorch-jupyter" and running.min_cuda == "12.2"
    # the resting bid never got a lease on this node
    assert Order.objects.get(pk=needs_more.order.pk).status == "open"
    assert not Lease.objects.filter(min_cuda="12.4").exists()
