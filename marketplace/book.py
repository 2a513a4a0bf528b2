"""Continuous auction services: place and cancel bids and asks, and expire orders, each
matched by the engine (marketplace/engine) under its market's lock (locking.py).

Writers here run as book.py's own writers (`locking.tracked`) and may use the book
cache; fills are written by matching.py, preemptions scheduled by preemption.py.
The checks an order passes first: order_checks.py; the bid's shape and the answer
(BidRequest, Placed): bid_request.py; both re-exported here.
The book cache, the lock and the preemption rule: docs/MATCHING.md."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.db.models.signals import post_save
from django.utils import timezone

from core import metrics
from core.bulk import execute_arrays, insert_all
from marketplace import locking, matching, offers, preemption, runtimes
from marketplace.bid_request import BidRequest, Placed
from marketplace.errors import Conflict, InvalidInput, MarketBusy, NotFound, PermissionDenied
from marketplace.models import GpuClass, Lease, Order
from marketplace.order_checks import (
    CLIENT_ORDER_ID,
    MAX_DURATION_SECONDS,
    MAX_GPUS,
    NVLINK_GANG_OF_ONE,
    MarketFacts,
    check_bid,
    check_client_order_id,
    check_common,
    check_fits_a_node,
    checked_hold_amount,
    free_gpu_count,
    get_market,
    largest_node,
    market_facts,
    node_market,
    require_heartbeating,
)
from marketplace.sealing import same_secrets, seal
from providers import node_images
from providers.models import Node
from settlement import services as ledger
from settlement.models import Hold

log = logging.getLogger("gpumarket.market")
CLIENT_ID_CONSTRAINT = "order_client_id_unique_per_owner"


def _replay(owner_id: int, client_order_id: str | None,
            terms: dict[str, Any], secrets: dict[str, str] | None = None) -> Placed | None:
    """The first order of `owner_id` with `client_order_id`, as a Placed, or None.

    A replay must repeat the first order's `terms` (its field values, by Order attribute;
    `market` by slug): one that differs is a client reusing an id by mistake, refused with
    Conflict naming client_order_id and the first differing field (Stripe's rule for
    idempotency keys, "Idempotent requests": the same key with other parameters is an
    error), so it never believes a different order was placed. `secrets` (a bid's, in
    clear) are compared with what the first order sealed."""
    if client_order_id is None:
        return None
    order = (Order.objects.select_related("market")
             .filter(owner_id=owner_id, client_order_id=client_order_id).first())
    if order is None:
        return None
    for name, wanted in terms.items():
        have = order.market.slug if name == "market" else getattr(order, name)
        if have != wanted:
            raise Conflict(f"'{client_order_id}' was used for order {order.pk} with another "
                           f"{name.removesuffix('_id')}: a replay must repeat its terms",
                           field="client_order_id")
    if order.side == Order.Side.BID and not same_secrets(order.secrets_sealed, secrets or {}):
        raise Conflict(f"'{client_order_id}' was used for order {order.pk} with other "
                       "secrets: a replay must repeat its terms", field="client_order_id")
    leases = list(Lease.objects.filter(Q(fill__bid=order) | Q(fill__ask=order)).order_by("pk"))
    return Placed(order=order, leases=leases, created=False)


def _is_client_id_clash(exc: IntegrityError) -> bool:
    diag = getattr(exc.__cause__, "diag", None)
    if diag is not None:
        return getattr(diag, "constraint_name", None) == CLIENT_ID_CONSTRAINT
    return "client_order_id" in str(exc)  # SQLite names the columns instead


def expire_orders(*, now: datetime | None = None) -> list[int]:
    """Expire every active order past its expires_at (bids) or available_until (asks),
    one market at a time under its lock; returns the ids expired. Safe to run
    concurrently and again: an order already expired is no longer active."""
    now = now or timezone.now()
    market_ids = sorted(set(
        Order.objects.filter(status__in=Order.ACTIVE)
        .filter(matching.past_due(now))
        .values_list("market_id", flat=True)))
    expired: list[int] = []
    for market_id in market_ids:
        with locking.tracked(market_id), transaction.atomic():
            expired += matching.expire_due(locking.lock_market(market_id), now)
    if expired:
        log.info("expired orders %s", expired)
    return expired

def place_bid(bid: BidRequest | None = None, /, *, now: datetime | None = None,
              **fields: Any) -> Placed:
    """Place one bid — `bid`, or the BidRequest its keyword `fields` make: hold its cost,
    match it, rest what is left (GTC) until cancelled, filled or `expires_at`. A resting
    bid schedules the preemption of interruptible leases it outbids (docs/MATCHING.md,
    "Preemption"). Placing a client_order_id again returns the first order
    (created=False) and writes nothing; again with other terms is a Conflict (_replay).
    Raises InvalidInput naming the field, and settlement.InsufficientFunds when the hold
    cannot be placed; in every refusal nothing is written.
    """
    if bid is None:
        bid = BidRequest(**fields)
    elif fields:
        raise TypeError("place_bid takes a BidRequest or its fields, not both")
    result = place_bids([bid], now=now)[0]
    if isinstance(result, Exception):
        raise result
    return result


def place_bids(requests: list[BidRequest], *, now: datetime | None = None,
               fence: locking.Fence | None = None) -> list[Placed | Exception]:
    """Place several bids, each exactly as place_bid would, as if one after the other in
    the order given — but with one transaction, one market lock and a fixed number of
    statements per market for all of them (group commit: the API's order endpoint gathers
    concurrent bids into one call, marketplace/api/bid_batcher.py).

    Returns, per request, its Placed or the exception refusing it (InvalidInput,
    InsufficientFunds, …): a refused bid writes nothing and does not affect the others.
    An unexpected error while writing a group of several bids makes each of them run
    again alone, so that error belongs to the bid that causes it only. A client_order_id
    that appears twice in one call (same buyer) is placed once; the second answers as a
    replay of the first.

    fence: a bid queue consumer's claim (marketplace/api/bid_queue.py): each transaction
    also records the last position of the group it commits (locking.lock_market), and
    raises locking.Fenced, writing nothing, once a later consumer took over.
    """
    now = now or timezone.now()
    results: list[Placed | Exception | None] = [None] * len(requests)
    facts: dict[str, MarketFacts] = {}  # market slug → its facts (one read per call)
    groups: dict[int, list[tuple[int, BidRequest, int]]] = {}
    seen_ids: set[tuple[int, str]] = set()
    again: list[int] = []  # a client_order_id repeated within this call
    for i, r in enumerate(requests):
        try:
            check_client_order_id(r.client_order_id)
            replayed = _replay(r.buyer_id, r.client_order_id, r.terms(), r.secrets)
            if replayed is not None:
                results[i] = replayed
                continue
            if r.client_order_id is not None:
                if (r.buyer_id, r.client_order_id) in seen_ids:
                    again.append(i)
                    continue
                seen_ids.add((r.buyer_id, r.client_order_id))
            if r.market_slug not in facts:
                facts[r.market_slug] = market_facts(r.market_slug)
            f = facts[r.market_slug]
            market = f.market
            hold_amount = check_bid(r, now)
            check_fits_a_node(r, market, f.largest)
            if not r.command and not f.runs_images:  # the image's own command: none runs it
                raise InvalidInput(runtimes.needs_command(f"every node of {market.slug}"),
                                   field="command")
            if r.node is not None:
                offers.check_bid_node(r.node, market, r.gpus if r.gang_size is None
                                      else r.gang_size)
        except Exception as exc:  # each refusal is that bid's answer
            results[i] = exc
            continue
        groups.setdefault(market.pk, []).append((i, r, hold_amount))
    for market_id, items in groups.items():
        for (i, _, _), result in zip(items, _place_group(market_id, items, now, fence),
                                     strict=True):
            results[i] = result
    metrics.order_outcomes("bid", results)  # (the repeated ones count in the call below)
    if again:
        for i, result in zip(again, place_bids([requests[i] for i in again], now=now),
                             strict=True):
            results[i] = result
    return results  # type: ignore[return-value]  (every slot is filled)

def _place_group(market_id: int, items: list[tuple[int, BidRequest, int]],
                 now: datetime, fence: locking.Fence | None = None
                 ) -> list[Placed | Exception]:
    """One market's bids in one transaction; alone again when the group fails."""
    through = max(fence.positions[i] for i, _, _ in items) if fence else None
    try:
        with locking.tracked(market_id), transaction.atomic():
            return _write_bids(market_id, [(r, amount) for _, r, amount in items], now,
                               fence, through)
    except _Regroup:
        return [_place_group(market_id, [item], now, fence)[0] for item in items]
    except MarketBusy as exc:  # every bid of the group waited: none is placed
        return [exc] * len(items)
    except locking.Fenced:
        raise
    except Exception as exc:
        if len(items) > 1:
            log.warning("a group of %d bids failed (%r); placing them one by one",
                        len(items), exc)
            return [_place_group(market_id, [item], now, fence)[0] for item in items]
        r = items[0][1]
        # the same client_order_id raced in from another request (possibly another
        # market): that one committed first and stands
        if isinstance(exc, IntegrityError) and _is_client_id_clash(exc):
            try:
                replayed = _replay(r.buyer_id, r.client_order_id, r.terms(), r.secrets)
            except Conflict as conflict:
                return [conflict]
            if replayed is not None:
                return [replayed]
        return [exc]


