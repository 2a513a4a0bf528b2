"""Group commit of the bids placed through the API: BidFastPath (ASGI middleware)
takes a token-authenticated POST of a valid bid in front of Django and queues it; one
batcher thread per process places what is queued as one group (book.place_bids: one
transaction, one market lock, a fixed number of statements). Anything the fast path
cannot answer exactly as the DRF view would goes to Django unchanged. Why, and what
goes through: docs/BID_PATH.md.
"""

from __future__ import annotations

import asyncio
import io
import logging
import threading
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.db import connection
from django.http.request import split_domain_port, validate_host
from rest_framework.exceptions import ParseError
from rest_framework.renderers import JSONRenderer

from core.group_thread import GroupThread
from marketplace import api_tokens, book
from marketplace.api import bid_queue
from marketplace.api import serializers as s
from marketplace.api.errors import exception_handler
from marketplace.api.parsers import StrictJSONParser
from marketplace.db_unavailable import RETRY_AFTER_SECONDS, is_database_unavailable
from marketplace.logs import REQUEST_ID_HEADER, request_id_from
from marketplace.models import Order

log = logging.getLogger("gpumarket.api")

_KEYWORDS = ("token", "bearer")


@dataclass
class _Pending:
    token: str
    bid: book.BidRequest
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


class Unauthenticated(Exception):
    """The token names no active user: the DRF view answers (401 with its message)."""


class BidBatcher(GroupThread):
    """One thread placing queued bids in groups (see the module docstring)."""

    thread_name, item_name = "bid-batcher", "bid"

    def __init__(self, max_batch: int) -> None:
        super().__init__(max_batch)
        self.stats = {"groups": 0, "bids": 0, "largest": 0}

    async def place(self, token: str, bid: book.BidRequest) -> tuple[int, dict[str, Any]]:
        """Queue `bid` (buyer_id is ignored: the buyer is `token`'s user) and await
        (HTTP status, response body). Raises Unauthenticated for an unknown token."""
        self._ensure_thread()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put(_Pending(token, bid, loop, future))
        return await future

    def _serve(self, group: list[_Pending]) -> list[Any]:
        try:
            return self._place(group)
        except Exception as exc:  # the database went away, a bug: every bid hears it
            log.exception("placing a group of %d bids failed", len(group))
            connection.close()  # a fresh one for the next group
            return [exc] * len(group)

    def _place(self, group: list[_Pending]) -> list[Any]:
        # This thread keeps its connection between groups (Django's per-request close,
        # CONN_MAX_AGE 0, is for request threads); a broken one is replaced above. With
        # the pool (GPUMARKET_DB_POOL) that is one of the process's connections for good.
        # One query on the tokens' unique hash index for the whole group; an unknown,
        # expired or revoked token is left out and the DRF view says why (401).
        users = api_tokens.user_ids({p.token for p in group})
        known = [p for p in group if p.token in users]
        results = book.place_bids([replace(p.bid, buyer_id=users[p.token]) for p in known])
        by_pending = dict(zip(map(id, known), results, strict=True))
        self.stats["groups"] += 1
        self.stats["bids"] += len(group)
        self.stats["largest"] = max(self.stats["largest"], len(group))
        outcomes: list[Any] = []
        for p in group:
            result = by_pending.get(id(p))
            outcomes.append(Unauthenticated() if result is None else _answer(result))
        return outcomes


def _answer(result: book.Placed | Exception) -> tuple[int, dict[str, Any]] | Exception:
    """What OrderListCreate.post answers for this result (status, body)."""
    if isinstance(result, Exception):
        response = exception_handler(result, {})
        if response is None:
            return result  # not a refusal: a 500, logged by the view
        return response.status_code, response.data
    return s.placed_answer(result)




_batcher: BidBatcher | None = None
_batcher_lock = threading.Lock()


