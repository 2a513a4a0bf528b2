"""The feed's hub, one per event loop: subscribes each group once, orders events by seq and
fans them out in memory to the local websockets. docs/FEED_PROTOCOL.md, Delivery."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from channels.db import database_sync_to_async
from channels.layers import DEFAULT_CHANNEL_LAYER, channel_layers, get_channel_layer

from core.after_commit import is_local as _is_local
from core.after_commit import namespace
from frontend.feed.counters import counter, current
from frontend.feed.local import _hubs
from frontend.feed.protocol import SNAPSHOT_CACHE_S, _setting

log = logging.getLogger("gpumarket.feed")


class Subscriber(Protocol):
    def offer(self, event: dict[str, Any]) -> None: ...

    # optional: the group's numbering restarted at `event` (Hub._renumbered); without
    # it the subscriber is offered the event (and sees a gap)
    # def renumbered(self, event: dict[str, Any]) -> None: ...


@dataclass
class _GroupState:
    members: set = field(default_factory=set)
    subscribed: bool = False
    expected: int = 1                      # the next seq to hand out, in order
    pending: dict[int, dict[str, Any]] = field(default_factory=dict)  # seq → early event
    timer: asyncio.TimerHandle | None = None
    epoch: str | None = None               # the Redis run that numbered `expected - 1`


class Hub:
    """Per event loop (one per ASGI process): subscribes to each group ONCE, whatever the
    number of local websockets on it, and fans every event out in memory to them, in seq
    order (docs/FEED_PROTOCOL.md, Delivery). `seq(group)` is the last seq handed out: a
    snapshot numbered with it and read afterwards contains every change up to it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.ns = namespace()
        self.groups: dict[str, _GroupState] = {}
        self._lock = asyncio.Lock()
        self._layer = None
        self._channel: str | None = None
        self._reader: asyncio.Task | None = None
        self._watcher: asyncio.Task | None = None
        self._own_layer = None  # a channel layer of this hub's own, once it resubscribed
        self._own_base = None  # the default layer when it did
        self._run: str | None = None  # the Redis run id last seen
        # group → (seq, monotonic time read, text) and the read in flight (seq, task)
        self.snapshots: dict[str, tuple[int, float, str]] = {}
        self._reading: dict[str, tuple[int, asyncio.Task]] = {}
        # direct writes (frontend/consumers.py) coalesced per socket until the end of
        # this loop iteration (`write_later`); frames and writes counted (bench)
        self._outbox: dict[int, tuple[Any, Any, list[bytes]]] = {}
        self.frames = self.writes = 0

    @property
    def local(self) -> bool:
        layer = get_channel_layer()
        return layer is None or _is_local(layer)

    def seq(self, group: str) -> int:
        return self.groups[group].expected - 1

    def any_member(self, group: str) -> Subscriber | None:
        """A local subscriber of `group`, if any (a new one may share what it looked up)."""
        state = self.groups.get(group)
        return next(iter(state.members), None) if state is not None else None

    async def snapshot(self, group: str, need_seq: int, read) -> tuple[int, str]:
        """(seq, JSON text) of a snapshot of `group` numbered seq >= need_seq.

        The seq is the last one handed out, taken before the rows are read (`read` runs
        in a thread): a change committed in between may show in the snapshot and arrive
        again as seq+1 (harmless), but none is missed. One read per group at a time:
        clients that (re)sync together share it, and a snapshot is reused for
        SNAPSHOT_CACHE_S while it is recent enough for the asker."""
        while True:
            cached = self.snapshots.get(group)
            if (cached and cached[0] >= need_seq
                    and time.monotonic() - cached[1] < SNAPSHOT_CACHE_S):
                return cached[0], cached[2]
            reading = self._reading.get(group)
            if reading is not None:
                with contextlib.suppress(Exception):
                    result = await asyncio.shield(reading[1])
                    if reading[0] >= need_seq:
                        return result
                if reading[0] >= need_seq:  # it failed: let the caller see it
                    return await reading[1]
                continue
            seq = self.seq(group) if group in self.groups else need_seq
            task = self.loop.create_task(self._read_snapshot(group, seq, read))
            self._reading[group] = (seq, task)

    async def _read_snapshot(self, group: str, seq: int, read) -> tuple[int, str]:
        try:
            data = await database_sync_to_async(read)()
            text = json.dumps({**data, "seq": seq, "ts": time.time()}, separators=(",", ":"))
            if group in self.groups:
                self.snapshots[group] = (seq, time.monotonic(), text)
            return seq, text
        finally:
            self._reading.pop(group, None)

    async def join(self, group: str, member: Subscriber) -> None:
        state = self.groups.setdefault(group, _GroupState())
        state.members.add(member)
        async with self._lock:  # a later joiner waits here until the group is subscribed
            if self.groups.get(group) is state and not state.subscribed:
                if not self.local:
                    await self._ensure_reader()
                    await self._layer.group_add(group, self._channel)
                # after subscribing: whatever seq was taken before now is either
                # in flight (and ≤ this value, so stale for everyone) or delivered
                epoch, last = await asyncio.to_thread(current, group)
                state.expected = max(state.expected, last + 1)
                state.epoch = epoch
                if self._run is None:
                    self._run = epoch
                state.subscribed = True

    async def leave(self, group: str, member: Subscriber) -> None:
        state = self.groups.get(group)
        if state is None:
            return
        state.members.discard(member)
        if state.members:
            return
        async with self._lock:
            if state.members or self.groups.get(group) is not state:
                return
            del self.groups[group]
            self.snapshots.pop(group, None)
            if state.timer is not None:
                state.timer.cancel()
            if state.subscribed and not self.local and self._channel is not None:
                await self._layer.group_discard(group, self._channel)
            if not self.groups and self._reader is not None:
                self._reader.cancel()
                self._reader, self._channel = None, None
            if not self.groups and self._watcher is not None:
                self._watcher.cancel()
                self._watcher = None

    async def _ensure_reader(self) -> None:
        if self._reader is not None and not self._reader.done():
            return
        base = get_channel_layer()
        if self._own_layer is not None and base is not self._own_base:
            self._own_layer = None  # the channel layers were configured again (tests)
        self._layer = self._own_layer or base
        self._channel = await self._layer.new_channel(prefix="feedhub.")
        self._reader = self.loop.create_task(self._read(self._layer, self._channel))
        if self._watcher is None or self._watcher.done():
            self._watcher = self.loop.create_task(self._watch())

    async def _watch(self) -> None:
        """Every FEED_RUN_CHECK seconds (default 1): did Redis restart under this hub's
        subscription (a new run id)? Events published while the subscription was down
        (redis-py subscribes again when it reconnects) are lost, and a quiet group would
        never show it: every group still numbered by the old run is renumbered from the
        new run's counter and its clients resync at once (`_renumbered`)."""
        while True:
            await asyncio.sleep(_setting("FEED_RUN_CHECK", 1.0))
            try:
                run = await asyncio.to_thread(counter().run_id)
                if self._run is None or run == self._run:
                    self._run = run
                    continue
                log.warning("live feed: Redis restarted (run %s, was %s): every client of "
                            "this process resyncs", run, self._run)
                self._run = run
                await self._resubscribe()
                for group, state in list(self.groups.items()):
                    if not state.subscribed or state.epoch == run:
                        continue
                    epoch, last = await asyncio.to_thread(current, group)
                    if self.groups.get(group) is state and state.epoch != epoch:
                        self._renumbered(group, state, {"group": group, "epoch": epoch,
                                                        "seq": max(last, state.expected - 1)})
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis still down: the next round asks again
                log.debug("feed hub: Redis run check failed: %s", exc)

    async def _resubscribe(self) -> None:
        """Subscribe every group again, on new connections (a channel layer of this hub's
        own), and drop the old ones: after a Redis restart, the old pub/sub connection,
        reconnected by redis-py, was seen subscribed on the server yet receiving nothing."""
        async with self._lock:
            old_layer, old_reader, old_channel = self._layer, self._reader, self._channel
            layer = channel_layers.make_backend(DEFAULT_CHANNEL_LAYER)
            channel = await layer.new_channel(prefix="feedhub.")
            for group, state in self.groups.items():
                if state.subscribed:
                    await layer.group_add(group, channel)
            self._own_layer, self._layer, self._channel = layer, layer, channel
            self._own_base = get_channel_layer()
            self._reader = self.loop.create_task(self._read(layer, channel))
            if old_reader is not None:
                old_reader.cancel()
            if old_layer is not None and old_channel is not None:
                for group in self.groups:
                    with contextlib.suppress(Exception):
                        await old_layer.group_discard(group, old_channel)
            if old_layer is not None and old_layer is not get_channel_layer():
                with contextlib.suppress(Exception):
                    await old_layer.flush()

    async def _read(self, layer, channel: str) -> None:
        while True:
            event = await layer.receive(channel)
            try:
                self.deliver(event)
            except Exception:
                log.exception("feed hub: delivering %s failed", event.get("group"))

    # -- ordering and fan-out (synchronous: runs between two awaits of the loop)
    def deliver_many(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            self.deliver(event)

    def deliver(self, event: dict[str, Any]) -> None:
        state = self.groups.get(event.get("group", ""))
        if state is None or not state.subscribed:
            return
        if event.get("ns", self.ns) != self.ns:  # numbered by another Redis database
            return
        seq = event["seq"]
        if seq < state.expected or seq in state.pending:
            return  # (also one numbered before a Redis reset and sent after it: stale)
        epoch = event.get("epoch")
        if epoch is not None and epoch != state.epoch:
            self._renumbered(event["group"], state, event)
            return
        if seq > state.expected:
            state.pending[seq] = event
            if len(state.pending) > 256:
                self._give_up(event["group"])
            elif state.timer is None:
                state.timer = self.loop.call_later(
                    _setting("FEED_REORDER_WAIT", 0.1), self._give_up, event["group"])
            return
        self._fan_out(state, event)
        self._release(state)

    def _release(self, state: _GroupState) -> None:
        while state.expected in state.pending:
            self._fan_out(state, state.pending.pop(state.expected))
        if not state.pending and state.timer is not None:
            state.timer.cancel()
            state.timer = None

    def _renumbered(self, group: str, state: _GroupState, event: dict[str, Any]) -> None:
        """The first event numbered by another Redis run (Redis restarted, lost or restored
        its counters, failed over): events published meanwhile may never have reached this
        hub. Hand out what was held, then tell every local subscriber at once to resync
        (`renumbered`: its backlog is dropped and it gets `resync_required`); the snapshot
        it asks for is numbered from this event on, and the next events flow."""
        log.info("live feed: %s is numbered by a new Redis run (%s, was %s): clients "
                 "resync", group, event.get("epoch"), state.epoch)
        for seq in sorted(state.pending):
            self._fan_out(state, state.pending.pop(seq))
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        state.epoch = event.get("epoch")
        state.expected = event["seq"] + 1
        self.snapshots.pop(group, None)
        for member in tuple(state.members):
            renumbered = getattr(member, "renumbered", None)
            if renumbered is None:
                if "text" in event:  # not the watcher's (Hub._watch) mark
                    member.offer(event)
            else:
                renumbered(event)

    def _give_up(self, group: str) -> None:
        """The missing seqs did not come in time: hand out the early events (with a gap)."""
        state = self.groups.get(group)
        if state is None:
            return
        state.timer = None
        if state.pending:
            state.expected = min(state.pending)
            self._release(state)
            if state.pending:  # a further gap among the early ones: wait for it in turn
                self._give_up(group)

    # -- coalesced socket writes
    def write_later(self, member, proto, data: bytes) -> None:
        """Queue `data` (whole websocket frames) for `proto`'s socket: whatever is queued
        for one socket goes out in ONE write when this loop iteration's callbacks are
        done, in queue order (docs/FEED_PROTOCOL.md, Delivery). A socket's write (a
        send() system call) was most of a frame's cost; several events of a burst (a
        trade and its depth, a market's and the summary's) now share one, and the
        client reads them with one recv. `member` is told `write_failed()` if the write
        raises."""
        pending = self._outbox.get(id(proto))  # (held by its member until the flush)
        if pending is not None:
            pending[2].append(data)
            return
        if not self._outbox:
            self.loop.call_soon(self.flush_writes)
        self._outbox[id(proto)] = (proto, member, [data])

    def flush_writes(self) -> None:
        """Write what `write_later` queued, one write per socket; a socket that closed
        (or sent its close frame) meanwhile gets nothing more."""
        outbox, self._outbox = self._outbox, {}
        for proto, member, parts in outbox.values():
            if proto.close_sent or proto.disconnected or proto.transport.is_closing():
                continue
            self.frames += len(parts)
            self.writes += 1
            try:
                proto.transport.write(parts[0] if len(parts) == 1 else b"".join(parts))
            except Exception:  # never let one socket break the others' writes
                log.debug("feed hub: coalesced write failed", exc_info=True)
                member.write_failed()

    @staticmethod
    def _fan_out(state: _GroupState, event: dict[str, Any]) -> None:
        state.expected = event["seq"] + 1
        for member in tuple(state.members):
            member.offer(event)


def hub() -> Hub:
    """The hub of the running event loop (created on first use)."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        found = _hubs[loop] = Hub(loop)
    return found
