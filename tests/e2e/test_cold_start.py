"""Cold starts end to end (docs/IMAGES.md), with real parts: PostgreSQL, the runner as its
own process over HTTP, the Docker Engine and Debian's docker-registry on 127.0.0.1.

A lease whose image is only in the registry: the runner pulls it (progress in the lease's
starting → starting events), then runs it; the clock starts at `running`, so the buyer
pays exactly the seconds from `started_at` — at 3,600 USD per GPU-hour every second of
the pull would show as 1 USD. A lease whose image the registry lacks fails with the
pull's cause and costs nothing."""

from __future__ import annotations

import pytest

from marketplace import book
from marketplace.models import Lease
from settlement import services as ledger
from settlement.checks import first_violation
from tests.factories import H100_DUMP, funded_buyer, in_a_day
from tests.support.trading import empty_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker]

PRICE = 3_600_000_000  # micro-USD per GPU-hour: 1 USD (1,000,000 micro-USD) a second
LEASE_S = 6


def _ended(lease_id: int):
    lease = Lease.objects.get(pk=lease_id)
    return lease if lease.status in Lease.ENDED else None


def _trade(provider, node, image: str, command: list[str]):
    wait_until("the runner's first heartbeat", lambda: type(node).objects.filter(
        pk=node.pk, last_heartbeat_at__isnull=False).exists(), timeout=60)
    buyer = funded_buyer(100)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None, price=PRICE,
                   gpus=2, available_until=in_a_day())
    placed = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=PRICE,
                            gpus=1, duration_seconds=LEASE_S, image=image, command=command)
    [lease] = placed.leases
    return buyer, lease


def test_a_cold_pull_is_shown_to_the_buyer_and_never_billed(live_server, runner_factory,
                                                            cold_image):
    image = cold_image(24, layers=3)
    provider, node, token = empty_node("cold-e2e")
    runner = runner_factory(live_server.url, token, H100_DUMP)
    assert runner.register().returncode == 0
    runner.start(extra=("--no-prefetch", "--allow-private-registry"))  # on 127.0.0.1
    buyer, lease = _trade(provider, node, image, ["sleep", "3600"])

    ended = wait_until("the lease to run and end", lambda: _ended(lease.pk), timeout=90)
    assert ended.status == "completed", (ended.cause, runner.output()[-2000:])
    notes = list(ended.events.filter(from_status="starting", to_status="starting")
                 .order_by("at", "pk"))
    causes = [n.cause for n in notes]
    assert any(c.startswith(f"pulling image {image}") for c in causes), causes
    assert causes[-1].startswith(f"image {image} pulled in "), causes
    assert ended.progress == causes[-1]
    assert ended.started_at >= notes[-1].at  # the pull was over before the clock started
    unbilled = (ended.started_at - ended.created_at).total_seconds()
    seconds = min(LEASE_S, int((ended.ended_at - ended.started_at).total_seconds()))
    assert ended.cost == PRICE * 1 * seconds // 3600  # from `running` on, nothing before
    assert ledger.wallet(user_id=buyer.pk).available == 100_000_000 - ended.cost
    assert unbilled > 0
    assert first_violation() is None
    assert f"lease {lease.pk}: image {image} pulled in" in runner.output()


def test_a_failed_pull_fails_the_lease_with_its_cause_and_no_charge(
        live_server, runner_factory, image_registry):
    missing = image_registry.ref("test/not-there", "1")
    provider, node, token = empty_node("cold-fail-e2e")
    runner = runner_factory(live_server.url, token, H100_DUMP)
    assert runner.register().returncode == 0
    runner.start(extra=("--no-prefetch", "--allow-private-registry"))  # on 127.0.0.1
    buyer, lease = _trade(provider, node, missing, ["true"])

    ended = wait_until("the lease to fail", lambda: _ended(lease.pk), timeout=60)
    assert ended.status == "failed"
    assert ended.cause.startswith(f"image {missing} could not be pulled: "), ended.cause
    assert ended.started_at is None and ended.cost == 0
    wallet = ledger.wallet(user_id=buyer.pk)
    assert (wallet.available, wallet.held) == (100_000_000, 0)
    assert first_violation() is None
