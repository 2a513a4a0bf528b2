"""The state machines (marketplace/states.py): every event row goes through them —
`created()` / `created_event()` for a new row, `set_status()` for a move, `note()` for an
event that is no move — and a sealed bid's moves follow its transition table."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from marketplace import auctions, book
from marketplace.errors import Conflict
from marketplace.models import Lease, Order, SealedBid
from marketplace.states import IllegalTransition
from tests.factories import RTX4090_DUMP, funded_buyer, in_a_day, registered_node

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
# an event row written beside the machine: a related manager's create/model, an event
# model's own constructor or its manager's writes (reads, e.g. checkpoint_reports.by_lease,
# are fine)
BY_HAND = re.compile(r"\.events\.(create|model|bulk_create)\b"
                     r"|(?<!class )\b(Order|Auction|Lease)Event(\(|\.objects\."
                     r"(create|bulk_create|get_or_create|update_or_create|update)\b)")


def test_no_event_row_is_written_beside_the_state_machine():
    offenders = []
    for path in sorted((ROOT / "marketplace").rglob("*.py")):
        if "migrations" in path.parts or path.name == "states.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if BY_HAND.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []


def _ask(gpus: int = 8):
    provider, node, _ = registered_node()
    return book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug="h100-sxm-80gb",
                          price=2_000_000, gpus=gpus, available_until=in_a_day()).order


def test_created_records_from_nothing_to_the_initial_state_and_refuses_any_other():
    ask = _ask()
    [ev] = ask.events.all()
    assert (ev.from_status, ev.to_status, ev.cause) == ("", "open", "ask placed")
    at = timezone.now() - timedelta(seconds=5)
    unsaved = ask.created_event(cause="x" * 250, at=at, detail={"k": 1})
    assert unsaved.pk is None and unsaved.order_id == ask.pk
    assert (unsaved.from_status, unsaved.to_status, unsaved.at, unsaved.detail) == (
        "", "open", at, {"k": 1})
    assert len(unsaved.cause) == 200  # as set_status: the column's length
    ask.set_status("cancelled", cause="test")
    with pytest.raises(IllegalTransition, match="is cancelled, not its initial state open"):
        ask.created(cause="again")
    assert ask.events.count() == 2


def test_moved_event_moves_in_memory_chains_and_refuses_an_illegal_move():
    ask = _ask()
    at = timezone.now()
    first = ask.moved_event("partially_filled", cause="fill 1", at=at, detail={"k": 1})
    second = ask.moved_event("filled", cause="fill 2", at=at)
    assert first.pk is None and first.order_id == ask.pk
    assert [(e.from_status, e.to_status, e.cause, e.detail) for e in (first, second)] == [
        ("open", "partially_filled", "fill 1", {"k": 1}), ("partially_filled", "filled",
                                                          "fill 2", {})]
    assert ask.status == "filled" and Order.objects.get(pk=ask.pk).status == "open"  # unsaved
    with pytest.raises(IllegalTransition, match="cannot move from filled to expired"):
        ask.moved_event("expired", cause="x")
    assert ask.status == "filled" and ask.events.count() == 1  # only "ask placed"


def test_note_records_an_event_in_the_same_state_and_saves_its_fields():
    ask = _ask()
    at = timezone.now()
    ask.remaining_gpus = 5
    ask.note(cause="3 GPUs withdrawn: unhealthy", at=at, update_fields=("remaining_gpus",))
    ev = ask.events.order_by("-pk").first()
    assert (ev.from_status, ev.to_status, ev.at, ev.cause, ev.detail) == (
        "open", "open", at, "3 GPUs withdrawn: unhealthy", {})
    assert Order.objects.get(pk=ask.pk).remaining_gpus == 5
    assert Order.objects.get(pk=ask.pk).status == "open"


def test_a_lease_is_created_pending_with_its_gpus_in_the_event():
    ask = _ask()
    buyer = funded_buyer(100)
    book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=2_000_000, gpus=2,
                   duration_seconds=3600)
    lease = Lease.objects.get()
    [ev] = lease.events.all()
    assert (ev.from_status, ev.to_status) == ("", "pending")
    assert ev.cause.startswith("fill ") and f"ask {ask.pk}" in ev.cause
    assert len(ev.detail["gpus"]) == 2


def test_a_sealed_bid_moves_only_along_its_table():
    provider, node, _ = registered_node(RTX4090_DUMP)
    alice, bob = funded_buyer(100), funded_buyer(100)
    auction = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                    reserve_price=1_100_000, duration_seconds=3600,
                                    closes_at=timezone.now() + timedelta(minutes=5))
    assert [(e.from_status, e.to_status, e.cause) for e in auction.events.all()] == [
        ("", "open", "auction opened")]
    first = auctions.place_sealed_bid(bidder_id=alice.pk, auction_id=auction.pk,
                                      price=1_200_000)
    second = auctions.place_sealed_bid(bidder_id=alice.pk, auction_id=auction.pk,
                                       price=1_300_000)
    assert SealedBid.objects.get(pk=first.pk).status == "withdrawn"  # replaced
    loser = auctions.place_sealed_bid(bidder_id=bob.pk, auction_id=auction.pk, price=1_250_000)
    auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    won, lost = SealedBid.objects.get(pk=second.pk), SealedBid.objects.get(pk=loser.pk)
    assert (won.status, won.awarded_gpus, won.paid_price) == ("won", 8, 1_250_000)
    assert lost.status == "lost"
    replaced = SealedBid.objects.get(pk=first.pk)
    for bid, to in ((won, "withdrawn"), (lost, "won"), (replaced, "active")):
        with pytest.raises(IllegalTransition, match=f"sealed bid {bid.pk} cannot move"):
            bid.set_status(to, cause="test")
    with pytest.raises(Conflict, match="this auction is closed"):
        auctions.withdraw_sealed_bid(bidder_id=alice.pk, bid_id=won.pk)
    assert SealedBid.objects.get(pk=won.pk).status == "won"
    with pytest.raises(TypeError, match="sealed bid has no events table"):
        won.note(cause="test")
