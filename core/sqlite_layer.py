"""A Channels layer on a local SQLite file: crosses the processes of one machine (web,
Celery worker, beat, management commands) with no server to install. The embedded
default's layer when REDIS_URL is unset (marketplace/settings.py); the live feed's
sequence numbers live in the same file (`Store.next_many`). Semantics, bounds and why:
docs/FEED_PROTOCOL.md, "The embedded default's layer".

CONFIG: `path` (the file, made on first use), `expiry` (s a message waits for its
receiver, 60), `group_expiry` (s a membership lives unless its process's reader renews
it, 120), `capacity` (messages queued per channel, 1000), `poll_interval` (s, 0.02).
Errors: `channels.exceptions.ChannelFull` from `send` to a full channel (a group send
skips a full member, as Channels' layers do); sqlite3.OperationalError when the file
stays locked past its busy timeout (5 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import sqlite3
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import msgpack
from channels.exceptions import ChannelFull
from channels.layers import BaseChannelLayer

log = logging.getLogger("gpumarket.channels")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
  id INTEGER PRIMARY KEY AUTOINCREMENT, channel TEXT NOT NULL, owner TEXT NOT NULL,
  body BLOB NOT NULL, expires REAL NOT NULL);
CREATE INDEX IF NOT EXISTS messages_owner ON messages (owner, id);
CREATE INDEX IF NOT EXISTS messages_channel ON messages (channel);
CREATE INDEX IF NOT EXISTS messages_expires ON messages (expires);
CREATE TABLE IF NOT EXISTS memberships (
  grp TEXT NOT NULL, channel TEXT NOT NULL, owner TEXT NOT NULL, expires REAL NOT NULL,
  PRIMARY KEY (grp, channel));
CREATE INDEX IF NOT EXISTS memberships_owner ON memberships (owner);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


def owner_of(channel: str) -> str:
    """Who reads `channel`: a process-specific channel (`…!…`) is read by the reader of
    its non-local part; any other channel by whoever receives on it by name."""
    return channel[: channel.index("!") + 1] if "!" in channel else channel


def _wal(conn: sqlite3.Connection) -> None:
    """WAL mode (persistent in the file). Switching takes an exclusive lock and SQLite
    answers "database is locked" at once, without its busy timeout, while another
    process opens the same file: read the mode first, and retry the switch for up to 5 s."""
    deadline = time.monotonic() + 5.0
    while conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        try:
            conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Store:
    """The file, one connection per thread (WAL: readers never wait for the writer).
    Plain blocking calls; the layer runs them in a thread."""

    PRUNE_EVERY = 1.0  # s between two deletions of expired rows by one process

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._local = threading.local()
        self._pid = os.getpid()
        self._pruned = 0.0
        self._epoch: str | None = None

    def db(self) -> sqlite3.Connection:
        if self._pid != os.getpid():  # a forked child never uses its parent's connections
            self._local, self._pid = threading.local(), os.getpid()
        conn = getattr(self._local, "conn", None)
        if conn is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None,
                                   check_same_thread=False)
            _wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")  # a lost message is a resync, no more
            conn.executescript(_SCHEMA)
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('epoch', ?)", (secrets.token_hex(8),))
            self._local.conn = conn
        return conn

    @contextlib.contextmanager
    def write(self):
        conn = self.db()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _prune(self, conn: sqlite3.Connection, now: float) -> None:
        if now - self._pruned < self.PRUNE_EVERY:
            return
        self._pruned = now
        conn.execute("DELETE FROM messages WHERE expires < ?", (now,))
        conn.execute("DELETE FROM memberships WHERE expires < ?", (now,))

    # -- messages
    def send(self, channel: str, body: bytes, expiry: float, capacity: int) -> bool:
        """Queue one message; False when the channel already holds `capacity`."""
        now = time.time()
        with self.write() as conn:
            self._prune(conn, now)
            (queued,) = conn.execute("SELECT COUNT(*) FROM messages WHERE channel = ? "
                                     "AND expires >= ?", (channel, now)).fetchone()
            if queued >= capacity:
                return False
            conn.execute("INSERT INTO messages (channel, owner, body, expires) "
                         "VALUES (?, ?, ?, ?)", (channel, owner_of(channel), body, now + expiry))
            return True

    def group_send_many(self, items: list[tuple[str, bytes]], expiry: float,
                        capacity: int) -> None:
        """One message per current member of each group, in order, in one transaction;
        a member that holds `capacity` messages is skipped."""
        now = time.time()
        with self.write() as conn:
            self._prune(conn, now)
            for group, body in items:
                conn.execute(
                    "INSERT INTO messages (channel, owner, body, expires) "
                    "SELECT g.channel, g.owner, ?, ? FROM memberships g "
                    "WHERE g.grp = ? AND g.expires >= ? AND (SELECT COUNT(*) FROM messages m "
                    "WHERE m.channel = g.channel) < ?",
                    (body, now + expiry, group, now, capacity))

    def take(self, owners: list[str], limit: int = 500) -> list[tuple[str, bytes]]:
        """Remove and return the oldest unexpired messages of `owners` (as one JSON list
        parameter), oldest first."""
        if not owners:
            return []
        conn = self.db()
        now = time.time()
        # a read first: most polls find nothing and take no write lock
        found = conn.execute("SELECT id, channel, body FROM messages WHERE owner IN "
                             "(SELECT value FROM json_each(?)) AND expires >= ? "
                             "ORDER BY id LIMIT ?",
                             (json.dumps(owners), now, limit)).fetchall()
        if not found:
            return []
        with self.write() as conn:
            conn.execute("DELETE FROM messages WHERE id <= ? AND owner IN "
                         "(SELECT value FROM json_each(?))",
                         (found[-1][0], json.dumps(owners)))
        return [(channel, body) for _id, channel, body in found]

    # -- groups
    def group_add(self, group: str, channel: str, expiry: float) -> None:
        with self.write() as conn:
            conn.execute("INSERT OR REPLACE INTO memberships VALUES (?, ?, ?, ?)",
                         (group, channel, owner_of(channel), time.time() + expiry))

    def group_discard(self, group: str, channel: str) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM memberships WHERE grp = ? AND channel = ?",
                         (group, channel))

    def renew(self, owners: list[str], expiry: float) -> None:
        """Memberships of channels these readers serve live `expiry` s more."""
        if owners:
            with self.write() as conn:
                conn.execute("UPDATE memberships SET expires = ? WHERE owner IN "
                             "(SELECT value FROM json_each(?))",
                             (time.time() + expiry, json.dumps(owners)))

    def groups_like(self, prefix: str) -> set[str]:
        """Groups starting with `prefix` that have a live member (in any process)."""
        rows = self.db().execute("SELECT DISTINCT grp FROM memberships WHERE grp >= ? AND "
                                 "grp < ? AND expires >= ?",
                                 (prefix, prefix + "\uffff", time.time())).fetchall()
        return {grp for (grp,) in rows}

    def flush(self) -> None:
        with self.write() as conn:
            conn.execute("DELETE FROM messages")
            conn.execute("DELETE FROM memberships")

    # -- sequence numbers (docs/FEED_PROTOCOL.md, Epochs)
    def epoch(self) -> str:
        """The file's id, made with it: a new file (deleted, replaced) is a new epoch."""
        (value,) = self.db().execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
        return value

    def numbers(self, names: list[str], floor: int, take: bool) -> tuple[str, list[int]]:
        """(epoch, the next number of each name (take) or its last one): a name seen for
        the first time starts at `floor`; one listed twice gets two."""
        out = []
        with self.write() as conn:
            (epoch,) = conn.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
            for name in names:
                row = conn.execute("SELECT value FROM counters WHERE name = ?",
                                   (name,)).fetchone()
                value = floor if row is None else row[0]
                if take:
                    value += 1
                if take or row is None:
                    conn.execute("INSERT OR REPLACE INTO counters VALUES (?, ?)", (name, value))
                out.append(value)
        return epoch, out


