"""The buyer's stop and extend as the runner sees them, with real parts: the marketplace
under uvicorn (AsgiServer, the `/ws/runner/` push), the runner as its own process with the
Docker runtime (poll interval 30 s, so only the push can make it quick), a real container.

A stop ends the lease at once; the notice makes the runner fetch the list, the lease is
absent, and the container is gone within seconds. An extension's new `ends_at` reaches the
runner the same way, and the container outlives the old end.
GPUs are simulated from a recorded dump (`--simulate`): no GPU on this machine."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace.models import Lease
from tests.providers.runner.test_runner_push import RunnerProcess, _lease, _market
from tests.support.api import client_for
from tests.support.containers import inspected
from tests.support.servers import AsgiServer
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


@pytest.fixture
def asgi_url(transactional_db):
    with AsgiServer() as server:
        yield server.url


def _running(lease_id: int) -> Lease | None:
    lease = Lease.objects.get(pk=lease_id)
    return lease if lease.status == "running" else None


def _started(runner, buyer, test_image, **kw) -> tuple[Lease, list[str]]:
    wait_until("the runner's push websocket", lambda: "connected;" in runner.output(),
               timeout=60)
    lease = _lease(buyer, image=test_image, command=["sleep", "3600"], **kw)
    running = wait_until("the lease to run", lambda: _running(lease.pk), timeout=60)
    return running, [f"gpumarket.lease={lease.pk}", f"gpumarket.node={runner.uid}"]


def test_a_buyers_stop_removes_the_container_within_seconds(asgi_url, docker_client,
                                                            test_image, tmp_path):
    _, _node, token, buyer = _market()
    runner = RunnerProcess(asgi_url, token, tmp_path, "--poll-interval", "30")
    try:
        lease, label = _started(runner, buyer, test_image)
        assert len(inspected(docker_client, running_only=True, label=label)) == 1
        asked = time.monotonic()
        r = client_for(buyer).post(f"/api/v1/leases/{lease.pk}/stop/", format="json")
        assert r.status_code == 200 and r.json()["status"] == "cancelled", r.content
        wait_until("the container to go", lambda: not inspected(docker_client, label=label),
                   timeout=20, every=0.05)
        took = time.monotonic() - asked
        print(f"stop call → container removed: {took:.2f} s")
        assert took < 6, f"{took:.1f} s (grace 1 s, poll interval 30 s)"
        assert f"lease {lease.pk}: no longer listed by the marketplace" in runner.output()
        ended = Lease.objects.get(pk=lease.pk)
        assert ended.cause == "stopped by the buyer" and ended.cost is not None
    finally:
        runner.stop(docker_client)


def test_an_extended_lease_outlives_its_old_end(asgi_url, docker_client, test_image,
                                                tmp_path):
    """Ticks every second (ends_at checked), the list fetched only on notices (push up;
    resync every 30 s): without the notice of the new ends_at it stops at the old one."""
    _, _node, token, buyer = _market()
    runner = RunnerProcess(asgi_url, token, tmp_path, "--poll-interval", "1")
    try:
        lease, label = _started(runner, buyer, test_image, duration_seconds=8)
        old_end = lease.ends_at
        r = client_for(buyer).post(f"/api/v1/leases/{lease.pk}/extend/", {"seconds": 600},
                                   format="json")
        assert r.status_code == 200, r.content
        assert Lease.objects.get(pk=lease.pk).ends_at == old_end + timedelta(seconds=600)
        # the old end plus the runner's 1 s tick and a margin: it would have stopped it
        wait_until("the old end to pass",
                   lambda: timezone.now() > old_end + timedelta(seconds=3), timeout=30)
        assert Lease.objects.get(pk=lease.pk).status == "running"
        assert len(inspected(docker_client, running_only=True, label=label)) == 1
        assert "completed" not in runner.output()
    finally:
        runner.stop(docker_client)
