"""Exactly once under a crash: SIGKILL the Celery worker in the middle of a settlement
run, start a new one, and every lease is settled exactly once (DESIGN invariant 6)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from datetime import timedelta

import pytest
from django.db.models import Count
from django.utils import timezone

from marketplace import book
from marketplace.leases import mark_running
from marketplace.models import Lease
from providers import services as provider_services
from settlement.checks import first_violation
from settlement.models import JournalEntry
from tests.conftest import ROOT, require_or_skip
from tests.factories import UserFactory, ensure_catalog, funded_buyer, in_a_day
from tests.support.processes import child_env
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

LEASES = 120


def _overdue_leases(count: int) -> list[int]:
    """`count` running leases of one GPU each, all past their end and grace period."""
    ensure_catalog()
    user = UserFactory()
    provider = provider_services.provider_onboard(user_id=user.pk, display_name="Crashy")
    buyer = funded_buyer(10_000)
    ids = []
    for n in range(count // 8):
        node = provider_services.node_create(provider=provider, name=f"n{n}").node
        provider_services.inventory_record(
            node=node, hostname=f"n{n}", driver_version="535", cuda_version="12.2",
            runner_version="t", source="test",
            gpus=[{"uuid": f"GPU-{uuid.uuid4()}", "product_name": "NVIDIA A10",
                   "gpu_class": "a10", "memory_mib": 23028, "pci_bus_id": f"0:{i}"}
                  for i in range(8)])
        provider_services.heartbeat_record(node=node, runtime="docker", gpus=[])
        book.place_ask(provider_id=user.pk, node_id=node.pk, market_slug="a10",
                       price=1_010_000, gpus=8, available_until=in_a_day())
    for _ in range(count):
        [lease] = book.place_bid(buyer_id=buyer.pk, market_slug="a10", price=1_010_000,
                                 gpus=1, duration_seconds=60).leases
        ids.append(mark_running(lease=lease, container_id=uuid.uuid4().hex,
                                now=timezone.now() - timedelta(minutes=10)).pk)
    return ids


def _worker(env, log):
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "marketplace", "worker", "--beat", "--pool",
         "solo", "--loglevel", "INFO", "-s", str(log.parent / f"beat-{log.name}")],
        cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
        start_new_session=True)


def test_sigkill_mid_settlement_then_restart_settles_each_lease_once(tmp_path,
                                                                    django_db_setup):
    from django.conf import settings

    if not settings.CELERY_BROKER_URL.startswith("redis"):
        require_or_skip("needs REDIS_URL (make test sets it)")
    ids = _overdue_leases(LEASES)
    # batches of 20 (one transaction each): the kill lands between two commits
    env = child_env(GPUMARKET_VAR_DIR=str(tmp_path), GPUMARKET_LEASE_GRACE_SECONDS="0",
                    GPUMARKET_LEASE_END_BATCH="20")
    subprocess.run([sys.executable, "-m", "celery", "-A", "marketplace", "purge", "-f"],
                   cwd=ROOT, env=env, check=True, capture_output=True)

    def settled() -> int:
        return Lease.objects.filter(pk__in=ids, settled_at__isnull=False).count()

    first = _worker(env, tmp_path / "worker1.log")
    try:
        wait_until("the first worker to start settling", lambda: settled() > 0, timeout=60,
                   every=0.05)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # worker and its beat, no goodbye
        first.wait(timeout=10)
    killed_at = settled()
    assert 0 < killed_at < LEASES, f"the kill did not land mid-run ({killed_at} settled)"

    second = _worker(env, tmp_path / "worker2.log")
    try:
        wait_until("every lease to be settled", lambda: settled() == LEASES, timeout=120)
    finally:
        os.killpg(second.pid, signal.SIGTERM)
        second.wait(timeout=30)

    per_lease = (JournalEntry.objects.filter(kind="lease_settle",
                                             reference__in=[f"lease:{i}" for i in ids])
                 .values("reference").annotate(n=Count("id")))
    assert sorted(row["n"] for row in per_lease) == [1] * LEASES
    assert set(Lease.objects.filter(pk__in=ids).values_list("status", flat=True)) == {
        "completed"}
    assert first_violation() is None


def test_sigkill_with_the_chain_on_ledger_and_chain_agree(tmp_path, django_db_setup, settings):
    """The same crash with on-chain settlement enabled: the worker (beat every second)
    both ends leases and mirrors their settlements on a Hardhat node; after the kill and
    a restart, every lease is settled once in the ledger and once on chain, with equal
    amounts (reconcile finds nothing)."""
    from django.conf import settings as conf

    from settlement import chain, onchain
    from settlement.models import ChainSettlement
    from tests.support.hardhat import hardhat_node

    if not conf.CELERY_BROKER_URL.startswith("redis"):
        require_or_skip("needs REDIS_URL (make test sets it)")
    with hardhat_node() as (w3, url):
        owner, operator, platform, buyer_addr, provider_addr = w3.eth.accounts[:5]
        token = chain.deploy(w3, "MockUSD", sender=owner)
        contract = chain.deploy_settlement(w3, token.address, platform=platform,
                                           operator=operator, sender=owner,
                                           take_rate_bps=conf.GPUMARKET_TAKE_RATE_BPS)
        chain._transact(w3, token.functions.mint(buyer_addr, 10**12), owner)
        chain.deposit(w3, contract, buyer_addr, 10**11, token=token)
        settings.GPUMARKET_CHAIN_RPC_URL = url
        settings.GPUMARKET_CHAIN_SETTLEMENT_ADDRESS = contract.address
        settings.GPUMARKET_CHAIN_OPERATOR = operator

        count = 48
        ids = _overdue_leases(count)
        lease = Lease.objects.get(pk=ids[0])
        onchain.address_register(user_id=lease.buyer_id, address=buyer_addr)
        onchain.address_register(user_id=lease.provider_id, address=provider_addr)

        env = child_env(GPUMARKET_VAR_DIR=str(tmp_path), GPUMARKET_LEASE_GRACE_SECONDS="0",
                        GPUMARKET_CHAIN_RPC_URL=url,
                        GPUMARKET_CHAIN_SETTLEMENT_ADDRESS=contract.address,
                        GPUMARKET_CHAIN_OPERATOR=operator, GPUMARKET_CHAIN_MIRROR_SECONDS="1",
                        GPUMARKET_LEASE_END_BATCH="20")
        subprocess.run([sys.executable, "-m", "celery", "-A", "marketplace", "purge", "-f"],
                       cwd=ROOT, env=env, check=True, capture_output=True)

        def settled() -> int:
            return Lease.objects.filter(pk__in=ids, settled_at__isnull=False).count()

        def mirrored() -> int:
            return ChainSettlement.objects.filter(
                entry__reference__in=[f"lease:{i}" for i in ids]).count()

        first = _worker(env, tmp_path / "chain-worker1.log")
        try:
            wait_until("the first worker to start settling", lambda: settled() > 0,
                       timeout=60, every=0.05)
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=10)
        assert settled() < count or mirrored() < count, "the kill landed after everything"

        second = _worker(env, tmp_path / "chain-worker2.log")
        try:
            wait_until("every lease settled and mirrored on chain",
                       lambda: settled() == count and mirrored() == count, timeout=180)
        finally:
            os.killpg(second.pid, signal.SIGTERM)
            second.wait(timeout=30)

        cfg = onchain.from_settings()
        assert onchain.reconcile(cfg) == []
        per_lease = (JournalEntry.objects.filter(kind="lease_settle",
                                                 reference__in=[f"lease:{i}" for i in ids])
                     .values("reference").annotate(n=Count("id")))
        assert sorted(row["n"] for row in per_lease) == [1] * count
        events = chain.settled_events(cfg.settlement)
        assert len(events) == count == len({e.lease_id for e in events})
        assert first_violation() is None  # includes ledger_matches_chain
        settings.GPUMARKET_CHAIN_RPC_URL = ""  # the node stops here; the guard runs later
