"""Sealed-bid auctions: a provider's lot of one node's GPUs for a fixed duration.

Bids are secret until close: every read path outside this module goes through
marketplace/selectors.py (`visible_bids`), which shows a bid's price and quantity only
to its bidder before close. Closing runs exactly once: the auction row is locked and a
closed auction is left alone, whatever the number of workers and retries.
Clearing rules live in marketplace/engine/sealed.py.
"""

from __future__ import annotations

import logging
from datetime import datetime

from celery import current_app
from django.db import transaction
from django.utils import timezone

from core import metrics
from marketplace import engine, interconnect
from marketplace.checkpoints import Checkpoint
from marketplace.env_templates import check_terms, cuda_ok
from marketplace.errors import Conflict, InvalidInput, NotFound, PermissionDenied
from marketplace.lease_notice import check_stop_terms
from marketplace.leases import create_lease
from marketplace.locking import lock_market
from marketplace.models import Auction, Interconnect, Order, SealedBid
from marketplace.order_checks import (
    MAX_DURATION_SECONDS,
    NVLINK_GANG_OF_ONE,
    checked_hold_amount,
    free_gpu_count,
    node_market,
)
from marketplace.ports import clean_port_roles, clean_ports, with_ssh
from marketplace.runtimes import can_run, needs_command
from marketplace.sealing import seal
from marketplace.ssh_keys import require_key
from marketplace.workload_env import clean_env_and_secrets
from providers.models import Node
from settlement import bulk as ledger_bulk
from settlement import services as ledger
from settlement.money import format_usd, lease_cost
from webhooks import events as webhooks

log = logging.getLogger("gpumarket.auctions")

CLOSE_TASK = "marketplace.tasks.close_auction"  # tasks.close_auction_task


def open_auction(*, provider_id: int, node_id: int, gpus: int, reserve_price: int,
                 duration_seconds: int, closes_at: datetime, opens_at: datetime | None = None,
                 rule: str = Auction.Rule.SECOND_PRICE, market_slug: str | None = None,
                 now: datetime | None = None) -> Auction:
    """Open a sealed-bid auction of `gpus` GPUs of the provider's node.

    reserve_price: micro-USD per GPU-hour; duration_seconds: the lease each winner gets.
    Raises NotFound/PermissionDenied for a node not the provider's; InvalidInput naming
    the field for GPUs not free, a non-positive reserve or duration, or closes_at not in
    the future. The closing task is scheduled after commit.
    """
    now = now or timezone.now()
    opens_at = opens_at or now
    node = Node.objects.select_related("provider").filter(pk=node_id).first()
    if node is None:
        raise NotFound(f"no node {node_id}", field="node")
    if node.provider.user_id != provider_id:
        raise PermissionDenied("that node is not yours", field="node")
    if node.retired_at is not None:
        raise Conflict(f"node {node.name} is retired: it takes no auctions", field="node")
    market = node_market(node, market_slug)
    if rule not in Auction.Rule.values:
        raise InvalidInput("must be second_price, uniform_price or first_price", field="rule")
    if reserve_price <= 0:
        raise InvalidInput("must be greater than zero", field="reserve_price")
    if gpus > 0:
        try:
            checked_hold_amount(price=reserve_price, gpus=gpus,
                                duration_seconds=max(duration_seconds, 1))
        except InvalidInput as exc:
            raise InvalidInput(exc.message, field="reserve_price") from None
    if gpus <= 0:
        raise InvalidInput("must be at least 1", field="gpus")
    if not 0 < duration_seconds <= MAX_DURATION_SECONDS:
        raise InvalidInput("must be between 1 second and 366 days", field="hours")
    if closes_at <= now or closes_at <= opens_at:
        raise InvalidInput("must be in the future and after opens_at", field="closes_at")
    with transaction.atomic():
        market = lock_market(market.pk, orders_unchanged=True)  # (an auction is no order)
        if Node.objects.filter(pk=node.pk, retired_at__isnull=False).exists():
            raise Conflict(f"node {node.name} is retired: it takes no auctions", field="node")
        free = free_gpu_count(node, market)
        if gpus > free:
            raise InvalidInput(f"only {free} GPUs of node {node.name} are free"
                               + _covered(node, market), field="gpus")
        auction = Auction.objects.create(
            market=market, provider_id=provider_id, node=node, gpus=gpus,
            reserve_price=reserve_price, rule=rule, duration_seconds=duration_seconds,
            opens_at=opens_at, closes_at=closes_at,
        )
        auction.created(cause="auction opened", at=now)
        transaction.on_commit(lambda: _schedule_close(auction.pk, closes_at))
    return auction


