"""The agent's reconciliation against a stand-in marketplace and the real Docker Engine."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient, Unauthorized
from providers.runner.nvml import DumpGpus
from providers.runner.runtime import DockerRuntime
from tests.support.containers import inspected

from .runner_helpers import H100, TOKEN, FakeMarketplace, iso

pytestmark = pytest.mark.docker

UUIDS = ["GPU-566e6f65-c38e-b12f-4824-6944218668b9", "GPU-9930d717-21dd-7692-054e-3d0a2bae76b5"]


@pytest.fixture
def agent_parts(marketplace: FakeMarketplace, docker_client, docker_node):
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none", simulate=True)
    lines: list[str] = []
    agent = Agent(client, DumpGpus(H100), runtime, poll_interval=0.2, grace_s=1,
                  log=lines.append)
    yield agent, runtime, lines
    client.close()


def containers(docker_client, node: str) -> list:
    return inspected(docker_client, label=f"gpumarket.node={node}")


def test_pending_lease_gets_one_container_and_running_is_reported(
    agent_parts, marketplace, docker_client, docker_node, test_image
):
    agent, _runtime, lines = agent_parts
    agent.announce()
    assert marketplace.inventories[0]["source"] == f"simulate:{H100.name}"
    assert len(marketplace.inventories[0]["gpus"]) == 8
    marketplace.add_lease(12, UUIDS, image=test_image, command=["sleep", "60"])

    agent.tick()

    [container] = containers(docker_client, docker_node)
    events = marketplace.events_for(12)
    assert [e["status"] for e in events] == ["starting", "running"]
    assert events[1]["container_id"] == container.id
    assert container.labels["gpumarket.lease"] == "12"
    env = dict(item.split("=", 1) for item in container.attrs["Config"]["Env"])
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(UUIDS)
    assert marketplace.heartbeats[0]["runtime"] == "docker"
    assert marketplace.heartbeats[0]["gpus"][0]["temperature_c"] == 36
    assert any(line.startswith(f"lease 12: started container {container.id[:12]}")
               for line in lines)

    agent.tick()  # now `running` with time left: nothing changes, never a second container
    assert [c.id for c in containers(docker_client, docker_node)] == [container.id]
    assert len(marketplace.events_for(12)) == 2

    # The marketplace ends the lease (it disappears from the list): the container goes.
    del marketplace.leases[12]
    agent.tick()
    assert containers(docker_client, docker_node) == []
    assert any("lease 12: no longer listed" in line for line in lines)


def test_lease_past_ends_at_is_completed_with_usage(
    agent_parts, marketplace, docker_client, docker_node, test_image
):
    agent, _runtime, lines = agent_parts
    marketplace.add_lease(13, UUIDS, image=test_image, command=["sleep", "60"],
                          duration_seconds=5)
    agent.tick()
    assert [e["status"] for e in marketplace.events_for(13)] == ["starting", "running"]
    # Move the lease clock 5 s back: it started 5 s ago and ended now.
    lease = marketplace.leases[13]
    now = datetime.now(UTC)
    lease["started_at"], lease["ends_at"] = iso(now - timedelta(seconds=5)), iso(now)

    agent.tick()

    last = marketplace.events_for(13)[-1]
    assert last["status"] == "completed"
    assert last["usage_seconds"] == 5
    assert marketplace.leases[13]["status"] == "completed"
    assert containers(docker_client, docker_node) == []
    assert "lease 13: completed after 5 s, container removed" in lines


def test_container_exiting_nonzero_fails_the_lease(
    agent_parts, marketplace, docker_client, docker_node, test_image
):
    agent, runtime, _lines = agent_parts
    marketplace.add_lease(14, UUIDS, image=test_image, command=["sh", "-c", "exit 3"])
    agent.tick()
    deadline = time.monotonic() + 10
    while runtime.exit_status(14) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    agent.tick()
    last = marketplace.events_for(14)[-1]
    assert (last["status"], last["cause"]) == ("failed", "container exited with status 3")
    assert containers(docker_client, docker_node) == []


def test_restarted_runner_readopts_instead_of_starting_twice(
    marketplace, docker_client, docker_node, test_image
):
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none", simulate=True)
    lease = marketplace.add_lease(15, UUIDS, image=test_image, command=["sleep", "60"])
    first_id = runtime.start(lease)  # a runner started it, then died before reporting
    lease["status"] = "starting"

    client = MarketplaceClient(marketplace.url, TOKEN)
    fresh = DockerRuntime(docker_node, client=docker_client, network_mode="none", simulate=True)
    lines: list[str] = []
    Agent(client, DumpGpus(H100), fresh, log=lines.append).tick()
    client.close()

    assert [c.id for c in containers(docker_client, docker_node)] == [first_id]
    assert marketplace.events_for(15) == [{"status": "running", "container_id": first_id}]
    assert f"lease 15: re-adopted container {first_id[:12]}" in lines


def test_run_loop_survives_an_outage_and_stops_without_teardown(
    agent_parts, marketplace, docker_client, docker_node, test_image
):
    agent, _runtime, lines = agent_parts
    marketplace.add_lease(16, UUIDS, image=test_image, command=["sleep", "60"])
    stop = threading.Event()
    loop = threading.Thread(target=agent.run, args=(stop,))
    loop.start()
    deadline = time.monotonic() + 10
    while len(marketplace.events_for(16)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    marketplace.outage = True
    time.sleep(0.8)
    marketplace.outage = False
    deadline = time.monotonic() + 10
    while "marketplace reachable again" not in lines and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    loop.join(timeout=10)
    assert not loop.is_alive()
    assert [e["status"] for e in marketplace.events_for(16)] == ["starting", "running"]
    # The container is left running for the next runner to adopt.
    [container] = containers(docker_client, docker_node)
    assert container.status == "running"
    outage = [line for line in lines if "503" in line]
    assert len(outage) == 1  # logged once, not once per retry
    assert "down for maintenance" in outage[0]
    assert "marketplace reachable again" in lines
    assert lines[-1] == "stopped; 1 lease workload(s) left running for re-adoption"


def test_401_is_raised_as_unauthorized(marketplace, docker_client, docker_node):
    client = MarketplaceClient(marketplace.url, "wrong-token")
    runtime = DockerRuntime(docker_node, client=docker_client, simulate=True)
    with pytest.raises(Unauthorized, match="refused the runner token"):
        Agent(client, DumpGpus(H100), runtime, log=lambda _m: None).run(threading.Event())
    client.close()
