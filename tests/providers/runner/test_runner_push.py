"""Runner push: `/ws/runner/` under a real ASGI server (uvicorn on 127.0.0.1, in a thread of
the test process, on the test database), notices after commit, and the real runner
(`python -m providers.runner run`, its own process, Docker runtime) picking a lease up at
once when push works and by HTTP polling when the websocket is refused.

The GPUs are simulated from a recorded `nvidia-smi -q` dump (`--simulate`): there is no
GPU/NVML on this machine. Nothing else is mocked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from django.db import connections, transaction
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from marketplace.lease_end import end_lease
from marketplace.models import Lease, LeaseEvent
from providers import push
from tests.conftest import ROOT, require_or_skip
from tests.factories import H100_DUMP, RTX4090_DUMP, ask, bid, funded_buyer, registered_node
from tests.support.containers import inspected
from tests.support.net import free_port
from tests.support.processes import child_env
from tests.support.servers import AsgiServer, SeenRequests
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def asgi_url(settings, transactional_db):
    """marketplace.asgi:application under uvicorn in a thread → its http:// base URL."""
    with AsgiServer() as server:
        yield server.url


def _ws(base: str, token: str | None, origin: str | None = None):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return connect(base.replace("http://", "ws://") + "/ws/runner/", additional_headers=headers,
                   origin=origin or base, open_timeout=10)


def _recv(ws, timeout: float = 10.0) -> dict:
    return json.loads(ws.recv(timeout=timeout))


def _market(node_name: str = "push-node"):
    provider, node, token = registered_node(name=node_name)
    ask(provider, node)
    return provider, node, token, funded_buyer(100)


def _lease(buyer, **kw) -> Lease:
    """The one lease of a 1-GPU H100 bid of `buyer` that fills at once (see _market)."""
    [lease] = bid(buyer, **kw).leases
    return lease


def test_a_bad_or_missing_token_is_closed_with_4401(asgi_url):
    for token in ("not-a-runner-token", None):
        with _ws(asgi_url, token) as ws, pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 4401


def test_notices_follow_commits_of_the_nodes_leases_only(asgi_url, settings):
    _, node, token, buyer = _market()
    _, other, other_token = registered_node(RTX4090_DUMP, name="other-node")
    with _ws(asgi_url, token) as ws, _ws(asgi_url, other_token) as ws_other:
        hello = _recv(ws)
        assert hello == {"type": "hello", "node": node.pk, "seq": hello["seq"],
                         "notices": "complete" if settings.REDIS_URL else "partial"}
        assert _recv(ws_other)["node"] == other.pk

        def rolled_back():
            with transaction.atomic():
                _lease(buyer)
                raise RuntimeError("roll back")

        with pytest.raises(RuntimeError):  # rolled back: no notice
            rolled_back()
        lease = _lease(buyer)  # commits: one notice, the next seq, no lease data
        assert _recv(ws) == {"type": "leases_changed", "seq": hello["seq"] + 1}

        Lease.objects.get(pk=lease.pk).set_status("starting", cause="test")
        assert _recv(ws) == {"type": "leases_changed", "seq": hello["seq"] + 2}
        end_lease(lease_id=lease.pk, status="failed", cause="test")
        assert _recv(ws) == {"type": "leases_changed", "seq": hello["seq"] + 3}

        with pytest.raises(TimeoutError):  # the other node heard nothing of it
            ws_other.recv(timeout=0.5)


class RunnerProcess:
    """`python -m providers.runner` registered from the H100 dump and run with Docker."""

    def __init__(self, url: str, token: str, state, *extra: str) -> None:
        self.state = state
        self.log = state / "runner.log"
        reg = subprocess.run(
            [sys.executable, "-m", "providers.runner", "register", "--url", url, "--token",
             token, "--simulate", str(H100_DUMP), "--state-dir", str(state)],
            cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
        assert reg.returncode == 0, reg.stderr
        self.uid = json.loads((state / "config.json").read_text())["node"]["uid"]
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "providers.runner", "run", "--state-dir", str(state),
                 "--runtime", "docker", "--network", "none", "--grace", "1", *extra],
                cwd=ROOT, env=child_env(), stdout=out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text()

    def stop(self, docker_client) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for c in docker_client.containers.list(all=True,
                                               filters={"label": f"gpumarket.node={self.uid}"}):
            c.remove(force=True)


