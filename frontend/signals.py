"""post_save receivers that feed the live feed (frontend/feed/, docs/FEED_PROTOCOL.md).

The market's services are not touched: every saved Order, Fill, Auction, SealedBid,
Lease and JournalEntry (and Posting, should one be saved alone; the ledger
bulk-creates them, which sends no signal, so the entry is what we hook; settlement.signals'
`entries_written` names the entries of a set-based write at once) is noted in
the current transaction's batch, which is published once, after commit
(`transaction.on_commit`, like zulip's send_event_on_commit). A rolled-back
transaction publishes nothing. New GPU readings of a lease (marketplace.telemetry's
`telemetry_recorded`) are noted the same way. Connected in FrontendConfig.ready().
"""

from __future__ import annotations

from django.db.models.signals import post_save

from frontend import feed

DISPATCH = "gpumarket.feed."


def _order_saved(sender, instance, **kwargs):
    feed.note(markets=instance.market_id, orders=instance.pk,
              order_owners=(instance.pk, instance.owner_id))


def _fill_saved(sender, instance, created, **kwargs):
    if created:
        feed.note(fills=instance.pk, markets=instance.market_id)


def _auction_saved(sender, instance, **kwargs):
    feed.note(auctions=instance.pk)


def _sealed_bid_saved(sender, instance, **kwargs):
    # the auction's public count changes; the bid itself goes to its bidder only
    feed.note(auctions=instance.auction_id, sealed_bids=instance.pk)


def _lease_saved(sender, instance, **kwargs):
    feed.note(leases=instance.pk)


def _entry_saved(sender, instance, created, **kwargs):
    if created:
        feed.note(entries=instance.pk)


def _entries_written(sender, entry_ids, **kwargs):
    feed.note_many(entries=entry_ids)


def _posting_saved(sender, instance, created, **kwargs):
    if created:
        feed.note(entries=instance.entry_id)


def _telemetry_recorded(sender, lease_ids, **kwargs):
    for lease_id in lease_ids:
        feed.note(telemetry=lease_id)


def connect() -> None:
    from marketplace.telemetry import telemetry_recorded

    telemetry_recorded.connect(_telemetry_recorded, weak=False,
                               dispatch_uid=DISPATCH + "telemetry")
    from marketplace.models import Auction, Fill, Lease, Order, SealedBid
    from settlement.models import JournalEntry, Posting
    from settlement.signals import entries_written

    entries_written.connect(_entries_written, sender=JournalEntry, weak=False,
                            dispatch_uid=DISPATCH + "entries_written")

    for model, receiver in ((Order, _order_saved), (Fill, _fill_saved),
                            (Auction, _auction_saved), (SealedBid, _sealed_bid_saved),
                            (Lease, _lease_saved), (JournalEntry, _entry_saved),
                            (Posting, _posting_saved)):
        post_save.connect(receiver, sender=model, weak=False,
                          dispatch_uid=DISPATCH + model.__name__)