def batcher() -> BidBatcher | bid_queue.BidQueue:
    """This process's batcher (created on first use): with GPUMARKET_BID_QUEUE=redis the
    per-market queues shared by every web process (bid_queue.py), else the process's own
    batcher thread."""
    global _batcher
    with _batcher_lock:
        if _batcher is None:
            _batcher = (bid_queue.BidQueue(settings.GPUMARKET_BID_BATCH_MAX)
                        if settings.GPUMARKET_BID_QUEUE == "redis"
                        else BidBatcher(settings.GPUMARKET_BID_BATCH_MAX))
        return _batcher


def parse_bid(body: bytes) -> book.BidRequest | None:
    """The bid in a JSON request body (buyer_id 0: the token says who), or None when the
    body is not a valid bid (the DRF view then answers, with its error). Reads no
    database; validation is OrderInSerializer's."""
    try:
        data = StrictJSONParser().parse(io.BytesIO(body), "application/json", {})
    except ParseError:
        return None
    if isinstance(data, dict) and data.get("checkpoint") is not None:
        return None  # its bucket is probed over the network: in the DRF view's thread
    serializer = s.reusing_fields(s.OrderInSerializer, data=data)
    if not serializer.is_valid() or serializer.validated_data["side"] != Order.Side.BID:
        return None
    return serializer.bid_request(buyer_id=0)


def _token(headers: dict[bytes, bytes]) -> str | None:
    keyword, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    token = token.strip()
    if keyword.lower() not in _KEYWORDS or not token or " " in token:
        return None
    return token


# What Django's middleware adds to a JSON response of this app (SecurityMiddleware with
# SECURE_HSTS_* on a secure request, SECURE_CONTENT_TYPE_NOSNIFF, SECURE_REFERRER_POLICY
# and SECURE_CROSS_ORIGIN_OPENER_POLICY; XFrameOptionsMiddleware with X_FRAME_OPTIONS).
# The request id (marketplace/logs.py) is RequestIdMiddleware's.
def _response_headers(body: bytes, request_id: str, *,
                      secure: bool = False) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()),
               (b"x-frame-options", settings.X_FRAME_OPTIONS.encode()),
               (REQUEST_ID_HEADER.lower().encode(), request_id.encode())]
    if secure and settings.SECURE_HSTS_SECONDS:
        hsts = f"max-age={settings.SECURE_HSTS_SECONDS}"
        if settings.SECURE_HSTS_INCLUDE_SUBDOMAINS:
            hsts += "; includeSubDomains"
        if settings.SECURE_HSTS_PRELOAD:
            hsts += "; preload"
        headers.append((b"strict-transport-security", hsts.encode()))
    if settings.SECURE_CONTENT_TYPE_NOSNIFF:
        headers.append((b"x-content-type-options", b"nosniff"))
    if settings.SECURE_REFERRER_POLICY:
        policy = settings.SECURE_REFERRER_POLICY
        value = policy if isinstance(policy, str) else ",".join(policy)
        headers.append((b"referrer-policy", value.encode()))
    if settings.SECURE_CROSS_ORIGIN_OPENER_POLICY:
        headers.append((b"cross-origin-opener-policy",
                        settings.SECURE_CROSS_ORIGIN_OPENER_POLICY.encode()))
    return headers


