"""The live feed's websocket consumers: one thin consumer per feed.

Each one authenticates (or not) in `connect`, joins its group on this process's feed
hub (frontend.feed.Hub: one subscription per group per process, fanned out in memory),
sends a snapshot numbered with the group's sequence number, and forwards the group's
events after checking, for every event, that it belongs to this connection (the group
it subscribed to; for /ws/me/ the connected user). Formats and the sequence rules:
docs/FEED_PROTOCOL.md.

Each connection has a bounded queue (FEED_CLIENT_QUEUE messages, default 128) and its
own sender task, so a slow client never stalls the hub or the other clients. The queue
holds references to the group's shared events (each encoded once), so its length costs
no memory to speak of; it only decides how long a stall is ridden out: 128 messages are
about 6 s of a busy market (~20 a second), where 32 turned a 1.5 s stall of the whole
process (a CPU-starved server) into a resync of every client at once. When its
queue is full the backlog is dropped, `resync_required` is queued in its place, and
nothing more is queued for it until it asks for `{"type": "resync"}` (then a fresh
snapshot). Nothing is lost silently: the client is told.

Direct writes (FEED_DIRECT_WRITES, default on): most of a busy feed's cost was the path
of each event through the queue, the sender task and four layers of ASGI `send` to
every client (bench/README.md). When the connection is served by uvicorn's
websockets-sansio protocol, an event whose seq is the next one for a client whose
sender is idle with an empty queue is written to its socket directly: without
extensions as a frame encoded once for the whole group (`text_frame`), with
permessage-deflate (browsers) through the connection's own websockets protocol object
(`send_text` + `data_to_send`, exactly what uvicorn's `send` calls, so its compressor
state stays right). The same bytes ASGI `send` would write, in the same order. Anything
else takes the queue: the snapshot, gaps, warnings, a socket that pushes back
(uvicorn's flow control: the slow-client rule applies as before), a closing
connection, another server, a wrapped `send`. Detection (`direct_socket`) checks the
class and the attributes it uses and falls back to ASGI when any is missing.

Coalescing (FEED_COALESCE_WRITES, default on): direct writes are queued on the hub
(`Hub.write_later`) and each socket gets one write of all its frames when the loop
iteration's callbacks are done (a trade and its depth, the summary's messages of one
burst); the send() system call per frame was most of a frame's cost at 10,000 clients.

Close codes: 4401 not authenticated (/ws/me/), 4404 unknown market or auction, 4400 a
credential in the URL (frontend/ws_auth.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from core import metrics
from frontend import feed

try:
    from websockets.exceptions import InvalidState
except ImportError:  # without websockets there is no uvicorn sansio protocol to write to
    InvalidState = RuntimeError

log = logging.getLogger("gpumarket.feed")

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404



def direct_socket(send):
    """uvicorn's websocket protocol (websockets-sansio) behind Channels' session wrapper,
    if that is what carries this connection: events can then be written to it without
    the ASGI layers. Anything else (another server, a wrapped `send`): None, and every
    message goes through ASGI `send`."""
    proto = getattr(getattr(getattr(send, "__self__", None), "real_send", None), "__self__",
                    None)
    cls = type(proto)
    if (cls.__name__ != "WebSocketsSansIOProtocol"
            or cls.__module__ != "uvicorn.protocols.websockets.websockets_sansio_impl"):
        return None
    needed = ("transport", "writable", "close_sent", "disconnected", "handshake_complete",
              "initial_response", "conn")
    if not all(hasattr(proto, name) for name in needed):
        return None
    conn = proto.conn
    if not all(hasattr(conn, name) for name in ("extensions", "send_text", "data_to_send")):
        return None
    return proto


def text_frame(text: str) -> bytes:
    """One unmasked, unfragmented, uncompressed server text frame (RFC 6455, 5.2)."""
    data = text.encode()
    n = len(data)
    if n < 126:
        return bytes((0x81, n)) + data
    if n < 1 << 16:
        return bytes((0x81, 126)) + n.to_bytes(2, "big") + data
    return bytes((0x81, 127)) + n.to_bytes(8, "big") + data


def _write_frame(proto, event: dict[str, Any], write) -> bool:
    """Write the event to the socket if it is open and not pushing back (uvicorn's flow
    control); False: go through the queue and ASGI instead. Without extensions: the
    frame encoded once for the whole group. With permessage-deflate (browsers ask for
    it): the connection's own websockets protocol compresses and frames it — the very
    calls uvicorn's `send` makes, with the compressor state it keeps per connection.
    `write(proto, data)`: the hub's `write_later` (one write per socket per loop
    iteration)."""
    if (not proto.handshake_complete or proto.close_sent or proto.disconnected
            or proto.initial_response is not None or not proto.writable.is_set()
            or proto.transport.is_closing()):
        return False
    conn = proto.conn
    if not conn.extensions:
        frame = event.get("frame")
        if frame is None:
            frame = event["frame"] = text_frame(event["text"])
        write(proto, frame)
        return True
    data = event.get("utf8")
    if data is None:
        data = event["utf8"] = event["text"].encode()
    try:
        conn.send_text(data)
    except InvalidState:  # not open any more: the ASGI path tells the consumer
        return False
    # drained now: a later data_to_send() of uvicorn's (a ping) must not get it again
    write(proto, b"".join(conn.data_to_send()))
    return True


def _write_now(proto, data: bytes) -> None:
    """FEED_COALESCE_WRITES off: one socket write per frame (as before the hub's
    coalescing; kept to measure it against: bench/README.md)."""
    proto.transport.write(data)


class FeedConsumer(AsyncWebsocketConsumer):
    """Common part: hub membership, snapshot with seq, gap detection, resync, and the
    per-connection bounded queue."""

    # No per-connection channel-layer channel: the hub holds the only subscription.
    channel_layer_alias = "gpumarket.feed.no-per-connection-channel"

    group: str = ""
    last_seq: int | None = None
    resync_pending: bool = False
    lagging: bool = False
    hub: feed.Hub | None = None
    _queue: asyncio.Queue | None = None
    _sender: asyncio.Task | None = None
    _socket = None       # uvicorn's protocol when frames may be written directly
    _idle: bool = False  # the sender waits on an empty queue: nothing queued or in flight

    async def subscribe(self, group: str) -> None:
        self.group = group
        self._queue = asyncio.Queue(maxsize=getattr(settings, "FEED_CLIENT_QUEUE", 128))
        await self.accept()
        self.hub = feed.hub()
        if getattr(settings, "FEED_DIRECT_WRITES", True):
            self._socket = direct_socket(self.base_send)
        await self.hub.join(group, self)
        metrics.feed_client(group, +1)
        self._put(self._snapshot_item())  # first in the queue: before any event
        self._sender = asyncio.create_task(self._send_loop())

    # -- called by the hub, synchronously, for every event of the group
    def offer(self, event: dict[str, Any]) -> None:
        if not self.allowed(event):  # the permission check, on every event
            log.warning("feed: event for %s refused on %s", event.get("group"), self.group)
            return
        if self.lagging:
            return
        if (self._idle and self._socket is not None and self.last_seq is not None
                and event["seq"] == self.last_seq + 1 and self._write_directly(event)):
            self.last_seq = event["seq"]  # nothing queued, nothing in flight: in order
            return
        try:
            self._put(("event", event))
        except asyncio.QueueFull:
            self._overflow(event)

    def renumbered(self, event: dict[str, Any]) -> None:
        """Called by the hub when the group's numbering restarted at `event` (a new Redis
        run: events may have been lost on the way). Like a slow client: the backlog is
        dropped and the client told `resync_required` (no content: no permission check)."""
        self._overflow(event)

    def _write_directly(self, event: dict[str, Any]) -> bool:
        try:
            return _write_frame(self._socket, event, self._write_later if getattr(
                settings, "FEED_COALESCE_WRITES", True) else _write_now)
        except Exception:  # never let one socket break the fan-out to the others
            log.debug("feed: direct write on %s failed; ASGI path", self.group, exc_info=True)
            self._socket = None
            return False

    def _write_later(self, proto, data: bytes) -> None:
        self.hub.write_later(self, proto, data)

    def write_failed(self) -> None:
        """A coalesced direct write raised (Hub.flush_writes): its frames are lost, so
        the client is told to resync (if the socket still carries anything), and the
        ASGI path takes over."""
        self._socket = None
        self._overflow({"seq": self.last_seq or 0})

    def _put(self, item: tuple[str, Any]) -> None:
        self._idle = False  # from now until the sender finds its queue empty again
        self._queue.put_nowait(item)

    def _overflow(self, event: dict[str, Any]) -> None:
        """Too slow: drop its backlog and tell it to resync; the group goes on."""
        dropped = self._clear()
        if any(kind == "snapshot" for kind, _ in dropped):  # that supersedes all
            self._put(self._snapshot_item())
            return
        self.lagging = True
        self._put(("text", json.dumps(
            {"type": "resync_required", "seq": event["seq"],
             "expected": (self.last_seq or 0) + 1, "ts": time.time()},
            separators=(",", ":"))))

    def _clear(self) -> list:
        dropped = []
        while not self._queue.empty():
            dropped.append(self._queue.get_nowait())
        return dropped

    def _snapshot_item(self) -> tuple[str, int]:
        # every event up to the hub's current seq is either sent or dropped already;
        # every later one will be queued behind this: the snapshot must be at least here
        return ("snapshot", self.hub.seq(self.group))

    def _request_snapshot(self) -> None:
        self.lagging = False
        try:
            self._put(self._snapshot_item())
        except asyncio.QueueFull:  # a snapshot supersedes the backlog
            self._clear()
            self._put(self._snapshot_item())

    async def _send_loop(self) -> None:
        try:
            while True:
                self._idle = self._queue.empty()
                kind, item = await self._queue.get()
                self._idle = False
                if kind == "event":
                    await self._forward(item)
                elif kind == "snapshot":
                    await self.send_snapshot(item)
                else:
                    await self.send(text_data=item)
        except asyncio.CancelledError:
            raise
        except Exception:  # the connection went away under us: disconnect cleans up
            log.debug("feed: sender for %s stopped", self.group, exc_info=True)

    async def _forward(self, event: dict[str, Any]) -> None:
        seq = event["seq"]
        if self.last_seq is not None and seq <= self.last_seq:
            return  # already contained in the snapshot this connection got
        if self.last_seq is not None and seq > self.last_seq + 1 and not self.resync_pending:
            # messages of this group were lost on the way (a publisher died between
            # taking seqs and sending, a Redis reconnect): say so; the client resyncs.
            self.resync_pending = True
            await self.send(text_data=json.dumps(
                {"type": "resync_required", "seq": seq, "expected": self.last_seq + 1,
                 "ts": time.time()}, separators=(",", ":")))
        self.last_seq = seq
        await self.send(text_data=event["text"])  # encoded once for the whole group

    async def send_snapshot(self, need_seq: int) -> None:
        """A snapshot numbered seq >= need_seq (Hub.snapshot: clients of a group that
        (re)sync together share one read). Queued events up to its seq are skipped."""
        seq, text = await self.hub.snapshot(self.group, need_seq, self.snapshot)
        self.last_seq = seq
        self.resync_pending = False
        await self.send(text_data=text)

    def snapshot(self) -> dict[str, Any]:  # runs in a thread, may use the ORM
        raise NotImplementedError

    def allowed(self, event: dict[str, Any]) -> bool:
        return event.get("group") == self.group

    async def disconnect(self, code: int) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sender
        if self.group and self.hub is not None:
            await self.hub.leave(self.group, self)
            metrics.feed_client(self.group, -1)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
        try:
            message = json.loads(text_data or "")
        except ValueError:
            message = None
        if isinstance(message, dict) and message.get("type") == "resync":
            if self._queue is not None:
                self._request_snapshot()
        elif self._queue is not None:  # through the queue, in order with the rest
            with contextlib.suppress(asyncio.QueueFull):
                self._put(("text", json.dumps(
                    {"type": "error", "message": 'unknown message: send {"type": "resync"}'})))


class MarketFeedConsumer(FeedConsumer):
    """/ws/markets/<gpu_class>/: depth, best bid/ask, anonymous trades. Public."""

    async def connect(self) -> None:
        slug = self.scope["url_route"]["kwargs"]["gpu_class"]
        # a websocket of this market already connected here looked it up: no thread hop
        # and no database connection per connect (1,000 clients connect in a burst)
        self.market = getattr(feed.hub().any_member(feed.market_group(slug)), "market", None)
        if self.market is None:
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


class SummaryFeedConsumer(FeedConsumer):
    """/ws/summary/: every market's best bid and ask and GPUs offered, every auction's
    status and bid count (the home page and /auctions/). Public; never a bid's content."""

    async def connect(self) -> None:
        await self.subscribe(feed.SUMMARY_GROUP)

    def snapshot(self) -> dict[str, Any]:
        return feed.summary_snapshot()