def _covered(node, market) -> str:
    """": 8 are in ask 3 (cancel it to free them)" — where the node's other GPUs are
    offered (standing asks, open auctions), "" when none is."""
    asks = list(Order.objects.filter(node=node, market=market, side=Order.Side.ASK,
                                     status__in=Order.ACTIVE)
                .order_by("pk").values_list("pk", "remaining_gpus"))
    lots = list(node.auctions.filter(status="open", market=market).order_by("pk")
                .values_list("pk", "gpus"))
    parts = [f"{n} in ask {pk}" for pk, n in asks] + [f"{n} in auction {pk}"
                                                     for pk, n in lots]
    if not parts:
        return ""
    what = "cancel it" if len(parts) == 1 else "cancel one"
    return f": {', '.join(parts)} ({what} to free them)"


def _schedule_close(auction_id: int, closes_at: datetime) -> None:
    """Queue the close task by its name (marketplace/tasks.py imports this module, not the
    other way round): the worker runs it at closes_at."""
    try:
        current_app.signature(CLOSE_TASK, args=(auction_id,)).apply_async(eta=closes_at)
    except Exception:  # broker down: the beat sweep (close_due_auctions) closes it
        log.warning("could not schedule the close of auction %s; the sweep will", auction_id)


def place_sealed_bid(*, bidder_id: int, auction_id: int, price: int, gpus: int | None = None,
                     min_gpus: int | None = None, image: str = "",
                     command: list[str] | None = None, ports: list[int] | None = None,
                     template: str = "", min_cuda: str = "",
                     port_roles: dict[str, str] | None = None, ssh: bool = False,
                     env: dict[str, str] | None = None, secrets: dict[str, str] | None = None,
                     interconnect: str = Interconnect.ANY,
                     checkpoint: Checkpoint | None = None, failover: bool = True,
                     min_reliability=None, notice_signal: str = "",
                     stop_grace_seconds: int = 10,
                     now: datetime | None = None) -> SealedBid:
    """Place (or replace) the bidder's sealed bid, holding price × gpus × hours.

    Under second_price a bid is for the whole lot (gpus defaults to the lot size).
    Raises NotFound, PermissionDenied (the lot's own provider), Conflict (before open or
    after close) and InvalidInput (below the reserve, more GPUs than the lot) — the
    messages never mention other bids. settlement.InsufficientFunds when the hold fails.
    ports: container TCP ports the lease exposes to the buyer (ports.clean_ports);
    template, min_cuda: as env_templates.resolve returns them (a lot on a node below
    min_cuda refuses the bid: Conflict naming min_cuda); command: None runs the image's own
    command, which a lot on a process-only node refuses (InvalidInput naming command,
    runtimes.py); port_roles: their roles
    (ports.clean_port_roles); ssh: the lease gets the bidder's SSH keys and port 22
    (ports.with_ssh); env, secrets: the workload's variables (workload_env), the secrets
    sealed with the bid (sealing.py); checkpoint: the store its lease uploads to
    (checkpoints.Checkpoint, probed by the API), credentials sealed. interconnect:
    "nvlink" — the GPUs won must all be NVLink-connected (InvalidInput naming it for 1
    GPU, or a node whose GPUs hold no such
    set of min_gpus; at close, an award the node cannot connect any more is lost:
    docs/MATCHING.md, "Interconnect"). The bid's `replaced_bid_id` (not stored): the id of
    the bidder's earlier active bid on this auction that it replaced (withdrawn, its hold
    released), or None. notice_signal, stop_grace_seconds: the lease's stop terms
    (lease_notice.check_stop_terms: InvalidInput naming the field).
    """
    check_stop_terms(notice_signal, stop_grace_seconds)
    if interconnect not in Interconnect.values:
        raise InvalidInput("must be any or nvlink", field="interconnect")
    now = now or timezone.now()
    ports, port_roles = with_ssh(ports, port_roles, ssh)
    ports = clean_ports(ports)
    check_terms(ports=ports, port_roles=port_roles, min_cuda=min_cuda, env=env)
    port_roles = clean_port_roles(port_roles, ports)
    env, secrets = clean_env_and_secrets(env, secrets)
    with transaction.atomic():
        auction = (Auction.objects.select_for_update(of=("self",)).select_related("node")
                   .filter(pk=auction_id).first())
        if auction is None:
            raise NotFound(f"no auction {auction_id}", field="auction")
        if not cuda_ok(auction.node.cuda_version, min_cuda):
            raise Conflict(f"auction {auction.pk}'s node reports CUDA "
                           f"{auction.node.cuda_version or 'unknown'}, below the {min_cuda} "
                           "this bid needs", field="min_cuda")
        if not can_run(auction.node.runtime, command):
            raise InvalidInput(needs_command(f"auction {auction.pk}'s node"), field="command")
        have = auction.node.reliability
        if min_reliability is not None and have is not None and have < min_reliability:
            raise Conflict(f"auction {auction.pk}'s node is {have} reliable over 30 days, "
                           f"below the {min_reliability} this bid needs",
                           field="min_reliability")
        if auction.provider_id == bidder_id:
            raise PermissionDenied("you cannot bid on your own auction", field="auction")
        if auction.status != Auction.Status.OPEN or now >= auction.closes_at:
            raise Conflict("this auction is closed", field="auction")
        if now < auction.opens_at:
            raise Conflict("this auction is not open yet", field="auction")
        gpus = auction.gpus if gpus is None else gpus
        if auction.rule == Auction.Rule.SECOND_PRICE and gpus != auction.gpus:
            raise InvalidInput(f"a second_price lot is all {auction.gpus} "
                               f"GPU{'' if auction.gpus == 1 else 's'}", field="gpus")
        if not 0 < gpus <= auction.gpus:
            raise InvalidInput(f"must be between 1 and the lot's {auction.gpus} GPUs",
                               field="gpus")
        min_gpus = gpus if min_gpus is None else min_gpus
        if not 0 < min_gpus <= gpus:
            raise InvalidInput("must be between 1 and gpus", field="min_gpus")
        if price < auction.reserve_price:
            raise InvalidInput("is below the reserve price", field="price")
        if interconnect == Interconnect.NVLINK:
            if gpus == 1:
                raise InvalidInput(NVLINK_GANG_OF_ONE, field="interconnect")
            if not interconnect_possible(auction, min_gpus):
                raise InvalidInput(f"this lot's node has no {min_gpus} GPUs all "
                                   "NVLink-connected", field="interconnect")
        require_key(bidder_id, ssh)
        hold_amount = checked_hold_amount(price=price, gpus=gpus,
                                          duration_seconds=auction.duration_seconds)
        previous = SealedBid.objects.filter(auction=auction, bidder_id=bidder_id,
                                            status=SealedBid.Status.ACTIVE).first()
        if previous is not None:
            _withdraw(previous, cause="replaced by a new bid")
        bid = SealedBid(auction=auction, bidder_id=bidder_id, price=price, gpus=gpus,
                        min_gpus=min_gpus, image=image, command=command, ports=ports,
                        template=template, min_cuda=min_cuda, port_roles=port_roles,
                        ssh=ssh, env=env, secrets_sealed=seal(secrets),
                        checkpoint=dict(checkpoint.terms) if checkpoint else {},
                        checkpoint_sealed=checkpoint.sealed() if checkpoint else "",
                        interconnect=interconnect, failover=failover,
                        min_reliability=min_reliability, notice_signal=notice_signal,
                        stop_grace_seconds=stop_grace_seconds, hold_id=0)
        hold = ledger.hold_place(buyer_id=bidder_id, amount=hold_amount,
                                 reference=f"auction:{auction.pk}")
        bid.hold_id = hold.pk
        bid.save()
    bid.replaced_bid_id = previous.pk if previous is not None else None
    return bid