class BidFastPath:
    """ASGI middleware in front of Django: a token-authenticated POST of a valid bid to
    the order endpoint goes straight to the batcher; every other request, and any bid
    the fast path cannot answer exactly as the DRF view would (invalid body, unknown
    token, a host not in ALLOWED_HOSTS, an HTTPS redirect due, a body over
    DATA_UPLOAD_MAX_MEMORY_SIZE), goes to Django unchanged (its body replayed).

    Why outside Django: under ASGI every classic Django middleware hook and the sync
    DRF view each run through asgiref's sync_to_async in a thread created for the
    request; for this endpoint those hops cost more CPU than placing the bid.
    """

    def __init__(self, app) -> None:
        self.app = app
        self.path = "/api/v1/orders/"

    async def __call__(self, scope, receive, send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST"
                or scope["path"] != scope.get("root_path", "") + self.path):
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        token = _token(headers)
        body, more, too_big = await read_body(receive)
        if too_big:
            token = None  # Django refuses it
        bid = None
        secure = _is_secure(scope, headers)
        if (token is not None and not more and self._host_ok(headers)
                and headers.get(b"content-type", b"").split(b";")[0].strip()
                == b"application/json"
                and not (settings.SECURE_SSL_REDIRECT and not secure)):
            bid = parse_bid(body)
        if bid is not None:
            request_id = request_id_from(
                headers.get(REQUEST_ID_HEADER.lower().encode(), b"").decode("latin-1"))
            try:
                status, answer = await batcher().place(token, bid)
            except Unauthenticated:
                pass
            except bid_queue.NotPlaced as exc:  # Redis unreachable, or past its deadline
                log.warning("[request %s] 503 for a bid: %s", request_id, exc)
                return await self._respond(
                    send, 503, {"detail": f"the service is busy: {exc}; the bid was not "
                                          f"placed, retry in {RETRY_AFTER_SECONDS} s"},
                    request_id, secure,
                    extra=[(b"retry-after", str(RETRY_AFTER_SECONDS).encode())])
            except Exception as exc:  # a bug, the database gone
                if is_database_unavailable(exc):  # no connection: nothing was placed
                    log.warning("[request %s] 503 for a bid: no database connection (%s)",
                                request_id, type(exc).__name__)
                    return await self._respond(
                        send, 503, {"detail": "the service is busy: no database connection "
                                              "is free right now; the bid was not placed, "
                                              f"retry in {RETRY_AFTER_SECONDS} s"},
                        request_id, secure,
                        extra=[(b"retry-after", str(RETRY_AFTER_SECONDS).encode())])
                log.exception("[request %s] placing a bid through the batcher failed",
                              request_id)
                status, answer = 500, {"detail": "server error: look for the bid in GET "
                                                 "/api/v1/orders/ before placing it again (a "
                                                 "client_order_id makes a retry safe); it is "
                                                 f"logged as request {request_id}",
                                       "request_id": request_id}
                return await self._respond(send, status, answer, request_id, secure)
            else:
                return await self._respond(send, status, answer, request_id, secure)
        await self.app(scope, _replay(body, more, receive), send)

    @staticmethod
    def _host_ok(headers: dict[bytes, bytes]) -> bool:
        host = headers.get(b"host", b"").decode("latin-1")
        domain, _port = split_domain_port(host)
        allowed = settings.ALLOWED_HOSTS
        if settings.DEBUG and not allowed:
            allowed = [".localhost", "127.0.0.1", "[::1]"]
        return bool(domain) and validate_host(domain, allowed)

    @staticmethod
    async def _respond(send, status: int, answer: dict[str, Any], request_id: str,
                       secure: bool = False, extra: list[tuple[bytes, bytes]] = ()) -> None:
        body = JSONRenderer().render(answer)
        await send({"type": "http.response.start", "status": status,
                    "headers": _response_headers(body, request_id, secure=secure)
                    + list(extra)})
        await send({"type": "http.response.body", "body": body})


def _is_secure(scope, headers: dict[bytes, bytes]) -> bool:
    """request.is_secure() as Django answers it: SECURE_PROXY_SSL_HEADER's value when the
    request carries that header, else whether the scheme is https."""
    if settings.SECURE_PROXY_SSL_HEADER:
        name, value = settings.SECURE_PROXY_SSL_HEADER
        header = name.removeprefix("HTTP_").replace("_", "-").lower().encode("latin-1")
        if header in headers:
            return headers[header].decode("latin-1").split(",", 1)[0].strip() == value
    return scope.get("scheme") == "https"


def _replay(body: bytes, more: bool, receive):
    """A receive() that gives `body` first, then what the client still sends."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replayed


async def read_body(receive) -> tuple[bytes, bool, bool]:
    """An ASGI request's body for a fast path: (body, more still to come, over
    DATA_UPLOAD_MAX_MEMORY_SIZE). A request that stops early is handed on as it is."""
    body, more = b"", True
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        body += message.get("body", b"")
        more = message.get("more_body", False)
        if limit is not None and len(body) > limit:
            return body, more, True
    return body, more, False
