"""The runner's websocket listener (providers/runner/push.py) against a small websocket
server standing in for the marketplace: `hello` says whether its notices are complete or
partial; with partial notices the agent keeps polling at its interval, logged once."""

from __future__ import annotations

import json
import threading

import pytest
from websockets.sync.server import serve

from providers.runner import push as runner_push
from providers.runner.agent import Agent
from providers.runner.nvml import DumpGpus
from providers.runner.push import PushListener
from providers.runner.runtime import ProcessRuntime

from .runner_helpers import A10, wait_for


@pytest.fixture
def hello_server():
    """A websocket server that sends each connection the next hello of `hellos` and keeps
    it open until `close_now` is set."""
    state = {"hellos": [], "close_now": threading.Event()}

    def handler(ws):
        ws.send(json.dumps(state["hellos"].pop(0)))
        state["close_now"].wait(10)
        state["close_now"].clear()

    with serve(handler, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        state["url"] = f"http://127.0.0.1:{server.socket.getsockname()[1]}"
        yield state
        state["close_now"].set()
        server.shutdown()


def test_partial_notices_keep_the_agent_polling_and_are_logged_once(
        hello_server, tmp_path, monkeypatch):
    monkeypatch.setattr(runner_push, "FIRST_BACKOFF_S", 0.05)
    hello = {"type": "hello", "node": 1, "seq": 0}
    hello_server["hellos"] = [{**hello, "notices": "partial"}, {**hello, "notices": "partial"},
                              {**hello, "notices": "complete"}, dict(hello)]
    lines: list[str] = []
    listener = PushListener(hello_server["url"], "gmr_test", log=lines.append,
                            poll_interval=2)
    agent = Agent(None, DumpGpus(A10), ProcessRuntime(tmp_path), push=listener,
                  log=lines.append)
    agent._leases, agent._stale, agent._next_resync = [], False, float("inf")
    listener.start(agent.notify)
    try:
        def reconnect(count: int) -> None:
            hello_server["close_now"].set()
            wait_for(lambda: listener.notices >= count and listener.connected)

        wait_for(lambda: listener.connected)
        agent._stale = False  # the hello's notice marks the list stale; judge the polling
        assert listener.partial and agent.fetch_due()  # partial: every tick fetches
        reconnect(2)  # partial again: not logged again
        agent._stale = False
        assert listener.partial and agent.fetch_due()
        reconnect(3)  # complete: only notices (and the 30 s resync) fetch
        agent._stale = False
        assert not listener.partial and not agent.fetch_due()
        reconnect(4)  # an older marketplace says nothing: complete, as before
        agent._stale = False
        assert not listener.partial and not agent.fetch_due()
    finally:
        listener.stop()
    partial = [ln for ln in lines if "notices are partial" in ln]
    assert partial == [
        "push: the marketplace's notices are partial (its channel layer is in-memory: "
        "changes made by its worker process, such as an auction's lease or a preemption, "
        "are not pushed); also polling every 2 s"]
    assert [ln for ln in lines if "notices are complete" in ln] == [
        "push: the marketplace's notices are complete now; polling only while the websocket "
        "is down"]