def _picked_up_after(lease: Lease) -> float:
    """Seconds from the lease's creation (pending) to the runner's `starting` report."""
    created = LeaseEvent.objects.get(lease=lease, to_status="pending").at
    started = wait_until("the runner to report starting", lambda: LeaseEvent.objects.filter(
        lease=lease, to_status="starting").first(), timeout=60)
    return (started.at - created).total_seconds()


@pytest.mark.docker
def test_the_runner_takes_a_pushed_lease_at_once(asgi_url, docker_client, test_image,
                                                  tmp_path):
    """Poll interval 30 s: with push up, a lease is taken within a couple of seconds, and a
    lease ended by the marketplace loses its container just as fast."""
    _, _node, token, buyer = _market()
    runner = RunnerProcess(asgi_url, token, tmp_path, "--poll-interval", "30")
    try:
        wait_until("the runner's push websocket", lambda: "connected;" in runner.output(),
                   timeout=60)
        time.sleep(1)  # past the ticks that follow the connection
        lease = _lease(buyer, image=test_image, command=["sleep", "3600"])
        took = _picked_up_after(lease)
        assert took < 3, f"{took:.1f} s with push up (poll interval 30 s)"
        wait_until("the lease to run", lambda: Lease.objects.get(pk=lease.pk).status
                   == "running", timeout=30)
        label = [f"gpumarket.lease={lease.pk}", f"gpumarket.node={runner.uid}"]
        assert len(inspected(docker_client, running_only=True, label=label)) == 1

        ended = time.monotonic()
        end_lease(lease_id=lease.pk, status="completed", cause="test: ended by the market")
        wait_until("the container to go", lambda: not inspected(docker_client, label=label),
                   timeout=20, every=0.05)
        assert time.monotonic() - ended < 8  # grace 1 s; no 30 s poll was waited for
        assert runner.proc.poll() is None
        assert runner.output().count("push: websocket") == 1, runner.output()
    finally:
        runner.stop(docker_client)


@pytest.mark.docker
def test_the_runner_polls_when_the_websocket_is_refused(live_server, docker_client,
                                                        test_image, tmp_path):
    """pytest-django's live server is WSGI: the websocket handshake is answered 404. The
    runner says so once, keeps retrying with back-off, and takes the lease by polling."""
    _, _node, token, buyer = _market()
    runner = RunnerProcess(live_server.url, token, tmp_path, "--poll-interval", "1")
    try:
        wait_until("the runner to fall back to polling",
                   lambda: "polling every 1 s, reconnecting" in runner.output(), timeout=60)
        lease = _lease(buyer, image=test_image, command=["sleep", "3600"])
        took = _picked_up_after(lease)
        assert took < 10
        wait_until("the lease to run", lambda: Lease.objects.get(pk=lease.pk).status
                   == "running", timeout=30)
        with SeenRequests("/ws/runner/") as handshakes:  # still logged once after them
            wait_until("2 more reconnection attempts", lambda: handshakes.count >= 2,
                       timeout=30)
        out = runner.output()
        assert out.count("push: websocket") == 1, out
        assert "handshake answered HTTP 404" in out
        assert "connected;" not in out
    finally:
        runner.stop(docker_client)


def test_push_flush_sends_after_commit_from_a_task_process_too():
    """Outside any ASGI process (a Celery worker, a management command) the notice is
    still numbered and sent after commit; flush() waits for it."""
    _, node, _, buyer = _market()
    before = push.current_seq(node.pk)
    _lease(buyer)
    assert push.flush(10)
    assert push.current_seq(node.pk) == before + 1


