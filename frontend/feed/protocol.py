"""The live feed's names: its groups, the channel-layer message type, sizes and settings.
Messages and rules: docs/FEED_PROTOCOL.md."""

from __future__ import annotations

from django.conf import settings

DEPTH_LEVELS = 20
LAST_TRADES = 20
EVENT_TYPE = "feed.event"  # the channel layer message type → consumer.feed_event
SNAPSHOT_CACHE_S = 0.5  # seconds a snapshot is reused for clients that (re)sync together


SUMMARY_GROUP = "summary"  # /ws/summary/: every market's best prices, every auction's state


def market_group(slug: str) -> str:
    return f"market.{slug}"


def auction_group(auction_id: int) -> str:
    return f"auction.{auction_id}"


def user_group(user_id: int) -> str:
    return f"user.{user_id}"


def _setting(name: str, default: float) -> float:
    return getattr(settings, name, default)