async def _blocking(fn, *args):
    """`fn(*args)` in a thread; in the caller's own thread once the interpreter is shutting
    down (a short-lived process publishing what it committed at exit gets no new thread)."""
    try:
        return await asyncio.to_thread(fn, *args)
    except RuntimeError as exc:
        if "shutdown" not in str(exc):
            raise
        return fn(*args)


class _Reader:
    """One per event loop: polls the file for the messages of this loop's channels and
    hands them to per-channel queues; renews their group memberships."""

    RENEW_EVERY = 30.0

    def __init__(self, layer: SQLiteChannelLayer, client: str) -> None:
        self.layer = layer
        self.client = client
        self.queues: dict[str, asyncio.Queue] = {}
        self.task: asyncio.Task | None = None
        self.wake = asyncio.Event()

    def owners(self) -> list[str]:
        return sorted({owner_of(channel) for channel in self.queues})

    def queue(self, channel: str) -> asyncio.Queue:
        found = self.queues.get(channel)
        if found is None:
            found = self.queues[channel] = asyncio.Queue(self.layer.capacity)
            if self.task is None or self.task.done():
                self.task = asyncio.get_running_loop().create_task(self._poll())
        return found

    async def _poll(self) -> None:
        renewed = 0.0
        store, layer = self.layer.store, self.layer
        while self.queues:
            owners = self.owners()
            try:
                if time.monotonic() - renewed > self.RENEW_EVERY:
                    await _blocking(store.renew, owners, layer.group_expiry)
                    renewed = time.monotonic()
                found = await _blocking(store.take, owners)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # e.g. locked past the busy timeout: the next round
                log.warning("channel layer %s: %s", store.path, exc)
                found = []
            for channel, body in found:
                queue = self.queues.get(channel)
                if queue is not None and not queue.full():  # (full: as a full channel)
                    with contextlib.suppress(ValueError):  # not msgpack: not ours
                        queue.put_nowait(msgpack.unpackb(body, raw=False))
            if not found:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), layer.poll_interval)