@metrics.timed_group
def _write_bids(market_id: int, items: list[tuple[BidRequest, int]], now: datetime,
                fence: locking.Fence | None = None,
                through: int | None = None) -> list[Placed | Exception]:
    """Under the market lock: insert the orders (of bids check_bid passed), hold their
    cost (one statement each for all of them), then match them one by one in the given
    order. With a `fence`, first record the group committed `through` that position."""
    market = locking.lock_market(market_id, fence=fence, through=through)  # (and its fence)
    anything_due, victims_possible = _group_flags(market.pk, now)
    if anything_due:
        matching.expire_due(market, now)
        victims_possible = preemption.candidates_exist(market)
    book = locking.load_book(market)  # before the new orders exist: each is submitted below
    orders = []
    for r, _ in items:
        order = Order(**{**r.terms(), "market": market}, owner_id=r.buyer_id,
                      remaining_gpus=r.gpus, client_order_id=r.client_order_id or "",
                      secrets_sealed=seal(r.secrets or {}),
                      checkpoint_sealed=r.checkpoint.sealed() if r.checkpoint else "")
        locking.touch(order)
        orders.append(order)
    orders = insert_all(orders)
    holds = ledger.holds_place_many([(o.owner_id, amount, f"order:{o.pk}")
                                     for o, (_, amount) in zip(orders, items, strict=True)])
    refused = [o.pk for o, h in zip(orders, holds, strict=True) if not isinstance(h, Hold)]
    if refused:
        Order.objects.filter(pk__in=refused).delete()
    placed = [o for o, h in zip(orders, holds, strict=True) if isinstance(h, Hold)]
    for order, hold in zip(placed, [h for h in holds if isinstance(h, Hold)], strict=True):
        order.hold_id = hold.pk
    if placed:
        _set_hold_ids(placed)
        insert_all([o.created_event(cause="bid placed", at=now) for o in placed])
    leases_of: dict[int, list[Lease]] = {}
    holding: dict[str, frozenset[int]] = {}  # image → nodes holding it (preferring bids)
    for order in placed:
        bid = locking.engine_bid(order)
        if order.prefer_cached_image and order.image:
            if order.image not in holding:
                holding[order.image] = frozenset(node_images.nodes_holding(order.image))
            bid.prefer = holding[order.image]
        result = book.submit_bid(bid, locking.epoch(now))
        leases: list[Lease] = []
        if result.fills or result.killed or result.self_trade_cancels or not result.rested:
            leases = matching.apply_result(market, order, result, now)
            victims_possible = victims_possible or any(x.interruptible for x in leases)
        if any(x.interruptible for x in leases):
            preemption.reconsider_preemptions(market.pk, now, through_bid=order.pk)  # `order` too
        elif victims_possible and order.status in Order.ACTIVE and order.remaining_gpus > 0:
            preemption.schedule_preemption(market, order, now)
        leases_of[order.pk] = leases
    # A hold is refused before any bid is matched, but one by one, an earlier bid of the
    # same buyer that filled (its hold moved to the lease at the trade price, never more)
    # or was cancelled would have given money back first: then place them one by one.
    released = {o.owner_id for o in placed if o.status != "open"}
    if any(o.owner_id in released for o, h in zip(orders, holds, strict=True)
           if not isinstance(h, Hold)):
        raise _Regroup
    using = Order.objects.db
    for order in placed:
        post_save.send(sender=Order, instance=order, created=True, raw=False, using=using,
                       update_fields=None)
    return [Placed(order=o, leases=leases_of[o.pk]) if isinstance(h, Hold) else h
            for o, h in zip(orders, holds, strict=True)]