def _withdraw(bid: SealedBid, *, cause: str) -> None:
    ledger.hold_release(hold_id=bid.hold_id, cause=cause)
    bid.set_status(SealedBid.Status.WITHDRAWN, cause=cause)


def withdraw_sealed_bid(*, bidder_id: int, bid_id: int, now: datetime | None = None) -> SealedBid:
    """Withdraw the bidder's active bid before close, releasing its hold."""
    now = now or timezone.now()
    with transaction.atomic():
        bid = SealedBid.objects.filter(pk=bid_id, bidder_id=bidder_id).first()
        if bid is None:
            raise NotFound(f"no sealed bid {bid_id} of yours", field="bid")
        auction = Auction.objects.select_for_update().get(pk=bid.auction_id)
        bid.refresh_from_db()
        if auction.status != Auction.Status.OPEN or now >= auction.closes_at:
            raise Conflict("this auction is closed", field="auction")
        if bid.status != SealedBid.Status.ACTIVE:
            raise Conflict(f"this bid is already {bid.status}")
        _withdraw(bid, cause="withdrawn by the bidder")
    return bid


def close_auction(*, auction_id: int, now: datetime | None = None) -> Auction | None:
    """Clear the auction at or after closes_at, exactly once.

    Winners get a lease each at the price the rule sets; their holds are cut to that
    cost; losers' holds are released (set-based: _lose_all) — all in this one
    transaction. Returns None when
    the auction is not due yet or already closed (a retried task changes nothing).
    """
    now = now or timezone.now()
    market_id = Auction.objects.filter(pk=auction_id).values_list("market_id", flat=True).first()
    if market_id is None:
        return None
    with transaction.atomic():
        lock_market(market_id, orders_unchanged=True)  # its leases are on no ask's GPUs
        auction = Auction.objects.select_for_update().get(pk=auction_id)
        if auction.status != Auction.Status.OPEN or now < auction.closes_at:
            return None
        # what a loser needs (the rest is read for the winners below: 10,000 bids' JSON
        # terms cost ~0.3 s of CPU to load, bench/README.md "Sealed close")
        bids = list(auction.bids.filter(status=SealedBid.Status.ACTIVE).order_by("pk")
                    .defer(*_WINNER_ONLY))
        lost: list[tuple[SealedBid, str, str]] = []  # (bid, cause, its webhook's cause)
        cuda = auction.node.cuda_version  # it may have changed since a bid was placed
        runtime = auction.node.runtime  # so may its runtime (runtimes.py)
        eligible = []
        for bid in bids:
            if not cuda_ok(cuda, bid.min_cuda):
                cause = (f"auction {auction.pk} lost: its node reports CUDA "
                         f"{cuda or 'unknown'}, below the bid's {bid.min_cuda}")
                lost.append((bid, cause, cause))
            elif not can_run(runtime, bid.command):
                cause = (f"auction {auction.pk} lost: its node runs local processes only "
                         "(--runtime process) and the bid gives no command")
                lost.append((bid, cause, cause))
            else:
                eligible.append(bid)
        bids = eligible
        clearing = engine.clear(
            auction.rule,
            [engine.SealedBid(id=b.pk, owner=b.bidder_id, price=b.price, gpus=b.gpus,
                              min_gpus=b.min_gpus, seq=b.pk) for b in bids],
            lot_gpus=auction.gpus, reserve=auction.reserve_price,
        )
        awards = {a.bid_id: a for a in clearing.awards}
        whole = SealedBid.objects.in_bulk(list(awards))  # the winners' every term
        # NVLink winners pick their connected GPUs first; one the node cannot connect loses
        for bid in sorted(bids, key=lambda b: (b.interconnect != Interconnect.NVLINK, b.pk)):
            award = awards.get(bid.pk)
            nvlink = bid.interconnect == Interconnect.NVLINK and award is not None
            if nvlink and interconnect.pick(auction.node_id, auction.market_id, award.gpus,
                                            award.gpus) is None:
                awards.pop(bid.pk)
                award = None
                log.warning("auction %s: bid %s won %s GPUs the node cannot connect over "
                            "NVLink any more; it loses", auction.pk, bid.pk, bid.gpus)
            if award is None:
                lost.append((bid, f"auction {auction.pk} lost", "lost"))
                continue
            bid = whole[bid.pk]
            cost = lease_cost(award.price, award.gpus, auction.duration_seconds)
            ledger.hold_reduce(hold_id=bid.hold_id, to_amount=cost,
                               cause=f"auction {auction.pk} won at {_per_gpu_hour(award.price)}")
            bid.awarded_gpus = award.gpus
            bid.paid_price = award.price
            bid.set_status(SealedBid.Status.WON, cause=f"auction {auction.pk} won", at=now,
                           update_fields=("awarded_gpus", "paid_price"))
            webhooks.emit(bid.bidder_id, "auction.won", _bid_event(auction, bid, "won"))
            metrics.fill(auction.market.slug, "sealed", award.gpus, auction.duration_seconds)
            create_lease(
                market=auction.market, buyer_id=bid.bidder_id, provider_id=auction.provider_id,
                node=auction.node, gpus=award.gpus, price=award.price,
                duration_seconds=auction.duration_seconds, image=bid.image,
                command=bid.command, ports=bid.ports, now=now, sealed_bid=bid,
                template=bid.template, min_cuda=bid.min_cuda, port_roles=bid.port_roles,
                ssh=bid.ssh, env=bid.env, secrets_sealed=bid.secrets_sealed,
                notice_signal=bid.notice_signal, stop_grace_seconds=bid.stop_grace_seconds,
                checkpoint=bid.checkpoint, checkpoint_sealed=bid.checkpoint_sealed,
                hold_id=bid.hold_id, nvlink_gang=award.gpus if nvlink else 0,
                failover=bid.failover, min_reliability=bid.min_reliability,
                cause=f"won auction {auction.pk} ({auction.rule}) at "
                      f"{_per_gpu_hour(award.price)}",
            )
        _lose_all(auction, lost, now)
        auction.clearing_price = clearing.clearing_price
        auction.closed_at = now
        winners = [f"bid {a.bid_id}: {a.gpus} GPUs at {_per_gpu_hour(a.price)}"
                   for a in clearing.awards if a.bid_id in awards]
        auction.set_status("closed", cause=f"closed with {len(bids)} bids", at=now,
                           detail={"awards": winners},
                           update_fields=("clearing_price", "closed_at"))
    log.info("auction %s closed: %s bids, clearing price %s, winners %s", auction.pk,
             len(bids), clearing.clearing_price, winners)
    return auction


