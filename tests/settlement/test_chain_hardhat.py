"""Integration over real JSON-RPC: a Hardhat 2 node the test starts on 127.0.0.1.

deploy → deposit → batch settle → withdraw → reclaim after the delay → reconcile, all
through settlement.chain and web3's HTTPProvider, exactly as against a production node.
"""

from __future__ import annotations

import pytest

from settlement import chain
from settlement.chain import LeaseCharge, LedgerSettlement, SettlementRevert
from settlement.split import split
from tests.support.hardhat import hardhat_node

DELAY = 3600


@pytest.fixture(scope="module")
def hardhat_w3():
    with hardhat_node() as (w3, _url):
        assert w3.eth.chain_id == 31337
        yield w3


def test_settlement_over_json_rpc_against_hardhat(hardhat_w3):
    w3 = hardhat_w3
    owner, operator, platform, buyer, provider, provider2 = w3.eth.accounts[:6]
    token = chain.deploy(w3, "MockUSD", sender=owner)
    s = chain.deploy_settlement(w3, token.address, platform=platform, operator=operator,
                                sender=owner, take_rate_bps=1500, reclaim_delay_s=DELAY)
    chain._transact(w3, token.functions.mint(buyer, 10**12), owner)

    chain.deposit(w3, s, buyer, 50_000_000)  # 50 USD
    charges = [LeaseCharge("hh-1", buyer, provider, 333), LeaseCharge("hh-2", buyer, provider2, 1),
               LeaseCharge("hh-3", buyer, provider, 2_490_000)]
    [receipt] = chain.settle(w3, s, charges, operator=operator)
    assert receipt["status"] == 1
    # a retry is a no-op; a forced second settlement is refused with the decoded error
    assert chain.settle(w3, s, charges, operator=operator) == []
    with pytest.raises(SettlementRevert, match=r"^AlreadySettled"):
        chain._transact(w3, s.functions.settle(chain.lease_key("hh-1"), buyer, provider, 333),
                        operator)
    with pytest.raises(SettlementRevert, match=r"^NotOperator"):
        chain.settle(w3, s, [LeaseCharge("hh-4", buyer, provider, 5)], operator=buyer)

    assert chain.credit_of(s, provider) == 284 + 2_116_500
    assert chain.credit_of(s, provider2) == 1
    assert chain.credit_of(s, platform) == 49 + 373_500
    chain.withdraw(w3, s, provider)
    chain.withdraw(w3, s, platform)
    assert token.functions.balanceOf(provider).call() == 284 + 2_116_500

    ledger = [LedgerSettlement(c.lease_id, c.cost, *split(c.cost, 1500)[1:], c.buyer, c.provider)
              for c in charges]
    assert chain.reconcile(ledger, chain.settled_events(s)) == []
    assert [m.kind for m in chain.reconcile(ledger[:2], chain.settled_events(s))] == [
        "not_in_ledger"]

    # the operator disappears: the buyer reclaims the rest after the delay
    chain.request_reclaim(w3, s, buyer)
    with pytest.raises(SettlementRevert, match=r"^ReclaimNotYetAvailable"):
        chain.reclaim(w3, s, buyer)
    w3.provider.make_request("evm_increaseTime", [DELAY])
    w3.provider.make_request("evm_mine", [])
    chain.reclaim(w3, s, buyer)
    assert chain.escrow_of(s, buyer) == 0
    assert token.functions.balanceOf(buyer).call() == 10**12 - 333 - 1 - 2_490_000
    assert s.functions.totalOwed().call() == token.functions.balanceOf(s.address).call() == 1