class _Regroup(Exception):
    """Roll the group back and place its bids one by one (see _write_bids)."""


def _set_hold_ids(orders: list[Order]) -> None:
    """Save each order's hold_id, in one UPDATE (arrays on PostgreSQL: Django's
    bulk_update builds an expression object per row, which dominated a group's cost)."""
    connection = transaction.get_connection()
    if connection.vendor != "postgresql":
        Order.objects.bulk_update(orders, ["hold_id"])
        return
    execute_arrays(connection,
                   'UPDATE "marketplace_order" SET "hold_id" = h.hold_id FROM '
                   'unnest(%s::bigint[], %s::bigint[]) AS h(id, hold_id) '
                   'WHERE "marketplace_order"."id" = h.id',
                   [[o.pk for o in orders], [o.hold_id for o in orders]])


def _group_flags(market_id: int, now: datetime) -> tuple[bool, bool]:
    """(any active order of the market past its time, any lease of it preemptible at all)
    in one round trip: the two questions every group of bids asks under the lock, almost
    always answered no (then expire_due's and the preemption search's ORM queries are
    skipped). The same conditions as past_due and candidates_exist."""
    orders, leases = Order._meta.db_table, Lease._meta.db_table
    # the states and the side are written into the statement, not bound, so that the
    # planner sees the partial indexes' predicates (also in a generic plan)
    active = ", ".join(f"'{v}'" for v in Order.ACTIVE)
    unended = ", ".join(f"'{v}'" for v in Lease.ACTIVE)
    sql = (f'SELECT EXISTS (SELECT 1 FROM "{orders}" WHERE "market_id" = %s '  # noqa: S608
           f'AND "status" IN ({active}) AND ("expires_at" <= %s '
           f"OR (\"side\" = '{Order.Side.ASK}' AND \"available_until\" <= %s))), "
           f'EXISTS (SELECT 1 FROM "{leases}" WHERE "market_id" = %s AND "interruptible" '
           f'AND "status" IN ({unended}) AND "preempt_at" IS NULL AND "ask_id" IS NOT NULL)')
    params = [market_id, now, now, market_id]
    with transaction.get_connection().cursor() as cursor:
        cursor.execute(sql, params)
        due, preemptible = cursor.fetchone()
    return bool(due), bool(preemptible)


