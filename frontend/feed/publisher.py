"""The feed's publisher thread (one per process): reads committed batches, coalesces depth,
numbers and sends the events. docs/FEED_PROTOCOL.md, Publishing and Redis restarts."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from typing import TYPE_CHECKING, Any

from channels.layers import get_channel_layer
from django.db import connections
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core import metrics
from core.after_commit import AfterCommitThread, PerProcess, group_send_all, namespace
from core.after_commit import is_local as _is_local
from frontend.feed.counters import DEPTH_COVERED, DEPTH_WAIT, counter
from frontend.feed.local import _hubs
from frontend.feed.payloads import depth_payload, summary_of_depth
from frontend.feed.protocol import EVENT_TYPE, SUMMARY_GROUP, _setting, market_group

if TYPE_CHECKING:
    from frontend.feed.batch import Batch

log = logging.getLogger("gpumarket.feed")


#: errors of an unreachable (restarting, loading) Redis: the publisher keeps the batch
#: (or a layer file locked past its busy timeout: core/sqlite_layer.py)
_REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, ConnectionError, sqlite3.OperationalError)


class Publisher(AfterCommitThread["Batch"]):
    """One daemon thread per process that turns committed batches into feed messages:
    the reads, the sequence numbers and the sends happen here, in commit order; batches
    that queued up meanwhile are merged (one read per table for all of them); a market's
    depth is coalesced (docs/FEED_PROTOCOL.md, Publishing)."""

    IDLE_CLOSE_S = 1.0  # close this thread's database connection after this idle time

    def __init__(self) -> None:
        super().__init__("feed-publisher")
        # market pk → (due, committed_at of the earliest change, its last change's number)
        self._dirty: dict[int, tuple[float, float, int]] = {}
        self.depth_covered = 0  # depths left to another process's publication
        self._last_depth: dict[int, float] = {}
        self._markets: dict[int, Any] = {}
        self.delays: dict[tuple[str, int], float] | None = None  # bench: (group, seq) → ts − commit
        self._retained: Batch | None = None  # a batch kept while Redis does not answer
        self._failures = 0  # rounds failed in a row on Redis

    def busy(self) -> bool:
        """`flush` waits for every submitted batch, coalesced depth included (while Redis
        does not answer, batches are kept: flush returns False after its timeout)."""
        return bool(self._unfinished or self._dirty or self._retained is not None)

    # -- the thread
    def run(self) -> None:
        idle_since: float | None = None
        while True:
            now = time.monotonic()
            wait = min((due for due, *_ in self._dirty.values()), default=None)
            timeout = self.IDLE_CLOSE_S if wait is None else max(0.0, wait - now)
            if self._retained is not None:
                timeout = min(timeout, self._retry_delay())
            taken = self.take(timeout)
            merged: Batch | None = self._retained
            for b in taken:
                if merged is None:
                    merged = b
                else:
                    merged.merge(b)
            retained: Batch | None = None
            dirty_before = dict(self._dirty)
            try:
                self._publish_round(merged)
                if self._failures:
                    log.warning("live feed: Redis answers again; publishing resumed")
                self._failures = 0
            except _REDIS_DOWN as exc:
                # Nothing of this round may be lost silently: keep the batch (its rows are
                # read again, fresh) and the depths that were due, and try again. Numbers
                # already taken for messages that were not sent show as a gap: resync.
                retained = merged
                for pk, entry in dirty_before.items():
                    self._dirty.setdefault(pk, entry)
                self._failures += 1
                if self._failures == 1:
                    log.warning("live feed: Redis unreachable (%s); the changes are kept and "
                                "published when it answers again", exc)
            except Exception:
                log.exception("live feed: publishing after commit failed; clients resync")
                self._dirty.clear()
            finally:
                with self._cond:  # (a reentrant lock: done() takes it too)
                    self._retained = retained
                    self.done(len(taken))
            if merged is None and not self._dirty:
                if idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= self.IDLE_CLOSE_S:
                    connections.close_all()  # no idle connection held between bursts
                    idle_since = None
            else:
                idle_since = None

    def _retry_delay(self) -> float:
        """Seconds before the next try after `_failures` failed rounds: 0.05 doubling to 1."""
        return min(1.0, 0.05 * 2 ** min(self._failures, 5))

    def _publish_round(self, merged: Batch | None) -> None:
        now = time.monotonic()
        out: list[tuple[str, dict[str, Any], int | None, float]] = []
        interval = _setting("FEED_DEPTH_INTERVAL", 0.1)
        if merged is not None:
            noted: dict[int, float] = {}
            # Order, balance and metrics messages only for users someone listens to
            # (/ws/me/): asked after commit and before reading, for the users concerned
            # only (their ids read first), and a subscriber reads its snapshot after
            # subscribing, so a change it was not sent is in its snapshot.
            for group, payload, user_id in merged.messages(counter().listening_among):
                market = payload.pop("_depth_of", None)
                if market is None:
                    out.append((group, payload, user_id, merged.committed_at))
                    continue
                self._markets[market.pk] = market
                noted[market.pk] = max(now, self._last_depth.get(market.pk, 0.0) + interval)
            numbers = counter().depth_changes(sorted(noted)) if noted else {}
            for pk, due in noted.items():
                if pk in self._dirty:  # the earlier due and commit time, the later change
                    old_due, old_commit, old_need = self._dirty[pk]
                    self._dirty[pk] = (min(old_due, due), min(old_commit, merged.committed_at),
                                       max(old_need, numbers[pk]))
                else:
                    self._dirty[pk] = (due, merged.committed_at, numbers[pk])
        for pk, (due, committed_at, need) in sorted(self._dirty.items()):
            if due > now:
                continue
            turn, value = counter().depth_turn(pk, need, interval)
            if turn == DEPTH_WAIT:  # another process publishes this market's depth now
                self._dirty[pk] = (now + value, committed_at, need)
                continue
            del self._dirty[pk]
            if turn == DEPTH_COVERED:  # ... and it was read after this process's changes
                self.depth_covered += 1
                continue
            market = self._markets[pk]
            out.append((market_group(market.slug),
                        {"type": "depth", "_depth_of": market, "_covers": (pk, value)},
                        None, committed_at))
            out.append((SUMMARY_GROUP, {"type": "market_summary", "_summary_of": market},
                        None, committed_at))
            self._last_depth[pk] = now
        if out:
            self._send(out)

    def _send(self, messages: list[tuple[str, dict[str, Any], int | None, float]]) -> None:
        epoch, seqs = counter().next_many([group for group, *_ in messages])
        events, covers, ns = [], [], namespace()
        depths: dict[int, dict[str, Any]] = {}  # market pk → the depth just read
        for (group, payload, user_id, committed_at), seq in zip(messages, seqs, strict=True):
            depth_of = payload.pop("_depth_of", None)
            if depth_of is not None:  # read after its seq was taken (FEED_PROTOCOL.md)
                covers.append(payload.pop("_covers"))
                depths[depth_of.pk] = depth_payload(depth_of)
                payload.update(depths[depth_of.pk])
            summary_of = payload.pop("_summary_of", None)
            if summary_of is not None:  # from the depth read just before it (its seq - 1)
                payload.update(summary_of_depth(depths[summary_of.pk]))
            ts = time.time()
            payload = {**payload, "seq": seq, "ts": ts}
            if self.delays is not None:
                self.delays[(group, seq)] = ts - committed_at
            events.append({"type": EVENT_TYPE, "group": group, "seq": seq, "user": user_id,
                           "ns": ns, "epoch": epoch,
                           "text": json.dumps(payload, separators=(",", ":"))})
        send_events(events, self._loop)
        metrics.feed_messages(events)
        for pk, value in covers:  # only once sent: others may now skip their own depth
            counter().depth_done(pk, value)


# a short-lived process (a management command, a task run) publishes what it committed
# before it exits
_publisher: PerProcess[Publisher] = PerProcess(Publisher, flush_at_exit=True)


def publisher() -> Publisher:
    return _publisher.get()


def flush(timeout: float = 10.0) -> bool:
    """Block until everything committed so far in this process has been published."""
    return publisher().flush(timeout)


def send_events(events: list[dict[str, Any]], loop: asyncio.AbstractEventLoop) -> None:
    """Deliver numbered events: through the channel layer (Redis pub/sub or the embedded
    default's SQLite file: every process's hub that subscribed the group), or, with the
    in-memory layer, straight to this process's hubs (where web and publisher are one
    process)."""
    layer = get_channel_layer()
    if layer is None or _is_local(layer):
        for hub in list(_hubs.values()):
            if not hub.loop.is_closed():
                hub.loop.call_soon_threadsafe(hub.deliver_many, events)
        return

    loop.run_until_complete(group_send_all(layer, [(event["group"], event)
                                                   for event in events]))