class MeFeedConsumer(FeedConsumer):
    """/ws/me/: the user's own orders, sealed bids, leases and balance changes.

    Authentication, the first that applies: the session (pages; AuthMiddlewareStack in
    marketplace/asgi.py); a single-use ticket from POST /api/v1/ws-tickets/,
    `/ws/me/?ticket=<ticket>` (browsers cannot set headers on a websocket); an
    `Authorization: Token|Bearer <API token>` header (programs). Never the token in the
    URL: `?token=` is refused before this (frontend/ws_auth.py). Anonymous, or a ticket
    or token that authenticates nobody → closed with 4401.
    """

    user_id: int | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            user = await database_sync_to_async(self._credential_user)()
        if user is None or not user.is_active:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.user_id = user.pk
        await self.subscribe(feed.user_group(user.pk))

    def _credential_user(self):
        from marketplace import api_tokens

        query = parse_qs(self.scope.get("query_string", b"").decode("latin1"))
        ticket = (query.get("ticket") or [""])[0]
        if ticket:
            return api_tokens.redeem_ticket(ticket)
        key = _authorization_token(self.scope)
        if not key:
            return None
        try:
            return api_tokens.authenticate(key).user
        except api_tokens.TokenRefused:
            return None

    def allowed(self, event: dict[str, Any]) -> bool:
        return (super().allowed(event) and self.user_id is not None
                and event.get("user") == self.user_id)

    def snapshot(self) -> dict[str, Any]:
        return feed.me_snapshot(self.user_id)


def _authorization_token(scope) -> str | None:
    """The key of an `Authorization: Token|Bearer <key>` handshake header, else None."""
    for name, value in scope.get("headers") or []:
        if name.lower() == b"authorization":
            parts = value.decode("latin-1").split()
            if len(parts) == 2 and parts[0].lower() in ("token", "bearer"):
                return parts[1]
            return None
    return None


CLOSE_NO_SUCH_FEED = 4404
FEEDS = ("/ws/markets/<gpu class>/, /ws/auctions/<id>/, /ws/summary/, /ws/me/ (and the "
         "runners' /ws/runner/)")


class NoSuchFeedConsumer(AsyncWebsocketConsumer):
    """Any other websocket path (a typo): accepted, told which feeds exist in one JSON
    frame, closed with 4404 (Channels' router would raise: an HTTP 500)."""

    async def connect(self) -> None:
        path = self.scope.get("path", "")
        await self.accept()
        await self.send(text_data=json.dumps(
            {"type": "error", "detail": f"no feed at {path}: the feeds are {FEEDS}"}))
        await self.close(code=CLOSE_NO_SUCH_FEED)
