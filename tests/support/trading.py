"""A recorded host's lease end to end, for the e2e tests that start the runner as a process
(tests/e2e/conftest.py's Runner): a node with no GPUs for the runner to register, and one
trade of its units run in Docker and settled."""

from __future__ import annotations

from marketplace import book
from marketplace.models import Lease
from providers import services as provider_services
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.split import split
from tests.factories import UserFactory, ensure_catalog, funded_buyer, in_a_day
from tests.support.containers import inspected
from tests.support.waiting import wait_until

LEASE_S = 8  # the lease's duration, seconds


def _lease(lease_id: int, *statuses: str):
    lease = Lease.objects.get(pk=lease_id)
    return lease if lease.status in statuses else None


def empty_node(name: str):
    """A provider with a node that has no GPUs yet: (provider user, node, runner token)."""
    ensure_catalog()
    user = UserFactory()
    created = provider_services.node_create(
        provider=provider_services.provider_onboard(user_id=user.pk, display_name="Acme"),
        name=name)
    return user, created.node, created.runner_token


def trade_and_settle(*, provider, node, runner, docker_client, test_image, market: str,
                     gpus: int, price: int) -> list[str]:
    """An ask and a bid of `gpus` units in `market` trade; the lease's container sees
    exactly its units, ends, is removed and settles 85/15 with a clean ledger. Returns the
    leased UUIDs. `runner`: a started tests.e2e.conftest.Runner; price: micro-USD per unit-hour
    (the bid offers 0.05 USD more, so the trade is at the ask's price)."""
    buyer = funded_buyer(100)
    wait_until("the runner's first heartbeat (an ask needs a heard node)", lambda: type(
        node).objects.get(pk=node.pk).last_heartbeat_at is not None, timeout=30)
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=market,
                         price=price, gpus=gpus, available_until=in_a_day()).order
    placed = book.place_bid(buyer_id=buyer.pk, market_slug=market, price=price + 50_000,
                            gpus=gpus, duration_seconds=LEASE_S, image=test_image,
                            command=["sleep", "3600"])
    [lease] = placed.leases
    leased = sorted(lg.gpu.uuid for lg in lease.lease_gpus.all())
    # this node's container of the lease (other tests on this Docker engine number theirs too)
    labels = [f"gpumarket.lease={lease.pk}", f"gpumarket.node={node.uid}"]
    running = wait_until("the lease to run",
                         lambda: _lease(lease.pk, "running", "completed"), timeout=30)
    [container] = inspected(docker_client, label=labels)
    assert container.id == running.container_id
    env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
    assert sorted(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == leased
    ended = wait_until("the lease to end",
                       lambda: _lease(lease.pk, "completed", "failed"), timeout=40)
    assert ended.status == "completed", ended.cause
    wait_until("the container to be removed",
               lambda: not inspected(docker_client, label=labels),
               timeout=30)
    out = runner.output()
    assert f"lease {lease.pk}: running" in out, out
    # the simulated in-container check ran and saw exactly the leased units
    assert "GPU check failed" not in out and "not verified from inside" not in out, out
    seconds = int((ended.ended_at - ended.started_at).total_seconds())
    assert ended.cost == price * gpus * min(seconds, LEASE_S) // 3600 > 0
    parts = split(ended.cost, 1500)
    assert (ended.provider_amount, ended.platform_fee) == (parts.provider, parts.platform_fee)
    assert parts.provider + parts.platform_fee == ended.cost
    assert ledger.wallet(user_id=provider.pk).earned == parts.provider
    assert ledger.wallet(user_id=buyer.pk).held == 0
    assert ledger.wallet(user_id=buyer.pk).available == 100_000_000 - ended.cost
    ask.refresh_from_db()
    assert ask.remaining_gpus == gpus  # the units went back to the standing ask
    assert first_violation() is None
    return leased
