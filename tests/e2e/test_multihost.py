"""More than one machine: two web processes and two Celery workers on two network-namespace
hosts of the test's own making, runners on a third (tests/support/netns.py), sharing the
test's PostgreSQL and Redis through proxies on the bridge address only. Bids on four
markets go through both web hosts at once: one matching writer per market holds (no GPU
in two leases, every fill accounted, holds exact: the ledger guard's `ledger_check`),
a market feed on one host sees the trades made on the other, and each runner, whose push
channel is on the other web host than its leases' bids, starts their containers (its
heartbeat is an hour apart: only the push notice through Redis can tell it in time)."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.utils import timezone
from websockets.sync.client import connect as ws_connect

from marketplace.models import Lease, LeaseGpu, Order
from tests.conftest import DATA, ROOT
from tests.factories import H100_DUMP, RTX4090_DUMP, api_token, funded_buyer, registered_node
from tests.support.containers import inspected
from tests.support.netns import Hosts
from tests.support.processes import child_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker]

DUMPS = [H100_DUMP, RTX4090_DUMP, DATA / "nvidia-smi" / "a100-sxm4-40gb-x8.xuesongtap-blog.q.txt",
         DATA / "nvidia-smi" / "v100-sxm2-16gb-x8.thamada-gls.q.txt"]
OFFERED = 2  # GPUs each market's ask offers; 2 × OFFERED bids of 1 GPU compete for them
WEB = ["web-a", "web-b"]


@pytest.fixture
def hosts(tmp_path):
    with Hosts(["web-a", "web-b", "runners"]) as made:
        yield made


def _env(hosts: Hosts, pg: int, redis: int, **extra: str) -> dict:
    db = settings.DATABASES["default"]
    url = f"redis://{hosts.gateway}:{redis}/{settings.REDIS_URL.rsplit('/', 1)[-1] or 0}"
    env = child_env(REDIS_URL=url, CELERY_BROKER_URL=url, GPUMARKET_DB_POOL="0",
                    ALLOWED_HOSTS=",".join(hosts.address.values()), **extra)
    env["DATABASE_URL"] = f"postgres://postgres@{hosts.gateway}:{pg}/{db['NAME']}"
    return env


def _start_market(hosts: Hosts, tmp_path: Path) -> dict[str, str]:
    pg = hosts.expose(int(settings.DATABASES["default"]["PORT"] or 5432))
    redis = hosts.expose(int(settings.REDIS_URL.split(":")[2].split("/")[0]))
    urls = {}
    for i, name in enumerate(WEB):
        env = _env(hosts, pg, redis, GPUMARKET_VAR_DIR=str(tmp_path / name),
                   PROMETHEUS_MULTIPROC_DIR=str(tmp_path / name / "prometheus"))
        (tmp_path / name / "prometheus").mkdir(parents=True)
        address = hosts.address[name]
        hosts.run(name, [sys.executable, "-m", "uvicorn", "marketplace.asgi:application",
                         "--host", address, "--port", "8000", "--ws-per-message-deflate",
                         "false", "--log-level", "warning"],
                  env=env, cwd=ROOT, log=tmp_path / f"{name}-web.log")
        worker = [sys.executable, "-m", "celery", "-A", "marketplace", "worker", "--pool",
                  "solo", "--hostname", f"{name}@%h", "--loglevel", "INFO"]
        if i == 0:  # beat: exactly one, on the first host
            worker += ["--beat", "-s", str(tmp_path / name / "beat-schedule")]
        hosts.run(name, worker, env=env, cwd=ROOT, log=tmp_path / f"{name}-worker.log")
        urls[name] = f"http://{address}:8000"
    for name, url in urls.items():
        wait_until(f"the web process on {name}", lambda u=url: _answers(u), timeout=60)
    for name in WEB:
        log = tmp_path / f"{name}-worker.log"
        wait_until(f"the worker on {name}", lambda p=log: "ready" in p.read_text(), timeout=60)
    hosts.env = _env(hosts, pg, redis)
    return urls


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/v1/gpu-classes/", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_two_web_hosts_two_workers_and_runners_share_one_market(hosts, tmp_path, test_image,
                                                                docker_client):
    urls = _start_market(hosts, tmp_path)
    markets, runners = [], []
    try:
        _trade_on_both_hosts(hosts, tmp_path, urls, markets, runners, test_image,
                             docker_client)
    finally:
        hosts.close()  # the runners first: then their containers go
        for state in runners:
            uid = json.loads((state / "config.json").read_text()).get("node", {}).get("uid")
            for container in docker_client.containers.list(
                    all=True, filters={"label": f"gpumarket.node={uid}"}):
                container.remove(force=True)


def _trade_on_both_hosts(hosts, tmp_path, urls, markets, runners, test_image, docker_client):
    for i, dump in enumerate(DUMPS):
        provider, node, token = registered_node(dump, name=f"multihost-{i}")
        node.gpus.all().delete()  # the runner registers them itself
        push_host = WEB[i % 2]  # the runner's web host; its leases' bids go to the other
        state = tmp_path / f"runner-{i}"
        state.mkdir()
        reg = hosts.run("runners", [sys.executable, "-m", "providers.runner", "register",
                                    "--url", urls[push_host], "--token", token,
                                    "--simulate", str(dump), "--state-dir", str(state)],
                        env=hosts.env, cwd=ROOT, log=state / "register.log")
        assert reg.wait(60) == 0, (state / "register.log").read_text()
        hosts.run("runners", [sys.executable, "-m", "providers.runner", "run", "--state-dir",
                              str(state), "--poll-interval", "0.3", "--heartbeat-interval",
                              "3600", "--runtime", "docker", "--network", "none"],
                  env=hosts.env, cwd=ROOT, log=state / "runner.log")
        runners.append(state)
        node.refresh_from_db()
        slug = node.gpus.first().gpu_class.slug
        markets.append((slug, node, provider, WEB[(i + 1) % 2]))
    assert len({slug for slug, *_ in markets}) == 4, markets
    for state in runners:  # heartbeating, and its push channel open on its web host
        wait_until("the runner's push channel",
                   lambda s=state: "push: websocket" in (s / "runner.log").read_text()
                   and " connected" in (s / "runner.log").read_text(), timeout=60)

    until = (timezone.now() + timedelta(days=1)).isoformat()
    for _slug, node, provider, bid_host in markets:
        answer = httpx.post(f"{urls[bid_host]}/api/v1/orders/", timeout=30,
                            headers={"Authorization": f"Token {api_token(provider)}"},
                            json={"side": "ask", "node": node.pk, "gpus": OFFERED,
                                  "price": "2.00", "available_until": until})
        assert answer.status_code == 201, answer.text

    # a feed on web-b watches the first market, whose bids all go through web-a
    watched = next(slug for slug, *_, bid_host in markets if bid_host == "web-a")
    frames: list[dict] = []
    feed = ws_connect(f"ws://{hosts.address['web-b']}:8000/ws/markets/{watched}/",
                      origin=urls["web-b"], open_timeout=20)
    assert json.loads(feed.recv(timeout=20))["type"] == "snapshot"

    buyers = [(b, api_token(b)) for b in (funded_buyer(100) for _ in range(4))]
    bodies = []
    for slug, _node, _provider, bid_host in markets:
        for k in range(2 * OFFERED):  # each market's bids on both hosts, most on its own
            host = bid_host if k % 4 != 3 else WEB[WEB.index(bid_host) ^ 1]
            bodies.append((host, buyers[k % 4][1],
                           {"side": "bid", "gpu_class": slug, "gpus": 1, "hours": 1,
                            "price": f"{2.10 + k * 0.01:.2f}", "image": test_image,
                            "command": ["sleep", "3600"]}))
    answers: list[httpx.Response] = []
    start = threading.Barrier(len(bodies))

    def place(host: str, token: str, body: dict) -> None:
        start.wait(30)
        r = httpx.post(f"{urls[host]}/api/v1/orders/", json=body, timeout=60,
                       headers={"Authorization": f"Token {token}"})
        answers.append(r)

    threads = [threading.Thread(target=place, args=b) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert sorted(r.status_code for r in answers) == [201] * len(bodies), \
        [r.text for r in answers if r.status_code != 201]

    # one writer per market: every offered GPU leased exactly once, the rest of the bids rest
    gpu_ids = list(LeaseGpu.objects.filter(active=True).values_list("gpu_id", flat=True))
    assert not [g for g, n in Counter(gpu_ids).items() if n > 1]
    assert len(gpu_ids) == 4 * OFFERED
    for slug, node, *_ in markets:
        leases = Lease.objects.filter(market__slug=slug)
        assert leases.count() == OFFERED, slug
        assert set(leases.values_list("node_id", flat=True)) == {node.pk}
        bids = Order.objects.filter(market__slug=slug, side=Order.Side.BID)
        assert sorted(bids.values_list("status", flat=True)) == \
            ["filled"] * OFFERED + ["open"] * OFFERED

    # the feed on web-b saw the trades placed on web-a (through Redis)
    def trades_seen() -> bool:
        with contextlib.suppress(TimeoutError):
            frames.append(json.loads(feed.recv(timeout=1)))
        return sum(f["type"] == "trade" for f in frames) >= OFFERED
    wait_until("the trades on the other host's feed", trades_seen, timeout=60, every=0)
    feed.close()

    # each runner, told on its own web host of leases made on the other, runs them
    for lease in Lease.objects.all():
        wait_until(f"lease {lease.pk}'s container",
                   lambda pk=lease.pk: len(inspected(docker_client,
                                                     label=f"gpumarket.lease={pk}")) == 1,
                   timeout=90)
    wait_until("every lease running", lambda: Lease.objects.filter(
        status="running").count() == 4 * OFFERED, timeout=60)
