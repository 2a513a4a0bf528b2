"""The ledger mirrored on chain, on py-evm in process (eth-tester): deposits credited
once, every lease charge settled on chain once with the ledger's exact split, a crash
between transaction and record healed, a refused charge named, and reconcile clean."""

from __future__ import annotations

from datetime import timedelta

import pytest
from web3 import EthereumTesterProvider, Web3

from marketplace import book
from marketplace.lease_end import end_lease
from marketplace.leases import mark_running, meter_lease
from settlement import chain, onchain
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.models import ChainSettlement
from tests.conftest import ROOT, require_or_skip
from tests.factories import UserFactory, funded_buyer, in_a_day, registered_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def evm(settings):
    if not (ROOT / "contracts" / "build" / "Settlement.json").exists():
        require_or_skip("contracts/build/Settlement.json missing")
    settings.GPUMARKET_METER_INTERVAL_SECONDS = 3600
    w3 = Web3(EthereumTesterProvider())
    owner, operator, platform, *rest = w3.eth.accounts
    token = chain.deploy(w3, "MockUSD", sender=owner)
    contract = chain.deploy_settlement(w3, token.address, platform=platform, operator=operator,
                                       sender=owner, take_rate_bps=settings.GPUMARKET_TAKE_RATE_BPS)
    for account in rest[:3]:
        token.functions.mint(account, 10**12).transact({"from": owner})
    return onchain.ChainConfig(w3=w3, settlement=contract, operator=operator), token, rest[:3], \
        platform


def _lease(provider, node, buyer, hours=3):
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_490_000, gpus=2, available_until=in_a_day())
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=2_490_000,
                             gpus=2, duration_seconds=hours * 3600).leases
    return mark_running(lease=lease, container_id="c" * 64)


def test_deposit_settle_and_reconcile(evm):
    cfg, token, (buyer_addr, provider_addr, _), platform = evm
    provider, node, _ = registered_node()
    buyer = UserFactory()
    onchain.address_register(user_id=buyer.pk, address=buyer_addr.lower())
    onchain.address_register(user_id=provider.pk, address=provider_addr)

    chain.deposit(cfg.w3, cfg.settlement, buyer_addr, 100_000_000, token=token)
    assert onchain.sync_deposits(cfg) == 1
    assert onchain.sync_deposits(cfg) == 0  # once per event
    assert ledger.wallet(user_id=buyer.pk).available == 100_000_000

    lease = _lease(provider, node, buyer)
    t0 = lease.started_at
    meter_lease(lease_id=lease.pk, now=t0 + timedelta(hours=1, minutes=1))
    ended = end_lease(lease_id=lease.pk, status="completed", cause="done",
                      now=t0 + timedelta(hours=1, minutes=30))

    settled, problems = onchain.mirror_settlements(cfg)
    assert (settled, problems) == (2, [])  # the metered hour and the final half hour
    assert onchain.mirror_settlements(cfg) == (0, [])
    assert onchain.reconcile(cfg) == []
    provider_credit = chain.credit_of(cfg.settlement, provider_addr)
    assert provider_credit == ended.provider_amount
    assert chain.credit_of(cfg.settlement, platform) == ended.platform_fee
    assert chain.escrow_of(cfg.settlement, buyer_addr) == 100_000_000 - ended.cost
    assert first_violation() is None


def test_a_crash_after_the_transaction_is_healed_and_a_refusal_is_named(evm):
    cfg, token, (buyer_addr, provider_addr, poor_addr), _ = evm
    provider, node, _ = registered_node()
    buyer, poor = UserFactory(), funded_buyer(100)  # `poor` has ledger money, no escrow
    for user, addr in ((buyer, buyer_addr), (provider, provider_addr), (poor, poor_addr)):
        onchain.address_register(user_id=user.pk, address=addr)
    chain.deposit(cfg.w3, cfg.settlement, buyer_addr, 50_000_000, token=token)
    onchain.sync_deposits(cfg)

    paid = _lease(provider, node, buyer, hours=1)
    end_lease(lease_id=paid.pk, status="completed", cause="done",
              now=paid.started_at + timedelta(minutes=30))
    unfunded = _lease(provider, node, poor, hours=1)
    end_lease(lease_id=unfunded.pk, status="completed", cause="done",
              now=unfunded.started_at + timedelta(minutes=30))

    # a run settled `paid` on chain, then died before recording it
    [row] = [r for r in onchain._pending() if r.entry.reference == f"lease:{paid.pk}"]
    chain.settle(cfg.w3, cfg.settlement,
                 [chain.LeaseCharge(row.key, row.buyer, row.provider, row.cost)],
                 operator=cfg.operator)

    settled, problems = onchain.mirror_settlements(cfg)
    assert settled == 0
    assert len(problems) == 1 and f"lease:{unfunded.pk}" in problems[0]
    assert ChainSettlement.objects.get(entry__reference=f"lease:{paid.pk}").tx_hash == ""
    [mismatch] = onchain.reconcile(cfg)
    assert mismatch.kind == "missing_on_chain"


def test_addresses_are_checked():
    user, other = UserFactory(), UserFactory()
    with pytest.raises(ValueError, match="not an Ethereum address"):
        onchain.address_register(user_id=user.pk, address="0x123")
    addr = "0x" + "ab" * 20
    onchain.address_register(user_id=user.pk, address=addr)
    with pytest.raises(ValueError, match="another user"):
        onchain.address_register(user_id=other.pk, address=addr)
