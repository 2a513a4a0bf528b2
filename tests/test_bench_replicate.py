"""bench/replicate.py's copies are whole blocks of what the services write: the ledger
stays exact, every copy has its own ids, references and unique texts, and a copied
lease ends and settles as the original does (its GPUs back on its own ask)."""

import pytest
from django.utils import timezone

from bench.replicate import replicate
from marketplace import book
from marketplace.lease_end import end_leases_batch
from marketplace.leases import mark_running
from marketplace.models import Lease, Order
from providers.models import Gpu, Node
from settlement.checks import first_violation
from settlement.models import Account, Hold
from tests.factories import funded_buyer, in_a_day, registered_node

pytestmark = pytest.mark.django_db

PRICE = 2_490_001
MARKET = "h100-sxm-80gb"


def _block():
    provider, node, _ = registered_node(name="r0", own_uuids=True)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None, price=PRICE,
                   gpus=4, available_until=in_a_day())
    for _ in range(3):
        buyer = funded_buyer(1000)
        book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=PRICE, gpus=1,
                       duration_seconds=3600)


def test_copies_are_whole_blocks_and_settle_like_the_original():
    _block()
    assert first_violation() is None
    external = Account.objects.get(owner__isnull=True)
    counts = replicate(2)
    assert first_violation() is None
    assert counts["marketplace_lease"] == 9 and counts["providers_node"] == 3
    assert Node.objects.values("uid").distinct().count() == 3
    assert Gpu.objects.values("uuid").distinct().count() == counts["providers_gpu"] == 24
    external.refresh_from_db()
    assert external.balance == -3 * 1000 * 3 * 1_000_000  # three blocks of three credits
    for lease in Lease.objects.select_related("ask", "fill"):
        hold = Hold.objects.get(pk=lease.hold_id)
        assert hold.reference == f"lease:{lease.pk}" and hold.buyer_id == lease.buyer_id
        assert lease.ask.node_id == lease.node_id == lease.fill.ask.node_id
        assert lease.fill.bid.owner_id == lease.buyer_id
        assert set(lease.lease_gpus.values_list("gpu__node_id", flat=True)) == {lease.node_id}
    copied = list(Lease.objects.order_by("pk"))[3:6]  # the first copy
    for lease in copied:
        mark_running(lease=lease, container_id="c" * 64)
    ended = end_leases_batch(market_id=copied[0].market_id,
                             lease_ids=[lease.pk for lease in copied], status="completed",
                             cause="lease time is over", now=timezone.now())
    assert len(ended) == 3 and first_violation() is None
    ask = Order.objects.get(pk=copied[0].ask_id)
    assert ask.remaining_gpus == 4 and ask.status == "open"
    assert Order.objects.filter(side="ask", remaining_gpus=1).count() == 2  # the others
