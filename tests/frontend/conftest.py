"""Helpers for the live feed tests: Channels' WebsocketCommunicator against the real
ASGI application (origin check, session middleware, routing), driven from sync tests
with asgiref's async_to_sync (no pytest-asyncio). Service calls inside a scenario go
through sync_to_async, so on_commit publishing runs as in production."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

ORIGIN = (b"origin", b"http://testserver")


def application():
    from marketplace.asgi import application as app

    return app


async def connect(path: str, *headers: tuple[bytes, bytes]):
    """(communicator, connected, subprotocol or close code). Whatever the test committed
    before is published first (the publisher thread works after commit, asynchronously),
    so the scenario starts from a quiet feed."""
    from frontend import feed

    await sync_to_async(feed.flush)()
    comm = WebsocketCommunicator(application(), path, headers=[ORIGIN, *headers])
    connected, detail = await comm.connect(timeout=5)
    return comm, connected, detail


async def recv(comm, timeout: float = 5) -> dict:
    return json.loads(await comm.receive_from(timeout))


async def drain(comm, timeout: float = 0.5) -> list[str]:
    """Every raw text frame that arrives until `timeout` passes without one."""
    frames = []
    while not await comm.receive_nothing(timeout=timeout, interval=0.02):
        frames.append(await comm.receive_from())
    return frames


def call(fn, *args, **kwargs):
    """Await a sync (ORM) call from a scenario."""
    return sync_to_async(fn)(*args, **kwargs)


@pytest.fixture
def clean_channel_layer():
    """A clean channel layer (groups, buffers) for each test."""
    from asgiref.sync import async_to_sync
    from channels.layers import channel_layers, get_channel_layer

    from frontend import feed

    feed.flush()  # nothing of an earlier test still on its way out
    channel_layers.backends.clear()  # a fresh layer: flush() closes every loop's pools
    layer = get_channel_layer()
    if hasattr(layer, "flush"):
        async_to_sync(layer.flush)()
    yield
    feed.flush()
    channel_layers.backends.clear()
