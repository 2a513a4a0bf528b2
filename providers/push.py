"""Push to runners: after commit, a `leases_changed` notice (numbered per node) or a
token-rotation check on the node's websocket group `runner.node.<id>`; the messages and
their rules: docs/RUNNER_PROTOCOL.md, "Websocket /ws/runner/". The market notes nodes with
`leases_changed(node_id)` (marketplace/runner_push.py), providers with
`token_rotated(node_id)`; a rolled-back transaction sends nothing (core/after_commit.py).
Numbers: INCR of `gpumarket:runner:seq:<node id>` on REDIS_URL; without it in the embedded
default's channel-layer file (core/sqlite_layer.py), in-process with the in-memory layer.
With the in-memory layer the send runs on the event loop of each local runner connection
(register_loop), where its queues live; a notice carries `ns` (namespace()).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

import redis
from channels.layers import get_channel_layer
from django.conf import settings

from core.after_commit import (
    AfterCommitThread,
    LocalCounter,
    PerProcess,
    group_send_all,
    namespace,
    note,
    redis_url,
)
from core.after_commit import is_local as _is_local
from core.sqlite_layer import Store

log = logging.getLogger("gpumarket.runner_push")

GROUP_PREFIX = "runner.node."
#: the channel-layer message type; Channels calls RunnerConsumer.runner_leases_changed
EVENT_TYPE = "runner.leases_changed"
#: Channels calls RunnerConsumer.runner_token_rotated: close if its token is no longer valid
ROTATED_TYPE = "runner.token_rotated"
SEQ_KEY = "gpumarket:runner:seq:"


def completeness(layer) -> str:
    """What `hello` tells the runner of its notices: "complete" when the channel layer is
    shared by every marketplace process (Redis, the embedded default's SQLite file), so
    every change is pushed, whichever
    process made it; "partial" with the in-memory layer (no REDIS_URL), where only this
    process's own changes reach its runner connections, not the Celery worker's (auction
    close, preemption, silent nodes, overdue leases): the runner then keeps polling."""
    return "partial" if layer is None or _is_local(layer) else "complete"


def node_group(node_id: int) -> str:
    """The Channels group of a node's runner connections: 'runner.node.<id>'."""
    return f"{GROUP_PREFIX}{int(node_id)}"


# ----------------------------------------------------------------- sequence numbers

class _RedisCounter:
    def __init__(self, url: str) -> None:
        self._redis = redis.Redis.from_url(url)

    def incr_many(self, node_ids: list[int]) -> list[int]:
        pipe = self._redis.pipeline(transaction=False)
        for node_id in node_ids:
            pipe.incr(f"{SEQ_KEY}{node_id}")
        return [int(v) for v in pipe.execute()]

    def get(self, node_id: int) -> int:
        return int(self._redis.get(f"{SEQ_KEY}{node_id}") or 0)


class _FileCounter:
    """Without Redis, on the embedded default's channel-layer file (core/sqlite_layer.py):
    shared by every process on it, as the layer is."""

    def __init__(self, path: str) -> None:
        self._store = Store(path)

    def incr_many(self, node_ids: list[int]) -> list[int]:
        return self._store.numbers([f"{SEQ_KEY}{n}" for n in node_ids], 0, take=True)[1]

    def get(self, node_id: int) -> int:
        return self._store.numbers([f"{SEQ_KEY}{node_id}"], 0, take=False)[1][0]


def _layer_file() -> str | None:
    config = settings.CHANNEL_LAYERS.get("default", {})
    if str(config.get("BACKEND", "")).endswith("sqlite_layer.SQLiteChannelLayer"):
        return str(config.get("CONFIG", {})["path"])
    return None


def _make_counter() -> LocalCounter | _RedisCounter | _FileCounter:
    url = redis_url()
    if url:
        return _RedisCounter(url)
    path = _layer_file()
    return _FileCounter(path) if path else LocalCounter()


_counter: PerProcess[LocalCounter | _RedisCounter | _FileCounter] = PerProcess(
    _make_counter, key=lambda: (redis_url(), _layer_file()))


def _the_counter() -> LocalCounter | _RedisCounter:
    return _counter.get()


def current_seq(node_id: int) -> int:
    """The node's last sequence number (0 before the first notice). Blocking (Redis)."""
    return _the_counter().get(node_id)


# ----------------------------------------------------------------- after commit

class _Pending:
    """The nodes noted in one transaction (leases changed; runner token rotated); the
    on_commit callback (cheap: no I/O)."""

    def __init__(self) -> None:
        self.nodes: set[int] = set()
        self.rotated: set[int] = set()

    def __call__(self) -> None:
        try:
            notifier().submit(self.nodes, rotated=self.rotated)
        except Exception:  # the data is committed; the runner's next poll finds it
            log.exception("runner push: queueing after commit failed")


def leases_changed(node_id: int) -> None:
    """Note that a lease of `node_id` changed; the node's runners get one notice after the
    current transaction commits (at once outside a transaction). Never raises for a
    delivery problem: runners poll as a fallback."""
    note(_Pending, lambda pending: pending.nodes.add(int(node_id)))


def token_rotated(node_id: int) -> None:
    """Note that the runner token of `node_id` was replaced; after the current transaction
    commits, the node's websocket connections opened with another token close (4401).
    Connections that open meanwhile check their token once more after joining the group
    (RunnerConsumer.connect), so none opened with the old token stays."""
    note(_Pending, lambda pending: pending.rotated.add(int(node_id)))


# ----------------------------------------------------------------- local connections

_local_loops: dict[asyncio.AbstractEventLoop, int] = {}
_local_lock = threading.Lock()


def register_loop(loop: asyncio.AbstractEventLoop) -> None:
    """A runner connection opened on `loop` (the in-memory layer delivers there)."""
    with _local_lock:
        _local_loops[loop] = _local_loops.get(loop, 0) + 1


def unregister_loop(loop: asyncio.AbstractEventLoop) -> None:
    with _local_lock:
        left = _local_loops.get(loop, 0) - 1
        if left > 0:
            _local_loops[loop] = left
        else:
            _local_loops.pop(loop, None)


# ----------------------------------------------------------------- the notifier thread

class Notifier(AfterCommitThread[tuple[set[int], set[int]]]):
    """One daemon thread per process: takes committed node sets (nodes whose leases
    changed, nodes whose runner token was rotated), numbers and sends the notices. Sets
    that queued up meanwhile are merged (one notice per node per round)."""

    def __init__(self) -> None:
        super().__init__("runner-push")
        self.sent: list[tuple[int, int, float]] = []  # (node, seq, time.time()), last 1000

    def submit(self, nodes: set[int], *,  # type: ignore[override]
               rotated: set[int] | frozenset[int] = frozenset()) -> None:
        if nodes or rotated:
            super().submit((set(nodes), set(rotated)))

    def run(self) -> None:
        while True:
            taken = self.take()
            nodes: set[int] = set()
            rotated: set[int] = set()
            for more, more_rotated in taken:
                nodes |= more
                rotated |= more_rotated
            try:
                self._send(sorted(nodes), sorted(rotated))
            except Exception:
                log.exception("runner push: sending notices for nodes %s (token rotated: "
                              "%s) failed; their runners find the change on their next "
                              "poll", sorted(nodes), sorted(rotated))
            finally:
                self.done(len(taken))

    def _send(self, node_ids: list[int], rotated: list[int] | None = None) -> None:
        seqs = _the_counter().incr_many(node_ids) if node_ids else []
        layer = get_channel_layer()
        if layer is None:
            return
        ns = namespace()
        events = [(node_group(n), {"type": ROTATED_TYPE, "ns": ns}) for n in rotated or []]
        events += [(node_group(n), {"type": EVENT_TYPE, "seq": s, "ns": ns})
                   for n, s in zip(node_ids, seqs, strict=True)]
        if _is_local(layer):
            with _local_lock:
                loops = list(_local_loops)
            for loop in loops:
                if not loop.is_closed():
                    with contextlib.suppress(RuntimeError):  # closed meanwhile
                        asyncio.run_coroutine_threadsafe(group_send_all(layer, events),
                                                         loop).result(5)
        else:
            self._loop.run_until_complete(group_send_all(layer, events))
        now = time.time()
        self.sent.extend((n, s, now) for n, s in zip(node_ids, seqs, strict=True))
        del self.sent[:-1000]


_notifier: PerProcess[Notifier] = PerProcess(Notifier, flush_at_exit=True)


def notifier() -> Notifier:
    """This process's notifier (started on first use; flushed at exit)."""
    return _notifier.get()


def flush(timeout: float = 10.0) -> bool:
    """Block until every notice committed so far in this process has been sent."""
    return notifier().flush(timeout)