def test_the_listener_reconnects_after_the_marketplace_restarts(transactional_db):
    """The runner's websocket thread (providers/runner/push.py) against a real uvicorn that
    stops and comes back on the same port: one log line per change of state, `connected`
    follows it, and notices flow again after the reconnection."""
    from providers.runner.push import PushListener

    _, node, token, buyer = _market()
    port = free_port()
    lines: list[str] = []
    notices: list[int | None] = []
    listener = PushListener(f"http://127.0.0.1:{port}", token, log=lines.append,
                            poll_interval=2, max_backoff=1)
    server = AsgiServer(port).start()
    listener.start(notices.append)
    try:
        wait_until("the first connection", lambda: listener.connected, timeout=15)
        server.stop(15)
        wait_until("the drop to be noticed", lambda: not listener.connected, timeout=15)
        time.sleep(2.5)  # several failed reconnection attempts (max_backoff 1 s)
        assert [line.split(" (")[0] for line in lines] == [
            f"push: websocket ws://127.0.0.1:{port}/ws/runner/ connected; leases arrive as "
            "soon as they change",
            f"push: websocket ws://127.0.0.1:{port}/ws/runner/ down"]

        server.start()
        wait_until("the reconnection", lambda: listener.connected, timeout=15)
        assert len(lines) == 3 and lines[2] == lines[0]
        before = len(notices)
        _lease(buyer)
        wait_until("a notice after the reconnection", lambda: len(notices) > before,
                   timeout=15)
        assert notices[-1] == push.current_seq(node.pk)
    finally:
        listener.stop()
        server.stop(15)
        connections.close_all()


def _redis_url_on_another_db(url: str) -> str:
    """The same Redis server, the next database."""
    from urllib.parse import urlsplit, urlunsplit

    from redis.connection import parse_url

    db = int(parse_url(url).get("db", 0))
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{(db + 1) % 16}"))


def test_notices_of_another_redis_database_never_reach_this_runner(asgi_url, settings):
    """Redis pub/sub is server-wide: another deployment (or test run) on another database
    of the same Redis server publishes on the same group channel for its node with the
    same id. Its notice (tagged with its database) is dropped; ours still arrive."""
    if not settings.REDIS_URL:
        require_or_skip("needs REDIS_URL: the in-memory channel layer has no neighbours")
    from asgiref.sync import async_to_sync
    from channels_redis.pubsub import RedisPubSubChannelLayer

    _, node, token, buyer = _market()
    ours, other_url = settings.REDIS_URL, _redis_url_on_another_db(settings.REDIS_URL)
    settings.REDIS_URL = other_url  # the other deployment's notifier tags with its database
    foreign = {"type": push.EVENT_TYPE, "seq": 10_000, "ns": push.namespace()}
    settings.REDIS_URL = ours
    assert foreign["ns"] != push.namespace()
    with _ws(asgi_url, token) as ws:
        hello = _recv(ws)

        async def publish():
            layer = RedisPubSubChannelLayer(hosts=[{"address": other_url}])
            try:
                await layer.group_send(push.node_group(node.pk), foreign)
            finally:
                await layer.flush()

        async_to_sync(publish)()
        with pytest.raises(TimeoutError):  # the other deployment's node, not ours
            ws.recv(timeout=1.0)
        _lease(buyer)  # ours: delivered, numbered in our database
        assert _recv(ws) == {"type": "leases_changed", "seq": hello["seq"] + 1}


