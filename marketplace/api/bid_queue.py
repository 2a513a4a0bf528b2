"""One batcher per market across web processes (GPUMARKET_BID_QUEUE=redis, the default
with REDIS_URL): every process pushes a market's fast-path bids onto that market's Redis
list; the one process holding the market's lease drains it in groups (book.place_bids)
and pushes each answer to the asking process's reply list. Why and how (lease, fencing,
take-over of a dead consumer's group): docs/BID_PATH.md, "Several web processes".

Keys (prefix gpumarket:bidq:<database>:): q:<slug> (bids, FIFO: time priority across
processes), wake:<slug>, owner:<slug> (the lease: a consumer id, PX), fence:<slug>
(INCR at each acquisition: the fencing token), proc:<slug> (the group being placed),
reply:<process id>. A queued bid carries its token's hash (never the key) and its
secrets sealed (marketplace/sealing.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from dataclasses import fields, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

import redis
from django.conf import settings
from django.db import connection

from marketplace import api_tokens, book, locking
from marketplace.sealing import seal, unseal

log = logging.getLogger("gpumarket.api")

# push a bid, wake the consumer, and take the lease when no one holds it: the fencing
# token (> 0) when this process is now the consumer, else 0
_PUSH = """
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], '1')
if redis.call('SET', KEYS[3], ARGV[2], 'NX', 'PX', ARGV[3]) then
  return redis.call('INCR', KEYS[4])
end
return 0
"""
# take the lease if vacant (a waiting process whose market's consumer died)
_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0
"""
# the owner only: up to ARGV[2] bids become the group in flight (proc); -1: not the owner
_TAKE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local items = redis.call('LPOP', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[3])
if not items then return {} end
local group = cjson.encode({group = ARGV[3], items = items})
redis.call('SET', KEYS[4], group)
return {group}
"""
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""
# the group in flight is done (the owner only: a new owner takes over what is left)
_DONE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local cur = redis.call('GET', KEYS[2])
if cur and cjson.decode(cur).group == ARGV[2] then redis.call('DEL', KEYS[2]) end
return 1
"""
# an idle owner lets the lease go, unless bids arrived meanwhile
_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 1 end
if redis.call('LLEN', KEYS[2]) > 0 or redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""


_REPLIES_AT_ONCE = 256  # answers read in one LPOP after the BLPOP that waited for one


class NotPlaced(Exception):
    """The bid was not placed (Redis unreachable, or it waited past its deadline in the
    queue): the fast path answers 503 with Retry-After."""


class Unknown(Exception):
    """No answer came in time: the bid may or may not be placed (the fast path's 500
    asks the buyer to look for it before placing it again)."""


_BID_FIELDS = fields(book.BidRequest)
_BID_NAMES = frozenset(f.name for f in _BID_FIELDS)


def encode_bid(bid: book.BidRequest) -> dict[str, Any]:
    """The bid as JSON: datetimes ISO 8601, Decimals as strings, secrets sealed."""
    data = {f.name: getattr(bid, f.name) for f in _BID_FIELDS}  # (asdict deep-copies)
    data["secrets"] = seal(bid.secrets or {}) if bid.secrets else None
    if bid.checkpoint is not None:
        raise ValueError("a bid with a checkpoint store goes through the DRF view")
    data.pop("checkpoint")
    if bid.expires_at is not None:
        data["expires_at"] = bid.expires_at.isoformat()
    if bid.min_reliability is not None:
        data["min_reliability"] = str(bid.min_reliability)
    return data


def decode_bid(data: dict[str, Any]) -> book.BidRequest:
    names = _BID_NAMES
    values = {k: v for k, v in data.items() if k in names}
    values["secrets"] = unseal(data["secrets"]) if data.get("secrets") else None
    if values.get("expires_at") is not None:
        values["expires_at"] = datetime.fromisoformat(values["expires_at"])
    if values.get("min_reliability") is not None:
        values["min_reliability"] = Decimal(values["min_reliability"])
    return book.BidRequest(**values)


