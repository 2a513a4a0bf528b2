"""The live feed's websocket consumers: one thin consumer per feed.

Each one authenticates (or not) in `connect`, joins its group, sends a snapshot with
the group's sequence number, and forwards the group's events after checking, for
every event, that it belongs to this connection (the group it subscribed to; for
/ws/me/ the connected user). Formats and the sequence rules: frontend/feed.py.

Close codes: 4401 not authenticated (/ws/me/), 4404 unknown market or auction.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from frontend import feed

log = logging.getLogger("gpumarket.feed")

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404


class FeedConsumer(AsyncWebsocketConsumer):
    """Common part: group, snapshot with seq, gap detection, resync."""

    group: str = ""
    last_seq: int | None = None
    resync_pending: bool = False

    async def subscribe(self, group: str) -> None:
        self.group = group
        await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send_snapshot()

    async def send_snapshot(self) -> None:
        seq, snapshot = await database_sync_to_async(self._read_snapshot)()
        self.last_seq = seq
        self.resync_pending = False
        await self.send(text_data=json.dumps({**snapshot, "seq": seq, "ts": time.time()},
                                             separators=(",", ":")))

    def _read_snapshot(self) -> tuple[int, dict[str, Any]]:
        # seq first, then the rows: a change committed in between may show in the
        # snapshot and arrive again as seq+1 (harmless), but is never missed.
        seq = feed.current_seq(self.group)
        return seq, self.snapshot()

    def snapshot(self) -> dict[str, Any]:  # runs in a thread, may use the ORM
        raise NotImplementedError

    def allowed(self, event: dict[str, Any]) -> bool:
        return event.get("group") == self.group

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
        try:
            message = json.loads(text_data or "")
        except ValueError:
            message = None
        if isinstance(message, dict) and message.get("type") == "resync":
            await self.send_snapshot()
        else:
            await self.send(text_data=json.dumps(
                {"type": "error", "message": 'unknown message: send {"type": "resync"}'}))

    async def feed_event(self, event: dict[str, Any]) -> None:
        """A published event (frontend.feed.publish): permission, order, forward."""
        if not self.allowed(event):
            log.warning("feed: event for %s refused on %s", event.get("group"), self.group)
            return
        seq = event["seq"]
        if self.last_seq is not None and seq <= self.last_seq:
            return  # already contained in the snapshot this connection got
        if self.last_seq is not None and seq > self.last_seq + 1 and not self.resync_pending:
            # the channel layer dropped messages for this connection (its buffer
            # overflowed while the client was slow): say so; the client resyncs.
            self.resync_pending = True
            await self.send(text_data=json.dumps(
                {"type": "resync_required", "seq": seq, "expected": self.last_seq + 1,
                 "ts": time.time()}, separators=(",", ":")))
        self.last_seq = seq
        await self.send(text_data=event["text"])


class MarketFeedConsumer(FeedConsumer):
    """/ws/markets/<gpu_class>/: depth, best bid/ask, anonymous trades. Public."""

    async def connect(self) -> None:
        slug = self.scope["url_route"]["kwargs"]["gpu_class"]
        self.market = await database_sync_to_async(self._market)(slug)
        if self.market is None:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await self.subscribe(feed.market_group(slug))

    @staticmethod
    def _market(slug: str):
        from marketplace.models import GpuClass

        return GpuClass.objects.filter(slug=slug).first()

    def snapshot(self) -> dict[str, Any]:
        return feed.market_snapshot(self.market)


class AuctionFeedConsumer(FeedConsumer):
    """/ws/auctions/<id>/: bid count and clock; the result at close. Public; never a
    sealed bid's content."""

    async def connect(self) -> None:
        self.auction_id = self.scope["url_route"]["kwargs"]["auction_id"]
        exists = await database_sync_to_async(self._exists)()
        if not exists:
            await self.close(code=CLOSE_NOT_FOUND)
            return
        await self.subscribe(feed.auction_group(self.auction_id))

    def _exists(self) -> bool:
        from marketplace.models import Auction

        return Auction.objects.filter(pk=self.auction_id).exists()

    def snapshot(self) -> dict[str, Any]:
        from marketplace.models import Auction

        return feed.auction_snapshot(Auction.objects.select_related("market")
                                     .get(pk=self.auction_id))


class MeFeedConsumer(FeedConsumer):
    """/ws/me/: the user's own orders, sealed bids, leases and balance changes.

    Authentication: the session (AuthMiddlewareStack in marketplace/asgi.py), or a DRF
    token in the query string: `/ws/me/?token=<key>` (browsers cannot set headers on a
    websocket). Anonymous → closed with 4401.
    """

    user_id: int | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            user = await database_sync_to_async(self._token_user)()
        if user is None or not user.is_active:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.user_id = user.pk
        await self.subscribe(feed.user_group(user.pk))

    def _token_user(self):
        from rest_framework.authtoken.models import Token

        query = parse_qs(self.scope.get("query_string", b"").decode("latin1"))
        key = (query.get("token") or [""])[0]
        if not key:
            return None
        token = Token.objects.select_related("user").filter(key=key).first()
        return token.user if token else None

    def allowed(self, event: dict[str, Any]) -> bool:
        return (super().allowed(event) and self.user_id is not None
                and event.get("user") == self.user_id)

    def snapshot(self) -> dict[str, Any]:
        return feed.me_snapshot(self.user_id)
