"""Publishing after commit, shared by the live feed (frontend/feed/) and the runners'
push notices (providers/push.py): collect in the transaction (`collector`, `note`), send
from one thread per process once it commits (`AfterCommitThread`, `group_send_all`),
number per group (`LocalCounter`; Redis counters are each user's own), tag with the Redis
database (`namespace`). No domain logic. The protocols: docs/FEED_PROTOCOL.md and
docs/RUNNER_PROTOCOL.md.
"""

from __future__ import annotations

import asyncio
import atexit
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

from channels.layers import InMemoryChannelLayer
from django.conf import settings
from django.db import connection, transaction
from redis.connection import parse_url

T = TypeVar("T")
C = TypeVar("C", bound=Callable[[], Any])


# ----------------------------------------------------------------- the channel layer

def redis_url() -> str:
    """REDIS_URL ("" without Redis: the channel layer and its counters on a SQLite file,
    core/sqlite_layer.py)."""
    return getattr(settings, "REDIS_URL", "")


def namespace() -> str:
    """The Redis database of REDIS_URL ("" without Redis). Redis pub/sub channels are
    server-wide, not per database: a deployment (or a test run) on another database of the
    same server publishes on the same channel names with its own numbering and ids. Every
    published message carries this, and receivers drop messages of another namespace."""
    url = redis_url()
    if not url:
        return ""
    return str(parse_url(url).get("db", 0))


def is_local(layer) -> bool:
    """Whether `layer` is Channels' in-memory layer: it reaches this process only (the
    embedded default's SQLite layer crosses processes: not local)."""
    return isinstance(layer, InMemoryChannelLayer)


async def group_send_all(layer, messages: Iterable[tuple[str, dict[str, Any]]]) -> None:
    """Send each (group, message) through `layer`, in order (in one write where the layer
    can: core/sqlite_layer.py)."""
    many = getattr(layer, "group_send_many", None)
    if many is not None:
        await many(list(messages))
        return
    for group, message in messages:
        await layer.group_send(group, message)


# ----------------------------------------------------------------- in the transaction

def registered(kind: type[C]) -> C | None:
    """The `kind` collector among the current transaction's on_commit callbacks, if any.
    Looked up among the callbacks themselves, so a rolled-back savepoint that registered
    it takes it away with it (no stale state to clean up)."""
    for entry in reversed(connection.run_on_commit):
        if isinstance(entry[1], kind):
            return entry[1]
    return None


def collector(kind: type[C]) -> C:
    """The current transaction's `kind()` (a cheap callable, run on commit), registered
    with on_commit on first use. Outside a transaction (autocommit): a fresh one, which the
    caller runs itself (see `note`)."""
    if not connection.in_atomic_block:
        return kind()
    found = registered(kind)
    if found is None:
        found = kind()
        transaction.on_commit(found)
    return found


def note(kind: type[C], add: Callable[[C], None]) -> None:
    """`add(collector)` in the current transaction: it runs after commit (never after a
    rollback); outside a transaction at once."""
    found = collector(kind)
    add(found)
    if not connection.in_atomic_block:
        found()


# ----------------------------------------------------------------- after commit

class AfterCommitThread(Generic[T]):
    """One daemon thread per process that takes what committed transactions submitted and
    sends it. Subclasses write `run()` (the loop; `take` the next items, `done` once
    handled) and may widen `busy()` (what `flush` waits for; called under `_cond`)."""

    ROUND = 500  # items taken together at most (merged into one round by the caller)

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[T] = queue.SimpleQueue()
        self._cond = threading.Condition()
        self._unfinished = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the thread's, for sends

    def submit(self, item: T) -> None:
        """Queue `item` (from an on_commit callback: no I/O); starts the thread if needed."""
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._main, name=self.name,
                                                daemon=True)
                self._thread.start()
            self._unfinished += 1
        self._queue.put(item)

    def busy(self) -> bool:
        return self._unfinished > 0

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until nothing submitted is left (`busy()` false); False after `timeout` s."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.busy():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def take(self, timeout: float | None = None) -> list[T]:
        """The next item (waiting up to `timeout` s, None: for ever; [] when none came) and
        whatever queued meanwhile, ROUND items at most."""
        try:
            items = [self._queue.get(timeout=timeout)]
        except queue.Empty:
            return []
        while len(items) < self.ROUND:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return items

    def done(self, taken: int) -> None:
        """`taken` items are handled (sent, or given up): wakes `flush`."""
        with self._cond:
            self._unfinished -= taken
            self._cond.notify_all()

    def _main(self) -> None:
        self._loop = asyncio.new_event_loop()
        self.run()

    def run(self) -> None:
        raise NotImplementedError


class PerProcess(Generic[T]):
    """One `make()` per process, made on first use. `flush_at_exit`: its `flush(5.0)` runs
    when the process exits, so a short-lived one (a management command, a task run) sends
    what it committed. `key`: made again whenever key() changes (e.g. REDIS_URL, so no
    thread keeps an old server's). `reset()` forgets it (tests: the next use follows the
    settings)."""

    def __init__(self, make: Callable[[], T], *, flush_at_exit: bool = False,
                 key: Callable[[], Hashable] | None = None) -> None:
        self._make = make
        self._flush_at_exit = flush_at_exit
        self._key = key
        self._made_for: Hashable = None
        self._lock = threading.Lock()
        self._value: T | None = None

    def get(self) -> T:
        key = self._key() if self._key is not None else None
        with self._lock:
            if self._value is None or key != self._made_for:
                self._value, self._made_for = self._make(), key
                if self._flush_at_exit:
                    atexit.register(self._value.flush, 5.0)
            return self._value

    def reset(self) -> None:
        with self._lock:
            self._value = None


class LocalCounter:
    """Sequence numbers per group, in this process (without REDIS_URL): they start at 1
    and never reset while the process lives."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[Hashable, int] = defaultdict(int)

    def incr(self, group: Hashable) -> int:
        return self.incr_many([group])[0]

    def incr_many(self, groups: Iterable[Hashable]) -> list[int]:
        """The next number of each group (a group listed twice gets two)."""
        with self._lock:
            out = []
            for group in groups:
                self._values[group] += 1
                out.append(self._values[group])
            return out

    def get(self, group: Hashable) -> int:
        """The group's last number (0 before the first)."""
        with self._lock:
            return self._values[group]
