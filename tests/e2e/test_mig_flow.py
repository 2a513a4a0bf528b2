"""MIG slices end to end (issue 13), with real parts: PostgreSQL, the live HTTP server, the
runner's agent over HTTP, and real Docker containers (--simulate: no GPU reaches them).

The recorded MIG-partitioned H100 host registers its 4 slices (never the GPU whole) →
an ask and a bid for 2 slices of 1g.10gb trade → the lease's container sees exactly
those two MIG UUIDs (NVIDIA_VISIBLE_DEVICES, checked from inside by the runner) → the
lease ends, the container is gone, 85 % / 15 %, the hold released, the ledger clean.

The agent runs in a thread here, on the recorded host's GpuInfo (tests/support/mig_host):
# needs: nvsmi — once the dump parser reads MIG devices, this is
# `gpumarket-runner run --simulate data/nvidia-smi/h100-80gb-hbm3-mig-x1.*.q-idle.txt`.
"""

from __future__ import annotations

import threading

import pytest

from marketplace import book
from marketplace.models import Lease
from providers import services as provider_services
from providers.models import Gpu, Node
from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.nvml import READING_KEYS
from providers.runner.runtime import DockerRuntime
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.split import split
from tests.factories import H100, H100_MIG_PROFILES, UserFactory, funded_buyer, in_a_day, mig_market
from tests.support.containers import inspected
from tests.support.mig_host import H100_MIG
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker]

LEASE_S = 8
ONE_G = f"{H100}.1g.10gb"


class RecordedMigHost:
    """The recorded MIG H100 as a GPU source (nvml.GpuSource): its inventory; readings
    that say nothing (the recording's health is not replayed here); no XIDs."""

    simulate = True
    xid_note = None
    source = H100_MIG.source

    def inventory(self):
        return H100_MIG

    def sample_health(self, uuids):
        return [{**dict.fromkeys(READING_KEYS), "uuid": u} for u in uuids]

    def xid_events(self):
        return []


def _lease(lease_id: int, *statuses: str):
    lease = Lease.objects.get(pk=lease_id)
    return lease if lease.status in statuses else None


def test_slices_register_trade_run_and_settle(live_server, docker_client, test_image):
    for profile in H100_MIG_PROFILES:
        mig_market(H100, profile)
    provider = UserFactory()
    created = provider_services.node_create(
        provider=provider_services.provider_onboard(user_id=provider.pk, display_name="Acme"),
        name="mig-e2e")
    node = created.node
    client = MarketplaceClient(live_server.url, created.runner_token, timeout=10)
    label = f"mig-e2e-{node.uid}"
    runtime = DockerRuntime(label, client=docker_client, network_mode="none", simulate=True)
    lines: list[str] = []
    agent = Agent(client, RecordedMigHost(), runtime, poll_interval=0.3, grace_s=1,
                  log=lines.append)
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until("the runner to register", lambda: node.gpus.count() == 4, timeout=30)
        wait_until("the runner's first heartbeat", lambda: Node.objects.get(
            pk=node.pk).last_heartbeat_at is not None, timeout=30)  # asks need a heard node
        slices = {g.uuid: g for g in node.gpus.all()}
        assert set(slices) == {d.uuid for d in H100_MIG.gpus[0].mig_devices}
        assert not Gpu.every.get(uuid=H100_MIG.gpus[0].uuid).listed  # never offered whole

        buyer = funded_buyer(100)
        ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=ONE_G,
                             price=400_000, gpus=2, available_until=in_a_day()).order
        placed = book.place_bid(buyer_id=buyer.pk, market_slug=ONE_G, price=450_000, gpus=2,
                                duration_seconds=LEASE_S, image=test_image,
                                command=["sleep", "3600"])
        [lease] = placed.leases
        leased = sorted(lg.gpu.uuid for lg in lease.lease_gpus.all())
        assert leased == sorted(u for u, g in slices.items() if g.mig_profile == "1g.10gb")

        running = wait_until("the lease to run",
                             lambda: _lease(lease.pk, "running", "completed"), timeout=30)
        [container] = inspected(docker_client, label=f"gpumarket.lease={lease.pk}")
        assert container.id == running.container_id
        env = dict(e.split("=", 1) for e in container.attrs["Config"]["Env"])
        assert sorted(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == leased
        assert not any("GPU check failed" in line for line in lines), lines

        ended = wait_until("the lease to end",
                           lambda: _lease(lease.pk, "completed", "failed"), timeout=40)
        assert ended.status == "completed", ended.cause
        wait_until("the container to be removed",
                   lambda: not inspected(docker_client, label=f"gpumarket.lease={lease.pk}"),
                   timeout=30)
        parts = split(ended.cost, 1500)
        assert ended.cost > 0
        assert (ended.provider_amount, ended.platform_fee) == (parts.provider,
                                                                parts.platform_fee)
        assert ledger.wallet(user_id=provider.pk).earned == parts.provider
        assert ledger.wallet(user_id=buyer.pk).held == 0
        ask.refresh_from_db()
        assert ask.remaining_gpus == 2  # both slices back on the ask
        assert first_violation() is None
    finally:
        stop.set()
        thread.join(timeout=20)
        client.close()
        for c in docker_client.containers.list(all=True,
                                               filters={"label": f"gpumarket.node={label}"}):
            c.remove(force=True)
