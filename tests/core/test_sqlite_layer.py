"""The embedded default's channel layer (core/sqlite_layer.py) across real processes: a
group send from another process reaches every member, in order; Channels' group
semantics (discard, a full member skipped, ChannelFull on send); expired rows pruned; the
feed's sequence numbers shared by processes on the same file."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import pytest
from channels.exceptions import ChannelFull

from core.sqlite_layer import SQLiteChannelLayer, Store
from tests.conftest import ROOT

CHILD = textwrap.dedent("""
    import asyncio, sys
    from core.sqlite_layer import SQLiteChannelLayer, Store
    path, what = sys.argv[1], sys.argv[2]
    layer = SQLiteChannelLayer(path=path)
    if what == "send":
        async def main():
            for i in range(5):
                await layer.group_send("market.h100", {"type": "feed.event", "n": i,
                                                       "blob": bytes([i])})
        asyncio.run(main())
    elif what == "receive":  # join, say so, then print what arrives
        async def main():
            channel = await layer.new_channel()
            await layer.group_add("market.h100", channel)
            print("joined", flush=True)
            for _ in range(2):
                print((await asyncio.wait_for(layer.receive(channel), 30))["n"], flush=True)
        asyncio.run(main())
    elif what == "at-exit":  # as a short-lived process's publisher thread sends at exit
        import atexit, queue, threading
        go, sent = queue.Queue(), threading.Event()
        def publisher():
            loop = asyncio.new_event_loop()
            go.get()
            loop.run_until_complete(layer.group_send("market.h100", {"type": "x", "n": 7}))
            sent.set()
        threading.Thread(target=publisher, daemon=True).start()
        atexit.register(lambda: (go.put(1), sent.wait(10)))
    elif what == "numbers":
        store = Store(path)
        for _ in range(200):
            print(store.numbers(["auction.1"], 10, take=True)[1][0])
""")


def _child(path, what: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(path), what], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, **kw)


def test_a_group_send_from_another_process_reaches_every_member_in_order(tmp_path):
    path = tmp_path / "channels.sqlite3"
    layer = SQLiteChannelLayer(path=str(path))

    async def scenario():
        here = await layer.new_channel("feedhub.")
        gone = await layer.new_channel("feedhub.")
        await layer.group_add("market.h100", here)
        await layer.group_add("market.h100", gone)
        await layer.group_discard("market.h100", gone)  # a discarded member gets nothing
        other = _child(path, "receive")  # a member in a third process
        assert other.stdout.readline().strip() == "joined"
        sender = _child(path, "send")
        assert await asyncio.to_thread(sender.wait, 30) == 0
        got = [await asyncio.wait_for(layer.receive(here), 10) for _ in range(5)]
        assert [m["n"] for m in got] == [0, 1, 2, 3, 4]
        assert got[3] == {"type": "feed.event", "n": 3, "blob": b"\x03"}
        out, _ = await asyncio.to_thread(other.communicate, timeout=30)
        assert out.split() == ["0", "1"]
        assert await layer.group_send("market.h100", {"type": "x"}) is None
        assert Store(path).db().execute(
            "SELECT COUNT(*) FROM messages WHERE channel = ?", (gone,)).fetchone() == (0,)

    asyncio.run(scenario())


def test_a_process_that_sends_while_it_exits_is_heard(tmp_path):
    """A management command or a task run publishes what it committed at exit, when the
    interpreter no longer starts threads: the send still goes out."""
    path = tmp_path / "channels.sqlite3"
    layer = SQLiteChannelLayer(path=str(path))

    async def scenario():
        channel = await layer.new_channel()
        await layer.group_add("market.h100", channel)
        child = _child(path, "at-exit", stderr=subprocess.PIPE)
        _, err = await asyncio.to_thread(child.communicate, timeout=30)
        assert child.returncode == 0 and "Traceback" not in err, err
        return await asyncio.wait_for(layer.receive(channel), 5)

    assert asyncio.run(scenario())["n"] == 7


def test_a_full_channel_refuses_a_send_and_is_skipped_by_a_group_send(tmp_path):
    layer = SQLiteChannelLayer(path=str(tmp_path / "c.sqlite3"), capacity=2)

    async def scenario():
        await layer.send("worker", {"type": "a"})
        await layer.send("worker", {"type": "b"})
        with pytest.raises(ChannelFull):
            await layer.send("worker", {"type": "c"})
        assert (await layer.receive("worker"))["type"] == "a"  # by name, oldest first
        await layer.group_add("g", "worker")
        await layer.group_send("g", {"type": "c"})
        await layer.group_send("g", {"type": "d"})  # full again: skipped, no error
        assert [(await layer.receive("worker"))["type"] for _ in range(2)] == ["b", "c"]

    asyncio.run(scenario())


def test_expired_messages_and_memberships_are_pruned(tmp_path):
    path = tmp_path / "c.sqlite3"
    layer = SQLiteChannelLayer(path=str(path), expiry=0.05, group_expiry=0.05)
    layer.store.PRUNE_EVERY = 0

    async def scenario():
        await layer.group_add("g", "dead.process!x")  # a member whose process died
        for _ in range(50):
            await layer.group_send("g", {"type": "x"})
        await asyncio.sleep(0.1)
        await layer.send("other", {"type": "y"})  # any write prunes what expired

    asyncio.run(scenario())
    db = Store(path).db()
    assert db.execute("SELECT channel FROM messages").fetchall() == [("other",)]
    assert db.execute("SELECT COUNT(*) FROM memberships").fetchone() == (0,)


def test_sequence_numbers_are_shared_by_processes_and_only_grow(tmp_path):
    path = tmp_path / "c.sqlite3"
    store = Store(path)
    epoch, [first] = store.numbers(["auction.1"], 10, take=True)
    assert first == 11  # a new name starts at the floor
    children = [_child(path, "numbers") for _ in range(2)]
    mine = [store.numbers(["auction.1"], 10, take=True)[1][0] for _ in range(200)]
    theirs = [int(n) for c in children for n in c.communicate(timeout=60)[0].split()]
    taken = mine + theirs
    assert len(set(taken)) == 600 and max(taken) == 611  # none twice, none skipped
    assert mine == sorted(mine)
    assert store.numbers(["auction.1"], 10, take=False) == (epoch, [611])
    # a new file is a new epoch, numbered from a later floor: no old number comes again
    path.unlink()
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"c.sqlite3{suffix}").unlink(missing_ok=True)
    fresh = Store(path)
    new_epoch, [n] = fresh.numbers(["auction.1"], int(time.time() * 1e6), take=True)
    assert new_epoch != epoch and n > 611
