"""Failover: a lease failed by a provider-side cause continues on another node
(issue 15; the rules: docs/FAULTS.md, "Failover").

`lease_end._end_locked` classifies the failure (marketplace/faults.py), keeps the
unused hold on a carry hold (settlement hold_settle_many carry_reference) and marks the
lease `failover_state = "pending"`; after commit it queues `tasks.failover_lease`
(acks_late). `continue_lease` then, under the market lock, places the remaining time:

1. on the best ask of the same class on another node (price ≤ the failed lease's, time
   order, then id; enough healthy free GPUs on one node; CUDA, reliability as the bid
   asked) — a new lease with chain_id/continues, the carry hold cut to its cost and
   renamed to it; else
2. as a resting GTC bid at the original bid's limit, when the original bid was GTC (the
   carry hold released and the bid's own hold placed in the same transaction); else
3. the carry hold is released.

Exactly once: `failover_state` leaves "pending" in the transaction that does the work,
and `continues` is one-to-one; a retried or duplicated task finds nothing pending.
`resume_pending` (a beat sweep) queues what a lost task left pending.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from marketplace import book, locking, reliability
from marketplace.chains import short_cause
from marketplace.env_templates import cuda_ok
from marketplace.errors import Conflict
from marketplace.leases import create_lease
from marketplace.models import Lease, Order
from marketplace.sealing import unseal
from settlement import services as ledger
from settlement.models import Hold
from settlement.money import format_usd, lease_cost

log = logging.getLogger("gpumarket.failover")

PENDING, CONTINUED, RESTED, RELEASED = "pending", "continued", "rested", "released"


def _clock(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%H:%M:%S")


def remaining_seconds(lease: Lease) -> int:
    """The leased seconds a failed lease did not charge (its `failed` event's seconds)."""
    ended = (lease.events.filter(to_status="failed").exclude(from_status="failed")
             .order_by("-at", "-id").first())  # the transition, not a later note
    charged = int((ended.detail or {}).get("seconds", 0)) if ended else 0
    return max(lease.duration_seconds - charged, 0)


def original_bid(lease: Lease) -> Order | None:
    """The continuous-auction bid the chain's first lease filled (None: a sealed bid's)."""
    first = lease if lease.chain_id is None else Lease.objects.get(pk=lease.chain_id)
    return first.fill.bid if first.fill_id else None


def candidate_asks(lease: Lease, now: datetime, seconds: int):
    """Standing asks of the lease's class, not on its node nor its buyer's, at or below
    its price, with its GPUs left and time for `seconds`: cheapest first, then oldest."""
    until = now + timedelta(seconds=seconds)
    return (Order.objects.select_related("node")
            .filter(market_id=lease.market_id, side=Order.Side.ASK, status__in=Order.ACTIVE,
                    remaining_gpus__gte=lease.gpu_count, price__lte=lease.price,
                    available_until__gte=until)
            .exclude(node_id=lease.node_id).exclude(owner_id=lease.buyer_id)
            .order_by("price", "created_at", "pk"))


def _fits(lease: Lease, ask: Order, now: datetime) -> bool:
    node = ask.node
    seen = node.last_heartbeat_at
    if seen is None or seen < now - timedelta(seconds=settings.GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS):
        return False
    if not cuda_ok(node.cuda_version, lease.min_cuda):
        return False
    return reliability.meets(node.pk, lease.min_reliability, now)


def continue_lease(*, lease_id: int, now: datetime | None = None) -> str:
    """Place failed lease `lease_id`'s remaining time (the module's steps 1–3); returns
    the failover_state it leaves ("" when there was nothing pending: a repeat)."""
    now = now or timezone.now()
    market_id = Lease.objects.values_list("market_id", flat=True).get(pk=lease_id)
    with transaction.atomic():
        locking.lock_market(market_id)
        failed = Lease.objects.select_for_update().get(pk=lease_id)
        if failed.failover_state != PENDING:
            return ""
        carry = Hold.objects.select_for_update().get(pk=failed.carry_hold_id)
        seconds = remaining_seconds(failed)
        for ask in candidate_asks(failed, now, seconds) if seconds else ():
            if not _fits(failed, ask, now):
                continue
            try:
                with transaction.atomic():
                    made = _continue_on(failed, ask, carry, seconds, now)
            except Conflict as exc:  # the node cannot give the GPUs now: the next ask
                log.info("lease %s: ask %s passed over: %s", failed.pk, ask.pk, exc)
                continue
            _settle_state(failed, CONTINUED, now,
                          f"lease {failed.pk} failed on node {failed.node.name} "
                          f"({short_cause(failed)[:80]}) at {_clock(failed.ended_at)}; "
                          f"continued as lease {made.pk} on node {ask.node.name} at "
                          f"{_clock(now)}",
                          {"continuation": made.pk, "node": ask.node_id})
            return CONTINUED
        bid = original_bid(failed)
        if seconds and bid is not None and bid.time_in_force == Order.TimeInForce.GTC \
                and not (bid.expires_at and bid.expires_at <= now):
            rested = _rest(failed, bid, carry, seconds, now)
            if rested is not None:
                return RESTED
        ledger.hold_release(hold_id=carry.pk, cause=f"lease {failed.pk}: no failover")
        why = ("no capacity at or below the lease's price on another node"
               if seconds else "no time left")
        _settle_state(failed, RELEASED, now, f"not continued: {why}; the unused hold "
                      f"({format_usd(carry.amount)} USD) was released", {})
        return RELEASED


#: Lease/Order terms of issue 15's other parts (notice: stop terms; ckpt: the checkpoint
#: store), copied to a continuation / resting bid where the models have them
LATER_TERMS = ("notice_signal", "stop_grace_seconds", "checkpoint", "checkpoint_sealed")


def _later_terms(row, model) -> dict:
    names = {f.name for f in model._meta.get_fields()}
    return {name: getattr(row, name) for name in LATER_TERMS if name in names}


def _continue_on(failed: Lease, ask: Order, carry: Hold, seconds: int,
                 now: datetime) -> Lease:
    """The continuation on `ask`'s node (Conflict when it cannot be made: nothing kept)."""
    cost = lease_cost(ask.price, failed.gpu_count, seconds)
    if cost > carry.amount:  # never: the price is not above the failed lease's
        raise Conflict(f"carry hold {carry.pk} holds less than {cost}")
    bid = original_bid(failed)
    gang = failed.gpu_count if bid is not None and bid.interconnect == "nvlink" else 0
    made = create_lease(
        market=failed.market, buyer_id=failed.buyer_id, provider_id=ask.owner_id,
        node=ask.node, gpus=failed.gpu_count, price=ask.price, duration_seconds=seconds,
        image=failed.image, command=failed.command, now=now, ask=ask,
        cause=f"continues lease {failed.pk} (failed on node {failed.node.name}), ask {ask.pk}",
        hold_id=carry.pk, interruptible=failed.interruptible, ports=failed.ports,
        template=failed.template, min_cuda=failed.min_cuda, port_roles=failed.port_roles,
        ssh=failed.ssh, env=failed.env, secrets_sealed=failed.secrets_sealed,
        nvlink_gang=gang, failover=failed.failover, min_reliability=failed.min_reliability,
        **_later_terms(failed, Lease))
    if cost < carry.amount:
        ledger.hold_reduce(hold_id=carry.pk, to_amount=cost,
                           cause=f"lease {made.pk} continues lease {failed.pk}")
    made.chain_id = failed.chain
    made.continues = failed
    made.save(update_fields=["chain_id", "continues"])
    ask.remaining_gpus -= failed.gpu_count
    status = "filled" if ask.remaining_gpus == 0 else "partially_filled"
    ask.set_status(status, cause=f"lease {made.pk}: {failed.gpu_count} GPUs continue lease "
                   f"{failed.pk}", at=now, update_fields=("remaining_gpus", *locking.touch(ask)))
    log.info("lease %s continued as lease %s on node %s at %s", failed.pk, made.pk,
             ask.node_id, ask.price)
    return made


def _rest(failed: Lease, bid: Order, carry: Hold, seconds: int, now: datetime) -> Order | None:
    """The remaining time as a resting GTC bid at the original limit (book.place_bid), the
    carry hold given back first; None (nothing kept) when the bid cannot be placed."""
    try:
        with transaction.atomic():
            ledger.hold_release(hold_id=carry.pk, cause=f"lease {failed.pk}: resting bid")
            placed = book.place_bid(
                buyer_id=failed.buyer_id, market_slug=failed.market.slug, price=bid.price,
                gpus=failed.gpu_count, duration_seconds=seconds, gang_size=failed.gpu_count,
                time_in_force="GTC", image=failed.image, command=failed.command,
                expires_at=bid.expires_at, interruptible=failed.interruptible,
                ports=failed.ports, template=failed.template, min_cuda=failed.min_cuda,
                port_roles=failed.port_roles, ssh=failed.ssh, env=failed.env,
                secrets=unseal(failed.secrets_sealed), interconnect=bid.interconnect,
                failover=failed.failover, min_reliability=failed.min_reliability,
                avoid_node_id=failed.node_id, now=now)
    except Exception as exc:  # InsufficientFunds, InvalidInput: fall back to a release
        log.warning("lease %s: resting bid not placed: %s", failed.pk, exc)
        return None
    order = placed.order
    later = _later_terms(failed, Order)  # the failed lease's stop terms and checkpoint store
    Order.objects.filter(pk=order.pk).update(continues_lease_id=failed.pk, **later)
    for made in placed.leases:  # it filled at once (an ask the continuation passed over)
        if _later_terms(failed, Lease):
            Lease.objects.filter(pk=made.pk).update(**_later_terms(failed, Lease))
        _chain(made, failed)
    held = Hold.objects.filter(pk=order.hold_id).values_list("amount", flat=True).first()
    _settle_state(failed, RESTED, now,
                  f"lease {failed.pk} failed on node {failed.node.name} at "
                  f"{_clock(failed.ended_at)}; no ask at or below its price: continues as "
                  f"{resting_words(order.pk, bid.price)} (GTC, the remaining {seconds} s; "
                  f"bid {order.pk} holds {format_usd(held or 0)} USD; cancel it to stop)",
                  {"order": order.pk})
    return order


def resting_words(order_id: int, price: int) -> str:
    """"bid 17, resting at $2.500000/GPU-hour": where a rested chain's money is."""
    return f"bid {order_id}, resting at ${format_usd(price)}/GPU-hour"


def _chain(made: Lease, failed: Lease) -> None:
    made.chain_id = failed.chain
    made.continues = failed
    made.save(update_fields=["chain_id", "continues"])


def _settle_state(failed: Lease, state: str, now: datetime, cause: str, detail: dict) -> None:
    failed.failover_state = state
    failed.carry_hold_id = None
    failed.note(cause=cause, at=now, detail={"failover": state, **detail},
                update_fields=("failover_state", "carry_hold_id"))


STOP_WORDS = "stopped by the buyer"


def stop_chain(*, lease: Lease, now: datetime | None = None) -> Lease | None:
    """The buyer stopped failed lease `lease`: stop what its chain goes on as (a pending
    failover called off, the resting bid cancelled, each hold released; a continuation
    not ended is returned for lease_control to end). None when nothing goes on."""
    now = now or timezone.now()
    current = lease
    for _ in range(100):  # a chain is bounded (GPUMARKET_FAILOVER_MAX_CONTINUATIONS)
        current.refresh_from_db()
        if current.status in Lease.ACTIVE:
            return current
        state = current.failover_state
        if state == PENDING and _call_off(current.pk, now):
            return None
        if state == RESTED:
            order = Order.objects.filter(continues_lease_id=current.pk).first()
            if order is not None and order.status in Order.ACTIVE:
                with contextlib.suppress(Conflict):  # filled meanwhile: follow its lease
                    book.cancel_order(user_id=current.buyer_id, order_id=order.pk, now=now,
                                      cause=f"{STOP_WORDS}: lease {lease.pk}'s chain")
        nxt = Lease.objects.filter(continues_id=current.pk).first()
        if nxt is None:
            if current.failover_state == PENDING:
                continue  # it left pending meanwhile: look again
            return None
        current = nxt
    return None


def _call_off(lease_id: int, now: datetime) -> bool:
    """Release a pending failover's carry hold (False: it is no longer pending)."""
    market_id = Lease.objects.values_list("market_id", flat=True).get(pk=lease_id)
    with transaction.atomic():
        locking.lock_market(market_id)
        failed = Lease.objects.select_for_update().get(pk=lease_id)
        if failed.failover_state != PENDING:
            return False
        carry = Hold.objects.select_for_update().get(pk=failed.carry_hold_id)
        ledger.hold_release(hold_id=carry.pk, cause=f"lease {failed.pk}: {STOP_WORDS}")
        _settle_state(failed, RELEASED, now, f"not continued: {STOP_WORDS}; the unused "
                      f"hold ({format_usd(carry.amount)} USD) was released", {})
    return True


def pending_ids(older_than: datetime) -> list[int]:
    """Failed leases still pending failover that ended before `older_than`."""
    return list(Lease.objects.filter(failover_state=PENDING, ended_at__lt=older_than)
                .order_by("pk").values_list("pk", flat=True))


def chain_q(lease: Lease) -> Q:
    return Q(pk=lease.chain) | Q(chain_id=lease.chain)