# SealedBid fields only a winner's lease reads (close_auction defers them for the rest)
_WINNER_ONLY = ("image", "ports", "port_roles", "env", "secrets_sealed", "checkpoint",
                "checkpoint_sealed", "template", "notice_signal", "stop_grace_seconds",
                "failover", "min_reliability", "ssh")


def _lose_all(auction: Auction, lost: list[tuple[SealedBid, str, str]],
              now: datetime) -> None:
    """The losers of a close, set-based (bench/README.md "Sealed close"): their holds
    released (settlement.bulk.holds_release_many), their bids `lost`, their
    `auction.lost` webhooks — each as hold_release, set_status and emit one by one
    would write them, in a fixed number of statements."""
    if not lost:
        return
    ledger_bulk.holds_release_many([(bid.hold_id, cause) for bid, cause, _ in lost])
    SealedBid.set_status_many([bid for bid, _, _ in lost], SealedBid.Status.LOST,
                              causes=[cause for _, cause, _ in lost], at=now)
    webhooks.emit_many([(bid.bidder_id, "auction.lost", _bid_event(auction, bid, said))
                        for bid, _, said in lost])


def _bid_event(auction: Auction, bid: SealedBid, cause: str) -> dict:
    """A sealed bid's webhook payload at close (its own bid only: no other bid's content)."""
    return {"auction": auction.pk, "sealed_bid": bid.pk, "status": bid.status,
            "cause": cause[:300], "gpus": bid.awarded_gpus or 0,
            "price_usd_micros": bid.paid_price}


def interconnect_possible(auction: Auction, gpus: int) -> bool:
    """Whether the lot's node has `gpus` healthy GPUs of the class all NVLink-connected."""
    return interconnect.can_connect(auction.node_id, auction.market_id, gpus)


def _per_gpu_hour(micros: int) -> str:
    """A price for people: "0.350000 USD/GPU-hour" (never raw micro-USD)."""
    return f"{format_usd(micros)} USD/GPU-hour"


def due_auction_ids(now: datetime | None = None) -> list[int]:
    now = now or timezone.now()
    return list(Auction.objects.filter(status=Auction.Status.OPEN, closes_at__lte=now)
                .values_list("pk", flat=True))


__all__ = ["close_auction", "open_auction", "place_sealed_bid", "withdraw_sealed_bid"]
