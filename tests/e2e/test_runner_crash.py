"""The runner dies mid-lease (SIGKILL, no goodbye) and comes back: real marketplace
(pytest-django's live server on the test PostgreSQL database), the runner as its own process
(`python -m providers.runner run`, Docker runtime), a real container.

- the container keeps running while the runner is dead, and the restarted runner adopts
  it: the same container, never a second one, the lease still `running`;
- a lease the marketplace ends while the runner is dead is stopped by the restarted runner,
  although it never saw the end (the lease is simply absent from its list).

The GPUs are simulated from the recorded 8 × H100 `nvidia-smi -q` report (`--simulate`):
there is no GPU on this machine. Nothing else is mocked.
"""

from __future__ import annotations

import signal
import time

import pytest
from django.utils import timezone

from marketplace import book
from marketplace.lease_end import end_lease
from marketplace.models import Lease
from providers.models import Node
from tests.factories import H100_DUMP, funded_buyer, in_a_day, registered_node
from tests.support.containers import inspected
from tests.support.servers import SeenRequests
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker]

LEASES = "/api/v1/runner/leases/"  # the runner fetches its leases here to reconcile them


def _containers(docker_client, lease_id: int) -> list:
    return inspected(docker_client, label=f"gpumarket.lease={lease_id}")


def _kill(runner) -> None:
    runner.proc.send_signal(signal.SIGKILL)
    assert runner.proc.wait(timeout=10) == -signal.SIGKILL


def _heartbeat_after(node_id: int, moment) -> bool:
    seen = Node.objects.get(pk=node_id).last_heartbeat_at
    return seen is not None and seen > moment


def test_sigkill_mid_lease_the_container_is_readopted_and_an_ended_lease_stopped(
        live_server, docker_client, test_image, runner_factory):
    provider, node, token = registered_node(H100_DUMP, name="crashy-runner")
    runner = runner_factory(live_server.url, token, H100_DUMP)
    assert runner.register().returncode == 0
    runner.start()
    buyer = funded_buyer(100)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_490_000, gpus=8, available_until=in_a_day())
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=2_490_000,
                             gpus=2, duration_seconds=3600, image=test_image,
                             command=["sleep", "3600"]).leases
    running = wait_until("the lease to run", lambda: Lease.objects.filter(
        pk=lease.pk, status="running").first(), timeout=60)
    [container] = _containers(docker_client, lease.pk)
    assert container.id == running.container_id

    # 1. kill -9 mid-lease: the container runs on without its runner
    _kill(runner)
    container.reload()
    assert container.status == "running"

    # 2. restart: the same container is adopted; the lease clock is untouched
    restarted_at = timezone.now()
    runner.start()
    wait_until("the restarted runner to heartbeat", lambda: _heartbeat_after(node.pk,
                                                                           restarted_at))
    with SeenRequests(LEASES) as fetches:  # several reconciliations at the 0.3 s poll
        wait_until("3 more lease fetches", lambda: fetches.count >= 3, timeout=30)
    [again] = _containers(docker_client, lease.pk)
    assert again.id == container.id and again.status == "running"
    after = Lease.objects.get(pk=lease.pk)
    assert after.status == "running"
    assert (after.container_id, after.started_at) == (running.container_id, running.started_at)
    assert after.events.filter(to_status="running").count() == 1
    assert "failed" not in runner.output()

    # 3. kill -9 again; the marketplace ends the lease meanwhile (the runner never hears it)
    _kill(runner)
    ended = end_lease(lease_id=lease.pk, status="completed", cause="test: ended by the buyer")
    assert ended.status == "completed"
    time.sleep(1)
    [orphan] = _containers(docker_client, lease.pk)
    assert orphan.id == container.id and orphan.status == "running"

    # 4. the restarted runner finds the lease gone from its list and removes the container
    runner.start()
    wait_until("the restarted runner to remove the ended lease's container",  # no inspect:
               lambda: not docker_client.api.containers(  # it may vanish meanwhile
                   all=True, filters={"label": f"gpumarket.lease={lease.pk}"}), timeout=60)
    assert f"lease {lease.pk}: no longer listed by the marketplace" in runner.output()
    assert Lease.objects.get(pk=lease.pk).status == "completed"  # nothing reported after


def test_killed_between_docker_run_and_the_running_report_the_container_is_adopted(
        live_server, docker_client, test_image, runner_factory):
    """The narrowest window: the runner reported `starting` and `docker run` returned, then
    it died before reporting `running`. The restarted runner finds the labelled container,
    reports it `running` (the lease clock starts then) and starts no second one. The window
    is re-created exactly: the runner is killed while idle, then the lease is moved to
    `starting` and its container started as the runner would have (runtime.DockerRuntime
    with the node's label)."""
    import json

    from marketplace.api.runner import runner_lease
    from providers.runner.runtime import DockerRuntime

    provider, node, token = registered_node(H100_DUMP, name="crashy-starter")
    runner = runner_factory(live_server.url, token, H100_DUMP)
    assert runner.register().returncode == 0
    runner.start()
    wait_until("the runner's first heartbeat", lambda: _heartbeat_after(node.pk,
                                                                       node.registered_at))
    _kill(runner)

    buyer = funded_buyer(100)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_490_000, gpus=8, available_until=in_a_day())
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=2_490_000,
                             gpus=1, duration_seconds=3600, image=test_image,
                             command=["sleep", "3600"]).leases
    lease.set_status("starting", cause="runner is starting the container")
    uid = json.loads((runner.state / "config.json").read_text())["node"]["uid"]
    runtime = DockerRuntime(str(uid), client=docker_client, network_mode="none", simulate=True)
    container_id = runtime.start(runner_lease(lease))

    runner.start()
    running = wait_until("the restarted runner to report running", lambda: Lease.objects.filter(
        pk=lease.pk, status="running").first(), timeout=60)
    assert running.container_id == container_id
    with SeenRequests(LEASES) as fetches:  # a few more reconciliations
        wait_until("2 more lease fetches", lambda: fetches.count >= 2, timeout=30)
    assert [c["Id"] for c in docker_client.api.containers(
        all=True, filters={"label": f"gpumarket.lease={lease.pk}"})] == [container_id]
    assert f"lease {lease.pk}: re-adopted container {container_id[:12]}" in runner.output()
