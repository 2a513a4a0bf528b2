"""Direct writes (frontend/consumers.py): under uvicorn, an event goes to each idle
client's socket without the ASGI layers — as one frame encoded once for the group (byte
for byte what ASGI `send` writes), or through the connection's own compressor when it
negotiated permessage-deflate — and in order; a socket that pushes back or a closing one
takes the ASGI path."""

import asyncio
import json
import socket
import threading
import time
from types import SimpleNamespace

import pytest
from websockets.frames import Frame, Opcode

from frontend import feed
from frontend.consumers import _write_frame, text_frame
from marketplace import book
from tests.factories import funded_buyer, registered_node

H100 = "h100-sxm-80gb"
GROUP = feed.market_group(H100)


@pytest.mark.parametrize("size", [0, 5, 125, 126, 65535, 65536, 200_000])
def test_text_frame_is_the_frame_websockets_writes(size):
    text = ("é" * size)[:size] if size % 2 else "x" * size
    assert text_frame(text) == Frame(Opcode.TEXT, text.encode()).serialize(
        mask=False, extensions=[])


class _Transport:
    def __init__(self):
        self.written, self.closing = [], False

    def write(self, data):
        self.written.append(data)

    def is_closing(self):
        return self.closing


def _proto(**state):
    writable = asyncio.Event()
    writable.set()
    base = {"handshake_complete": True, "close_sent": False, "disconnected": False,
            "initial_response": None, "writable": writable, "transport": _Transport(),
            "conn": SimpleNamespace(extensions=[])}
    return SimpleNamespace(**{**base, **state})


def _now(proto, data):
    proto.transport.write(data)


def test_a_failing_direct_write_falls_back_to_the_queue():
    from frontend.consumers import FeedConsumer

    class Broken(_Transport):
        def write(self, data):
            raise OSError("gone")

    consumer = FeedConsumer()
    consumer.group, consumer.last_seq, consumer._idle = GROUP, 4, True
    consumer._socket = _proto(transport=Broken())
    consumer._queue = asyncio.Queue(maxsize=8)
    loop = asyncio.new_event_loop()
    try:
        consumer.hub = feed.Hub(loop)
        consumer.offer({"group": GROUP, "seq": 5, "text": '{"type":"depth","seq":5}'})
        assert consumer.last_seq == 5 and consumer._queue.qsize() == 0  # coalesced
        loop.run_until_complete(asyncio.sleep(0))  # the write raises at the flush:
    finally:
        loop.close()
    assert consumer._socket is None  # the ASGI path from now on
    kind, text = consumer._queue.get_nowait()  # and the client is told to resync
    assert kind == "text" and json.loads(text)["type"] == "resync_required"


def test_a_socket_that_pushes_back_or_closes_is_not_written_directly():
    event = {"seq": 1, "text": '{"type":"depth","seq":1}'}
    ok = _proto()
    assert _write_frame(ok, event, _now) and ok.transport.written == [text_frame(event["text"])]
    assert event["frame"] == text_frame(event["text"])  # encoded once, then shared
    paused = _proto()
    paused.writable.clear()
    closing = _proto()
    closing.transport.closing = True
    for proto in (paused, closing, _proto(close_sent=True), _proto(disconnected=True),
                  _proto(handshake_complete=False)):
        assert not _write_frame(proto, event, _now) and proto.transport.written == []


def test_the_frames_of_one_loop_iteration_share_one_write_per_socket():
    loop = asyncio.new_event_loop()
    hub, member = feed.Hub(loop), object()
    a, b, closed = _proto(), _proto(), _proto()
    try:
        hub.write_later(member, a, b"1")
        hub.write_later(member, b, b"x")
        hub.write_later(member, a, b"2")
        hub.write_later(member, closed, b"z")
        closed.close_sent = True  # (its close frame went out first: nothing after it)
        hub.write_later(member, a, b"3")
        assert a.transport.written == []  # not before the iteration's callbacks are done
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    assert a.transport.written == [b"123"] and b.transport.written == [b"x"]
    assert closed.transport.written == []
    assert (hub.frames, hub.writes) == (4, 2)


@pytest.fixture
def uvicorn_server(settings, transactional_db):
    import uvicorn

    from marketplace.asgi import application

    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off",
                                           ws="websockets-sansio"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield port
    server.should_exit = True
    thread.join(10)
    from django.db import connections

    connections.close_all()


@pytest.mark.usefixtures("clean_channel_layer")
def test_plain_and_compressed_clients_get_the_same_events_in_order(uvicorn_server,
                                                                   monkeypatch):
    from websockets.asyncio.client import connect

    from frontend import consumers

    direct = []
    real_write = consumers._write_frame

    def counting(proto, event, write):
        done = real_write(proto, event, write)
        direct.append(done and event["seq"])
        return done

    monkeypatch.setattr(consumers, "_write_frame", counting)
    registered_node()
    buyer = funded_buyer(100)
    url = f"ws://127.0.0.1:{uvicorn_server}/ws/markets/{H100}/"

    def bids():
        for i in range(5):
            book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=1_000_000 + i * 10_000,
                           gpus=1, duration_seconds=3600)
        feed.flush()

    async def scenario():
        plain = await connect(url, origin="http://127.0.0.1", compression=None)
        deflate = await connect(url, origin="http://127.0.0.1")  # permessage-deflate
        assert deflate.protocol.extensions and not plain.protocol.extensions
        snaps = [json.loads(await ws.recv()) for ws in (plain, deflate)]
        [hub] = [h for h in list(feed._hubs.values()) if GROUP in h.groups]
        sockets = sorted(m._socket is not None for m in hub.groups[GROUP].members)
        await asyncio.to_thread(bids)
        got = []
        for ws in (plain, deflate):
            frames = []
            while True:
                try:
                    frames.append(json.loads(await asyncio.wait_for(ws.recv(), 1.5)))
                except TimeoutError:
                    break
            got.append(frames)
        await plain.close()
        await deflate.close()
        return snaps, sockets, got

    snaps, sockets, (plain, deflate) = asyncio.run(scenario())
    assert sockets == [True, True]
    # every event went directly to both, compressed or not
    assert sorted(seq for seq in direct if seq) == sorted(2 * [m["seq"] for m in plain])
    assert plain == deflate and plain  # the very same messages
    seqs = [m["seq"] for m in plain]
    assert seqs == list(range(snaps[0]["seq"] + 1, snaps[0]["seq"] + 1 + len(seqs)))
    assert plain[-1]["type"] == "depth" and plain[-1]["best_bid"] == "1.040000"