class SQLiteChannelLayer(BaseChannelLayer):
    """Channels' layer API (send, receive, new_channel, group_add, group_discard,
    group_send, flush) on a SQLite file shared by every process of the machine."""

    extensions = ["groups", "flush"]

    def __init__(self, path: str, expiry: float = 60, group_expiry: float = 120,
                 capacity: int = 1000, channel_capacity=None, poll_interval: float = 0.02,
                 **kwargs: Any) -> None:
        super().__init__(expiry=expiry, capacity=capacity, channel_capacity=channel_capacity)
        self.group_expiry = group_expiry
        self.poll_interval = poll_interval
        self.store = Store(path)
        self._readers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Reader] = \
            weakref.WeakKeyDictionary()

    @staticmethod
    def _pack(message: dict[str, Any]) -> bytes:
        assert isinstance(message, dict), "message is not a dict"
        return msgpack.packb(message, use_bin_type=True)

    def _reader(self) -> _Reader:
        loop = asyncio.get_running_loop()
        found = self._readers.get(loop)
        if found is None:
            found = self._readers[loop] = _Reader(self, secrets.token_hex(6))
        return found

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        assert self.require_valid_channel_name(channel)
        ok = await _blocking(self.store.send, channel, self._pack(message), self.expiry,
                             self.get_capacity(channel))
        if not ok:
            raise ChannelFull(channel)
        self._wake_local()

    async def receive(self, channel: str) -> dict[str, Any]:
        assert self.require_valid_channel_name(channel)
        if "!" in channel:
            reader = self._reader()
            queue = reader.queue(channel)
            try:
                return await queue.get()
            except asyncio.CancelledError:  # its consumer is gone: forget the channel
                if reader.queues.get(channel) is queue and queue.empty():
                    del reader.queues[channel]
                raise
        while True:
            found = await _blocking(self.store.take, [channel], 1)
            if found:
                return msgpack.unpackb(found[0][1], raw=False)
            await asyncio.sleep(self.poll_interval)

    async def new_channel(self, prefix: str = "specific.") -> str:
        reader = self._reader()
        name = f"{prefix}{reader.client}!{secrets.token_hex(8)}"
        reader.queue(name)  # read from now on: nothing sent to it before its receive is lost
        return name

    async def group_add(self, group: str, channel: str) -> None:
        assert self.require_valid_group_name(group)
        assert self.require_valid_channel_name(channel)
        await _blocking(self.store.group_add, group, channel, self.group_expiry)

    async def group_discard(self, group: str, channel: str) -> None:
        await _blocking(self.store.group_discard, group, channel)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        await self.group_send_many([(group, message)])

    async def group_send_many(self, messages: list[tuple[str, dict[str, Any]]]) -> None:
        """Several group sends in one write, in order (the feed's publisher)."""
        for group, _ in messages:
            assert self.require_valid_group_name(group)
        items = [(group, self._pack(message)) for group, message in messages]
        capacity = self.capacity
        await _blocking(self.store.group_send_many, items, self.expiry, capacity)
        self._wake_local()

    def _wake_local(self) -> None:
        """This process's readers poll at once (other processes' within poll_interval)."""
        for loop, reader in list(self._readers.items()):
            if reader.queues and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # closed meanwhile
                    loop.call_soon_threadsafe(reader.wake.set)

    async def flush(self) -> None:
        await _blocking(self.store.flush)