class BidQueue:
    """This process's side of the market queues: pushes bids and awaits their answers
    (`place`), and runs a consumer thread for each market whose lease it holds."""

    def __init__(self, max_batch: int, *, url: str | None = None,
                 lease_ms: int | None = None, answer_timeout: float | None = None) -> None:
        self.max_batch = max_batch
        self.lease_ms = lease_ms or settings.GPUMARKET_BID_QUEUE_LEASE_MS
        self.answer_timeout = answer_timeout or settings.GPUMARKET_BID_QUEUE_TIMEOUT_SECONDS
        self.redis = redis.Redis.from_url(url or settings.REDIS_URL, socket_timeout=5,
                                          socket_connect_timeout=1, health_check_interval=30)
        self._push = self.redis.register_script(_PUSH)
        self._acquire = self.redis.register_script(_ACQUIRE)
        self._take = self.redis.register_script(_TAKE)
        self._renew = self.redis.register_script(_RENEW)
        self._done = self.redis.register_script(_DONE)
        self._release = self.redis.register_script(_RELEASE)
        self.prefix = f"gpumarket:bidq:{settings.DATABASES['default']['NAME']}:"
        self.id = uuid.uuid4().hex  # this process (its reply list)
        self._waiting: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future, str]] = {}
        self._lock = threading.Lock()
        self._consumers: dict[str, Consumer] = {}
        self._replies: threading.Thread | None = None
        self._stopping = threading.Event()
        self.stats = {"groups": 0, "bids": 0, "largest": 0, "took_over": 0}

    def key(self, kind: str, slug: str) -> str:
        return f"{self.prefix}{kind}:{slug}"

    @property
    def reply_key(self) -> str:
        return f"{self.prefix}reply:{self.id}"

    # -- the web side
    async def place(self, token: str, bid: book.BidRequest) -> tuple[int, dict[str, Any]]:
        """Queue `bid` on its market and await (HTTP status, body). Raises Unauthenticated
        (from bid_batcher) for an unknown token, NotPlaced, or Unknown (no answer)."""
        from marketplace.api.bid_batcher import Unauthenticated

        self._ensure_replies()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        rid = uuid.uuid4().hex
        slug = bid.market_slug
        deadline = time.time() + self.answer_timeout
        item = json.dumps({"id": rid, "r": self.reply_key, "h": api_tokens.hash_key(token),
                           "b": encode_bid(bid), "d": deadline}, separators=(",", ":"))
        with self._lock:
            self._waiting[rid] = (loop, future, slug)
        try:
            try:  # (one short round trip: not worth a thread hop)
                token_no = self._push_item(slug, item)
            except redis.RedisError as exc:
                raise NotPlaced(f"the market's bid queue is unreachable ({type(exc).__name__})"
                                ) from exc
            if token_no:
                self._start_consumer(slug, int(token_no))
            try:
                kind, status, body = await asyncio.wait_for(
                    future, self.answer_timeout + self.lease_ms / 1000 + 5)
            except TimeoutError:
                raise Unknown("no answer from the market's batcher in time") from None
        finally:
            with self._lock:
                self._waiting.pop(rid, None)
        if kind == "answer":
            return status, body
        if kind == "unauthenticated":
            raise Unauthenticated()
        if kind == "not_placed":
            raise NotPlaced(body.get("detail", "not placed"))
        raise RuntimeError(f"placing the bid failed in the market's batcher: {body}")

    def _push_item(self, slug: str, item: str) -> int:
        return self._push(keys=[self.key("q", slug), self.key("wake", slug),
                                self.key("owner", slug), self.key("fence", slug)],
                          args=[item, self._consumer_id(slug), self.lease_ms])

    def _consumer_id(self, slug: str) -> str:
        return f"{self.id}:{slug}"

    def _ensure_replies(self) -> None:
        with self._lock:
            if self._replies is None or not self._replies.is_alive():
                self._stopping.clear()
                self._replies = threading.Thread(target=self._read_replies,
                                                 name="bid-queue-replies", daemon=True)
                self._replies.start()

    def _read_replies(self) -> None:
        """Deliver answers to the waiting requests; meanwhile, every lease period, take
        over the lease of a market this process waits on when no one holds it (its
        consumer died)."""
        checked = time.monotonic()
        while not self._stopping.is_set():
            try:
                got = self.redis.blpop([self.reply_key], timeout=0.5)
            except redis.RedisError:
                log.warning("bid queue: Redis unreachable while reading answers; retrying")
                time.sleep(0.5)
                continue
            if got is not None:
                self._deliver(json.loads(got[1]))
                # the rest of a group's answers, pushed together: one round trip for them
                try:
                    rest = self.redis.lpop(self.reply_key, _REPLIES_AT_ONCE) or []
                except redis.RedisError:
                    rest = []  # (read by the next BLPOP)
                for reply in rest:
                    self._deliver(json.loads(reply))
            if time.monotonic() - checked >= self.lease_ms / 1000:
                checked = time.monotonic()
                self._adopt_orphans()

    def _deliver(self, reply: dict[str, Any]) -> None:
        with self._lock:
            waiting = self._waiting.get(reply["id"])
        if waiting is None:
            return  # that request gave up (timed out) or is another process's
        loop, future, _ = waiting
        outcome = (reply["k"], reply.get("s", 0), reply.get("b", {}))

        def settle() -> None:
            if not future.done():
                future.set_result(outcome)

        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:
            log.warning("a bid's answer could not be delivered: its loop is closed")

    def _adopt_orphans(self) -> None:
        with self._lock:
            markets = {slug for _, _, slug in self._waiting.values()}
        for slug in markets:
            if slug in self._consumers and self._consumers[slug].is_alive():
                continue
            try:
                token_no = self._acquire(keys=[self.key("owner", slug), self.key("fence", slug)],
                                         args=[self._consumer_id(slug), self.lease_ms])
            except redis.RedisError:
                return
            if token_no:
                log.warning("bid queue of %s: no consumer held it; this process takes over",
                            slug)
                self._start_consumer(slug, int(token_no))

    def _start_consumer(self, slug: str, token_no: int) -> None:
        with self._lock:
            old = self._consumers.get(slug)
            if old is not None and old.is_alive():
                old.token = max(old.token, token_no)  # (it re-acquired its own lapsed lease)
                return
            consumer = Consumer(self, slug, token_no)
            self._consumers[slug] = consumer
        consumer.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the consumers (each lets its lease go when its queue is empty) and the
        reply reader."""
        with self._lock:
            consumers = list(self._consumers.values())
        for c in consumers:
            c.stop.set()
        for c in consumers:
            c.join(timeout)
        self._stopping.set()
        if self._replies is not None:
            self._replies.join(timeout)


class Consumer(threading.Thread):
    """Drains one market's queue while this process holds its lease: takes over a group
    left in flight by a dead consumer (places only what is not committed: the fence row,
    locking.take_over), then places groups of up to max_batch bids, in queue order."""

    IDLE_RELEASE_S = 10.0

    def __init__(self, queue: BidQueue, slug: str, token: int) -> None:
        super().__init__(name=f"bid-queue-{slug}", daemon=True)
        self.q, self.slug, self.token = queue, slug, token
        self.me = queue._consumer_id(slug)
        self.stop = threading.Event()
        self._market_id: int | None = None

    def keys(self, *kinds: str) -> list[str]:
        return [self.q.key(k, self.slug) for k in kinds]

    def run(self) -> None:
        keeper = threading.Thread(target=self._keep_lease, daemon=True,
                                  name=f"bid-queue-lease-{self.slug}")
        keeper.start()
        try:
            self._run()
        except locking.Fenced:
            log.warning("bid queue of %s: another consumer took over; this one stops",
                        self.slug)
        except Exception:
            log.exception("bid queue of %s: the consumer failed; another takes over after "
                          "its lease lapses", self.slug)
        finally:
            self.stop.set()
            connection.close()

    def _keep_lease(self) -> None:
        while not self.stop.wait(self.q.lease_ms / 3000):
            try:
                if not self.q._renew(keys=self.keys("owner"), args=[self.me, self.q.lease_ms]):
                    self.stop.set()  # lost it: the loop notices at its next take
            except redis.RedisError:
                pass

    def _run(self) -> None:
        left = self.q.redis.get(self.q.key("proc", self.slug))
        if left is not None:
            self._take_over(json.loads(left))
        idle_since = time.monotonic()
        while True:
            group_id = uuid.uuid4().hex
            got = self.q._take(keys=self.keys("owner", "q", "wake", "proc"),
                               args=[self.me, self.q.max_batch, group_id])
            if got == -1:
                return  # not the owner any more
            if got:
                self._place(json.loads(got[0]))
                idle_since = time.monotonic()
                continue
            idle = self.stop.is_set() or time.monotonic() - idle_since > self.IDLE_RELEASE_S
            if idle and self.q._release(keys=self.keys("owner", "q", "proc"), args=[self.me]):
                return
            self.q.redis.blpop(self.keys("wake"), timeout=0.25)

    def _market(self) -> int | None:
        if self._market_id is None:
            from marketplace.models import GpuClass

            self._market_id = (GpuClass.objects.filter(slug=self.slug)
                               .values_list("pk", flat=True).first())
        return self._market_id

    def _take_over(self, group: dict[str, Any]) -> None:
        """A group a dead (or fenced-off) consumer left in flight: raise the fence, then
        place the bids after the last position it committed. Those it committed get no
        answer from here (it may still send theirs; else their requests time out)."""
        self.q.stats["took_over"] += 1
        market_id = self._market()
        done = -1
        if market_id is not None:
            committed_group, committed_through = locking.take_over(market_id, self.token)
            if committed_group == group["group"]:
                done = committed_through
        log.warning("bid queue of %s: taking over group %s (%d bids, committed through "
                    "%d)", self.slug, group["group"], len(group["items"]), done)
        self._place(group, skip_through=done)

    def _place(self, group: dict[str, Any], skip_through: int = -1) -> None:
        items = [json.loads(x) for x in group["items"]]
        replies: list[tuple[str, dict[str, Any]]] = []
        now = time.time()
        live = []
        for pos, item in enumerate(items):
            if pos <= skip_through:
                continue
            if item["d"] < now:
                replies.append((item["r"], {"id": item["id"], "k": "not_placed", "b": {
                    "detail": "the bid waited in the market's queue past its deadline; it "
                              "was not placed: place it again"}}))
            else:
                live.append((pos, item))
        try:
            if live:
                replies += self._write(group["group"], live)
        finally:
            self._reply(replies)
            self.q._done(keys=self.keys("owner", "proc"), args=[self.me, group["group"]])

    def _write(self, group_id: str, live: list[tuple[int, dict[str, Any]]]
               ) -> list[tuple[str, dict[str, Any]]]:
        from marketplace.api.bid_batcher import _answer
        from marketplace.db_unavailable import is_database_unavailable

        try:
            users = api_tokens.user_ids_by_hash({item["h"] for _, item in live})
            known = [(pos, item) for pos, item in live if item["h"] in users]
            bids = [replace(decode_bid(item["b"]), buyer_id=users[item["h"]])
                    for _, item in known]
            fence = locking.Fence(self.token, group_id, [pos for pos, _ in known])
            results = book.place_bids(bids, fence=fence) if bids else []
        except locking.Fenced:
            raise  # nothing written, no answer: the new owner places them
        except Exception as exc:
            log.exception("bid queue of %s: placing a group of %d bids failed", self.slug,
                          len(live))
            connection.close()
            kind = "not_placed" if is_database_unavailable(exc) else "error"
            return [(item["r"], {"id": item["id"], "k": kind, "b": {
                "detail": "no database connection" if kind == "not_placed" else repr(exc)}})
                    for _, item in live]
        stats = self.q.stats
        stats["groups"] += 1
        stats["bids"] += len(live)
        stats["largest"] = max(stats["largest"], len(live))
        by_pos = dict(zip((pos for pos, _ in known), results, strict=True))
        out = []
        for pos, item in live:
            if pos not in by_pos:
                out.append((item["r"], {"id": item["id"], "k": "unauthenticated"}))
                continue
            answer = _answer(by_pos[pos])
            if isinstance(answer, Exception):
                out.append((item["r"], {"id": item["id"], "k": "error", "b": {
                    "detail": repr(answer)}}))
            else:
                status, body = answer
                out.append((item["r"], {"id": item["id"], "k": "answer", "s": status,
                                        "b": _plain(body)}))
        return out

    def _reply(self, replies: list[tuple[str, dict[str, Any]]]) -> None:
        if not replies:
            return
        pipe = self.q.redis.pipeline(transaction=False)
        for key, reply in replies:
            pipe.rpush(key, json.dumps(reply, separators=(",", ":")))
        for key in {k for k, _ in replies}:
            pipe.expire(key, 120)
        pipe.execute()


def _plain(body: Any) -> Any:
    """The answer as JSON data (what the JSONRenderer would write)."""
    from rest_framework.renderers import JSONRenderer

    return json.loads(JSONRenderer().render(body))
