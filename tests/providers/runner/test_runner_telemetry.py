"""The runner's heartbeat `telemetry` (providers/runner/telemetry.py): real Docker, the
stand-in marketplace, the recorded 8 × H100 host with one GPU's readings replayed. Only
running leases, each with its own GPUs' readings; none once the lease ended."""

from __future__ import annotations

import pytest

from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.nvml import DumpGpus
from providers.runner.runtime import DockerRuntime

from .runner_helpers import H100, TOKEN, FakeMarketplace

pytestmark = pytest.mark.docker

GPU0 = "GPU-566e6f65-c38e-b12f-4824-6944218668b9"
GPU1 = "GPU-9930d717-21dd-7692-054e-3d0a2bae76b5"


def test_heartbeats_carry_the_running_leases_gpu_readings_only(
        marketplace: FakeMarketplace, docker_client, docker_node, test_image):
    client = MarketplaceClient(marketplace.url, TOKEN, timeout=5)
    runtime = DockerRuntime(docker_node, client=docker_client, network_mode="none",
                            simulate=True)
    gpus = DumpGpus(H100, replay_health={GPU0: {"utilization_pct": 91, "fb_used_mib": 1234,
                                                "hw_power_brake": True}})
    agent = Agent(client, gpus, runtime, poll_interval=0.2, heartbeat_interval=0.0,
                  grace_s=1, log=lambda _line: None)
    try:
        marketplace.add_lease(41, [GPU0, GPU1], image=test_image, command=["sleep", "60"])
        agent.tick()  # starts it and reports running
        assert marketplace.leases[41]["status"] == "running"
        agent.tick()
        [item] = marketplace.heartbeats[-1]["telemetry"]
        assert item["lease"] == 41
        assert [g["uuid"] for g in item["gpus"]] == [GPU0, GPU1]
        first = item["gpus"][0]
        assert (first["utilization_pct"], first["fb_used_mib"], first["throttle_reasons"]) \
            == (91, 1234, ["hw_power_brake"])
        assert set(first) == {"uuid", "utilization_pct", "fb_used_mib", "power_w",
                              "temperature_c", "sm_clock_mhz", "mem_clock_mhz",
                              "throttle_reasons"}
        assert isinstance(first["sm_clock_mhz"], int)  # the dump's clocks, as NVML gives

        marketplace.leases[41]["status"] = "completed"  # ended by the marketplace
        agent.tick()
        agent.tick()
        assert "telemetry" not in marketplace.heartbeats[-1]
    finally:
        client.close()
