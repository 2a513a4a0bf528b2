"""A lease as the runner sees it (providers/runner/lease.py): each item of GET /leases/ is
parsed once by the client into a RunnerLease; unknown fields are ignored, missing ones take
the value the runner always assumed, an item without an id fails the round as before.
Through the stand-in marketplace (HTTP on 127.0.0.1) and the real runtimes."""

from __future__ import annotations

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.gpu_processes import ProcessSource, source_for
from providers.runner.lease import RunnerLease
from providers.runner.nvml import DumpGpus, GpuSource
from providers.runner.runtime import DockerRuntime, ProcessRuntime, RuntimeFailure
from providers.runner.runtime_common import Runtime

from .runner_helpers import A10, TOKEN, lease_for


def _client(marketplace):
    return MarketplaceClient(marketplace.url, TOKEN, timeout=5)


def test_the_client_parses_each_listed_lease_once(marketplace):
    marketplace.add_lease(21, ["GPU-a", "GPU-b"], image="img:1", command=["sleep", "9"],
                          ports=[8888], preempt_at=None, mig_profile="future field")
    marketplace.leases[22] = {"id": "22", "status": "starting"}  # every other field missing
    client = _client(marketplace)
    try:
        first, second = sorted(client.leases(), key=lambda lease: lease.id)
    finally:
        client.close()
    assert first == RunnerLease(
        id=21, status="pending", image="img:1", command=["sleep", "9"],
        gpu_uuids=["GPU-a", "GPU-b"], env={"GPUMARKET_LEASE_ID": "21"},
        duration_seconds=3600, started_at=None, ends_at=None, preempt_at=None, ports=[8888])
    assert second == RunnerLease(id=22, status="starting")
    assert (second.image, second.command, second.gpu_uuids, second.env, second.ports) == (
        None, None, [], {}, [])
    assert (second.started_at, second.ends_at, second.duration_seconds) == (None, None, None)


def test_an_item_without_an_id_fails_the_round_and_is_fetched_again(marketplace, tmp_path):
    marketplace.leases[23] = {"status": "pending", "image": "img:1"}
    lines: list[str] = []
    client = _client(marketplace)
    agent = Agent(client, DumpGpus(A10), ProcessRuntime(tmp_path), log=lines.append)
    try:
        with pytest.raises(KeyError, match="id"):
            agent.tick()
    finally:
        client.close()
    assert agent._stale  # the next tick asks the marketplace again


def test_runtimes_take_a_runner_lease_or_its_wire_form(tmp_path):
    wire = lease_for(24, "ignored", ["sleep", "30"])
    assert RunnerLease.of(wire) == RunnerLease.parse(wire)
    parsed = RunnerLease.of(wire)
    assert RunnerLease.of(parsed) is parsed
    runtime = ProcessRuntime(tmp_path)
    try:
        handle = runtime.start(parsed)
        assert runtime.start(wire) == handle  # the same lease: never two workloads
        assert runtime.verify_gpus(parsed) is None and runtime.endpoints(parsed) is None
    finally:
        runtime.stop(24, 0)


@pytest.mark.docker
def test_docker_refuses_a_lease_without_an_image(docker_client, docker_node):
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                            simulate=True)
    lease = RunnerLease(id=25, status="pending", gpu_uuids=["GPU-a"])
    with pytest.raises(RuntimeFailure, match=r"^the lease names no image$"):
        runtime.start(lease)
    assert runtime.list_leases() == {}


@pytest.mark.docker
def test_each_runtime_and_source_has_every_member_of_its_protocol(tmp_path, docker_client,
                                                                 docker_node):
    docker = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                           simulate=True)
    assert isinstance(docker, Runtime) and isinstance(ProcessRuntime(tmp_path), Runtime)
    gpus = DumpGpus(A10)
    assert isinstance(gpus, GpuSource) and isinstance(source_for(gpus), ProcessSource)
