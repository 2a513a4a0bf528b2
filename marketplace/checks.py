"""The ledger invariants that need the market's models, registered with
settlement.checks (so `manage.py ledger_check` and `first_violation` run them)."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Sum

from marketplace.models import Lease, LeaseExtension, Order, SealedBid
from settlement.models import Account, Hold, Payout


def holds_match_open_bids_and_leases() -> str | None:
    """Every active hold secures exactly one open bid, active sealed bid, unended lease or
    extension of one, and each of those has an active hold."""
    owners: dict[int, list[str]] = defaultdict(list)
    for pk, hold in Order.objects.filter(side="bid", status__in=Order.ACTIVE) \
            .values_list("pk", "hold_id"):
        owners[hold].append(f"order {pk}")
    for pk, hold in SealedBid.objects.filter(status="active").values_list("pk", "hold_id"):
        owners[hold].append(f"sealed bid {pk}")
    for pk, hold in Lease.objects.filter(status__in=Lease.ACTIVE).values_list("pk", "hold_id"):
        owners[hold].append(f"lease {pk}")
    for pk, hold in LeaseExtension.objects.filter(lease__status__in=Lease.ACTIVE) \
            .values_list("lease_id", "hold_id"):
        owners[hold].append(f"lease {pk} (extension)")
    for pk, hold in Lease.objects.filter(failover_state="pending") \
            .values_list("pk", "carry_hold_id"):  # carried to a continuation (failover.py)
        owners[hold].append(f"lease {pk} (failover carry)")
    active = set(Hold.objects.filter(status=Hold.Status.ACTIVE).values_list("pk", flat=True))
    for hold_id, things in sorted(owners.items()):
        if hold_id not in active:
            return f"{things[0]} is secured by hold {hold_id}, which is not active"
        if len(things) > 1:
            return f"hold {hold_id} secures several things at once: {', '.join(things)}"
    orphan = sorted(active - set(owners))
    return f"hold {orphan[0]} is active but secures no open bid or lease" if orphan else None


def provider_earnings_match_settled_leases() -> str | None:
    """Each provider's earnings in the ledger (earned + in flight + paid out) equal its
    share of what its leases were charged (settled leases, and the metered part of
    running ones), by the take-rate split."""
    expected: dict[int, int] = defaultdict(int)
    for provider, amount, credit in Lease.objects.filter(settled_at__isnull=False) \
            .values_list("provider_id", "provider_amount", "fault_credit"):
        expected[provider] += amount - credit  # a fault credit went back to the buyer
    running = list(Lease.objects.filter(status__in=Lease.ACTIVE)
                   .values_list("provider_id", "hold_id"))
    running += LeaseExtension.objects.filter(lease__status__in=Lease.ACTIVE) \
        .values_list("lease__provider_id", "hold_id")
    holds = {h.pk: h for h in Hold.objects.filter(pk__in=[h for _, h in running])}
    for provider, hold_id in running:
        expected[provider] += holds[hold_id].captured - holds[hold_id].captured_fee
    ledger: dict[int, int] = defaultdict(int)
    for owner, balance in Account.objects.filter(
            kind__in=[Account.Kind.PROVIDER_EARNED, Account.Kind.PROVIDER_PAYOUT_PENDING]) \
            .values_list("owner_id", "balance"):
        ledger[owner] += balance
    for owner, paid in Payout.objects.filter(status=Payout.Status.PAID).values("provider") \
            .annotate(t=Sum("amount")).values_list("provider", "t"):
        ledger[owner] += paid
    for provider in sorted(set(expected) | set(ledger)):
        if expected.get(provider, 0) != ledger.get(provider, 0):
            return (f"provider {provider}: the ledger holds {ledger.get(provider, 0)} micro-USD "
                    f"of earnings, its leases account for {expected.get(provider, 0)}")
    return None


def chains_are_sound() -> str | None:
    """Every continuation (failover.py) continues a lease of its buyer and chain that
    failed by a provider-side cause, on another node, at no higher price (one from a
    resting failover bid: at no more than that bid's limit); a failed lease that is no
    longer pending holds no carry hold."""
    for lease in Lease.objects.filter(continues__isnull=False).select_related(
            "continues", "fill__bid"):
        old = lease.continues
        if old.status != "failed" or old.fault != "provider":
            return f"lease {lease.pk} continues lease {old.pk}, which did not fail by the " \
                   "provider's fault"
        if (lease.buyer_id, lease.chain_id) != (old.buyer_id, old.chain):
            return f"lease {lease.pk} continues lease {old.pk} of another buyer or chain"
        limit = lease.fill.bid.price if lease.fill_id else old.price
        if lease.node_id == old.node_id or lease.price > limit:
            return f"lease {lease.pk} continues lease {old.pk} on its node or above its price"
    stray = (Lease.objects.exclude(failover_state="pending")
             .filter(carry_hold_id__isnull=False).values_list("pk", flat=True).first())
    return f"lease {stray} keeps a carry hold after its failover" if stray else None