@metrics.counted_ask
def place_ask(*, provider_id: int, node_id: int, market_slug: str | None, price: int,
              gpus: int, available_until: datetime, client_order_id: str | None = None,
              now: datetime | None = None) -> Placed:
    """Offer `gpus` GPUs of a node at `price` micro-USD per GPU-hour until
    `available_until` (then it expires), matching resting bids at their prices.

    client_order_id: as for place_bid. Raises NotFound/PermissionDenied for a node that
    is not the provider's, and InvalidInput naming the field for more GPUs than are free
    or a past window.
    """
    now = now or timezone.now()
    check_client_order_id(client_order_id)
    terms = {"side": Order.Side.ASK, "node_id": node_id, "price": price, "gpus": gpus,
             "available_until": available_until}
    if market_slug is not None:  # (None: the node's only class)
        terms["market"] = market_slug
    replayed = _replay(provider_id, client_order_id, terms)
    if replayed is not None:
        return replayed
    try:
        node = Node.objects.select_related("provider").get(pk=node_id)
    except Node.DoesNotExist:
        raise NotFound(f"no node {node_id}", field="node") from None
    if node.provider.user_id != provider_id:
        raise PermissionDenied("that node is not yours", field="node")
    if node.retired_at is not None:
        raise Conflict(f"node {node.name} is retired: it takes no asks", field="node")
    market = node_market(node, market_slug)
    check_common(price=price, gpus=gpus)
    if available_until <= now:
        raise InvalidInput("must be in the future", field="available_until")
    try:
        with locking.tracked(market.pk), transaction.atomic():
            market = locking.lock_market(market.pk)
            matching.expire_due(market, now)
            if Node.objects.filter(pk=node.pk, retired_at__isnull=False).exists():
                raise Conflict(f"node {node.name} is retired: it takes no asks", field="node")
            free = free_gpu_count(node, market)
            if gpus > free:
                raise InvalidInput(f"only {free} GPUs of node {node.name} are free to offer",
                                   field="gpus")
            order = Order(
                market=market, owner_id=provider_id, side=Order.Side.ASK, price=price,
                gpus=gpus, remaining_gpus=gpus, node=node, available_until=available_until,
                client_order_id=client_order_id or "",
            )
            locking.touch(order)
            order.save(force_insert=True)
            order.created(cause="ask placed", at=now)
            book = locking.load_book(market, exclude=order.pk)
            result = book.submit_ask(locking.engine_ask(order), locking.epoch(now))
            leases = matching.apply_result(market, order, result, now)
            if any(x.interruptible for x in leases):
                preemption.reconsider_preemptions(market.pk, now)
    except IntegrityError as exc:
        replayed = (_replay(provider_id, client_order_id, terms) if _is_client_id_clash(exc)
                    else None)
        if replayed is None:
            raise
        return replayed
    return Placed(order=order, leases=leases)