@pytest.mark.docker
def test_with_partial_notices_the_runner_polls_too(asgi_url, settings, docker_client,
                                                   test_image, tmp_path):
    """No REDIS_URL: the in-memory channel layer is per process. `hello` says "partial";
    the runner logs it once and keeps polling at its interval, so a lease created by
    another process (as the Celery worker creates an auction's lease), whose notice cannot
    reach this process's /ws/runner/, is taken within the poll interval instead of at the
    30 s resync (the trial saw 11 s for an auction's lease)."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    _, _node, token, buyer = _market()
    with _ws(asgi_url, token) as ws:
        assert _recv(ws)["notices"] == "partial"
    runner = RunnerProcess(asgi_url, token, tmp_path, "--poll-interval", "2")
    try:
        wait_until("the runner's push websocket", lambda: "connected;" in runner.output(),
                   timeout=60)
        time.sleep(1)  # past the ticks that follow the connection
        worker = (  # another process with its own in-memory layer, as a Celery worker
            "import django; django.setup()\n"
            "from marketplace import book\n"
            "from providers import push\n"
            f"[lease] = book.place_bid(buyer_id={buyer.pk}, market_slug='h100-sxm-80gb', "
            "price=2_490_000, gpus=1, duration_seconds=3600, "
            f"image={test_image!r}, command=['sleep', '3600']).leases\n"
            "push.flush(10)\n"
            "print(lease.pk)\n")
        env = {k: v for k, v in child_env().items() if k != "REDIS_URL"}
        done = subprocess.run([sys.executable, "-c", worker], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        lease = Lease.objects.get(pk=int(done.stdout.split()[-1]))
        took = _picked_up_after(lease)
        assert took < 7, f"{took:.1f} s with partial push (poll interval 2 s, resync 30 s)"
        out = runner.output()
        assert out.count("push: the marketplace's notices are partial") == 1, out
        assert "also polling every 2 s" in out
    finally:
        runner.stop(docker_client)


def _closed(ws, timeout: float = 10.0):
    """The close frame the marketplace sent on `ws` (waits for it; nothing else comes
    first: a test calls it when the next thing due is the close)."""
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=timeout)
    return closed.value.rcvd


def test_rotating_the_token_closes_its_open_connections_at_once(asgi_url):
    """Issue 10: the old token stops working at once on every way in, the websocket too.
    Both connections opened with it are closed with 4401 when the rotation commits; another
    node's stays; the old token cannot connect again, the new one can and gets notices."""
    from providers.services import node_rotate_token

    user, node, token, buyer = _market()
    _, _, other_token = registered_node(RTX4090_DUMP, name="other-node")
    with _ws(asgi_url, token) as ws1, _ws(asgi_url, token) as ws2, \
            _ws(asgi_url, other_token) as ws_other:
        for ws in (ws1, ws2, ws_other):
            assert _recv(ws)["type"] == "hello"
        new = node_rotate_token(user_id=user.pk, node_id=node.pk).runner_token
        for ws in (ws1, ws2):
            rcvd = _closed(ws)
            assert (rcvd.code, rcvd.reason) == (4401, "runner token rotated")
        with pytest.raises(TimeoutError):  # the other node's connection is untouched
            ws_other.recv(timeout=0.5)
    with _ws(asgi_url, token) as ws:
        assert _closed(ws).code == 4401
    with _ws(asgi_url, new) as ws:
        hello = _recv(ws)
        assert hello["type"] == "hello" and hello["node"] == node.pk
        _lease(buyer)
        assert _recv(ws) == {"type": "leases_changed", "seq": hello["seq"] + 1}


def test_a_rotation_while_the_connection_opens_closes_it_too(asgi_url, monkeypatch):
    """The rotation commits after the handshake's token check and before the connection
    joined the node's group (so its notice reaches nobody): the connection checks its
    token again once in the group, and closes."""
    from channels.db import database_sync_to_async

    from providers import consumers
    from providers.services import node_rotate_token

    user, node, token, _ = _market()
    real = consumers._node_id
    rotated: list[str] = []

    async def check_then_rotate(token_hash):
        node_id = await real(token_hash)
        if not rotated:  # the first check only: the handshake's
            rotated.append(await database_sync_to_async(
                lambda: node_rotate_token(user_id=user.pk, node_id=node.pk).runner_token)())
            assert push.flush(10)  # its notice is out before the connection joins
        return node_id

    monkeypatch.setattr(consumers, "_node_id", check_then_rotate)
    with _ws(asgi_url, token) as ws:
        rcvd = _closed(ws)
    assert (rcvd.code, rcvd.reason) == (4401, "runner token rotated")
    assert rotated