def cancel_order(*, user_id: int, order_id: int, cause: str = "cancelled by its owner",
                 now: datetime | None = None) -> Order:
    """Cancel an open or partially filled order of `user_id`, releasing a bid's hold and
    calling off at once the preemptions scheduled for it. An ask whose GPUs are all
    leased (`filled`, window still open) can be withdrawn too: its leases run on, and
    their GPUs no longer come back to the market when they end.
    Raises NotFound (also for another user's order) or Conflict when already closed."""
    order = Order.objects.filter(pk=order_id, owner_id=user_id).first()
    if order is None:
        raise NotFound(f"no order {order_id} of yours", field="order")
    now = now or timezone.now()
    with locking.tracked(order.market_id), transaction.atomic():
        locking.lock_market(order.market_id)
        order = Order.objects.get(pk=order_id)
        standing_ask = (order.side == Order.Side.ASK and order.status == "filled"
                        and order.available_until > now)
        if order.status not in Order.ACTIVE and not standing_ask:
            raise Conflict(f"order {order_id} is already {order.status}")
        if standing_ask:
            cause = f"{cause}: its leased GPUs stay off the market when their leases end"
        matching.close_order(order, "cancelled", cause, now)
        if order.side == Order.Side.BID:
            preemption.call_off_preemptions(order, now)
    return order


def depth(market: GpuClass, levels: int = 20, *,
          now: datetime | None = None) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Order book depth: (bids high→low, asks low→high) as (price, GPUs) per level —
    the engine's OrderBook.depth of the resting orders not past their time at `now`,
    aggregated by the database (no book is loaded). One statement per side, each read
    from the partial index order_book_depth alone as far as the `levels` nearest the
    spread reach: its cost grows with the orders in those levels, not the book's size
    (docs/MATCHING.md, "Depth")."""
    if levels <= 0:
        return [], []
    now = now or timezone.now()
    # the states are written into the statement, not bound, so that the planner sees the
    # partial index's predicate (as in _group_flags)
    active = ", ".join(f"'{v}'" for v in Order.ACTIVE)
    table = Order._meta.db_table

    def side(name: str, direction: str) -> list[tuple[int, int]]:
        sql = (f'SELECT "price", SUM("remaining_gpus") FROM "{table}" '  # noqa: S608
               f"WHERE \"market_id\" = %s AND \"side\" = '{name}' "
               f'AND "status" IN ({active}) AND "remaining_gpus" > 0 '
               f'AND ("expires_at" IS NULL OR "expires_at" > %s) '
               f'AND ("available_until" IS NULL OR "available_until" > %s) '
               f'GROUP BY "price" ORDER BY "price" {direction} LIMIT %s')
        connection = transaction.get_connection()
        at = connection.ops.adapt_datetimefield_value(now)  # (SQLite: its stored text)
        with connection.cursor() as cursor:
            cursor.execute(sql, [market.pk, at, at, levels])
            return [(int(price), int(gpus)) for price, gpus in cursor.fetchall()]

    return side(Order.Side.BID, "DESC"), side(Order.Side.ASK, "ASC")


__all__ = ["CLIENT_ORDER_ID", "MAX_DURATION_SECONDS", "MAX_GPUS", "NVLINK_GANG_OF_ONE",
           "BidRequest", "Placed", "cancel_order", "checked_hold_amount", "depth",
           "expire_orders", "free_gpu_count", "get_market", "largest_node", "node_market",
           "place_ask", "place_bid", "place_bids", "require_heartbeating"]
