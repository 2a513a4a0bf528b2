"""Settlement.sol, rule by rule, on py-evm in process (eth-tester): no node, no network.

Every amount is micro-USD (= base units of the 6-decimal test stablecoin). The split the
contract credits must be `settlement.split.split` to the unit.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from eth_utils import function_signature_to_4byte_selector
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from web3 import EthereumTesterProvider, Web3
from web3.logs import DISCARD

from settlement import chain
from settlement.chain import LeaseCharge, LedgerSettlement, SettlementRevert
from settlement.split import split

TAKE_RATE = 1500
DELAY = 24 * 3600
FUND = 10**15  # micro-USD minted to each buyer (1e9 USD)


@pytest.fixture(scope="module")
def evm():
    """One in-process chain per module: MockUSD, a Settlement at 15 %, named accounts."""
    w3 = Web3(EthereumTesterProvider())
    a = w3.eth.accounts
    ns = SimpleNamespace(
        w3=w3, tester=w3.provider.ethereum_tester,
        owner=a[0], operator=a[1], platform=a[2], buyer=a[3], buyer2=a[4],
        provider=a[5], provider2=a[6], stranger=a[7],
    )
    ns.token = chain.deploy(w3, "MockUSD", sender=ns.owner)
    ns.settlement = chain.deploy_settlement(
        w3, ns.token.address, platform=ns.platform, operator=ns.operator, sender=ns.owner,
        take_rate_bps=TAKE_RATE, reclaim_delay_s=DELAY,
    )
    for buyer in (ns.buyer, ns.buyer2):
        ns.token.functions.mint(buyer, FUND).transact({"from": ns.owner})
    return ns


@pytest.fixture
def env(evm):
    """The module chain, reverted to its state before the test afterwards."""
    snap = evm.tester.take_snapshot()
    yield evm
    evm.tester.revert_to_snapshot(snap)


def raises_revert(name: str):
    """pytest.raises for a contract custom error by name."""
    return pytest.raises(SettlementRevert, match=rf"^{name}\b")


def balance(env, who) -> int:
    return env.token.functions.balanceOf(who).call()


def assert_solvent(env, settlement=None, token=None) -> None:
    """What the contract owes (all escrow + all credits) equals the tokens it holds."""
    s = settlement or env.settlement
    t = token or env.token
    assert s.functions.totalOwed().call() == t.functions.balanceOf(s.address).call()


def settled_logs(env, receipt):
    return env.settlement.events.LeaseSettled().process_receipt(receipt, errors=DISCARD)


# --------------------------------------------------------------------------- split


@pytest.mark.parametrize(("cost", "fee", "provider"), [(333, 49, 284), (1, 0, 1), (0, 0, 0),
                                                       (1_000_000, 150_000, 850_000)])
def test_settle_credits_the_ledger_split(env, cost, fee, provider):
    assert split(cost, TAKE_RATE) == (cost, fee, provider)
    assert env.settlement.functions.splitOf(cost).call() == [fee, provider]
    chain.deposit(env.w3, env.settlement, env.buyer, 1000 + cost)
    [receipt] = chain.settle(env.w3, env.settlement, [LeaseCharge("L", env.buyer, env.provider,
                                                                  cost)], operator=env.operator)
    assert chain.credit_of(env.settlement, env.provider) == provider
    assert chain.credit_of(env.settlement, env.platform) == fee
    assert chain.escrow_of(env.settlement, env.buyer) == 1000
    [log] = settled_logs(env, receipt)
    assert log["args"]["leaseId"] == chain.lease_key("L")
    assert (log["args"]["cost"], log["args"]["providerAmount"], log["args"]["platformFee"]) == (
        cost, provider, fee)
    assert_solvent(env)


_rates: dict[int, object] = {}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cost=st.one_of(st.integers(0, 10**7), st.integers(0, 2**128), st.integers(0, 2**240)),
       rate=st.one_of(st.sampled_from([0, 1, 1500, 9999, 10_000]), st.integers(0, 10_000)))
def test_contract_split_equals_ledger_split(evm, cost, rate):
    """Property: for any amount and take rate, splitOf(cost) == settlement.split.split."""
    if rate not in _rates:
        _rates[rate] = chain.deploy_settlement(
            evm.w3, evm.token.address, platform=evm.platform, operator=evm.operator,
            sender=evm.owner, take_rate_bps=rate, reclaim_delay_s=DELAY)
    fee, provider = _rates[rate].functions.splitOf(cost).call()
    expected = split(cost, rate)
    assert (fee, provider) == (expected.platform_fee, expected.provider)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(costs=st.lists(st.integers(0, 5 * 10**9), min_size=1, max_size=8))
def test_settled_batch_credits_equal_ledger_splits(evm, costs):
    """Property: a settled batch credits each provider and the platform the sum of the
    ledger's splits, takes exactly the costs from escrow, and stays solvent."""
    snap = evm.tester.take_snapshot()
    try:
        total = sum(costs)
        chain.deposit(evm.w3, evm.settlement, evm.buyer, total + 7)
        providers = [evm.provider, evm.provider2]
        charges = [LeaseCharge(f"p{i}", evm.buyer, providers[i % 2], c)
                   for i, c in enumerate(costs)]
        receipts = chain.settle(evm.w3, evm.settlement, charges, operator=evm.operator)
        want = dict.fromkeys(providers, 0)
        fee_total = 0
        for ch in charges:
            s = split(ch.cost, TAKE_RATE)
            want[ch.provider] += s.provider
            fee_total += s.platform_fee
        for p in providers:
            assert chain.credit_of(evm.settlement, p) == want[p]
        assert chain.credit_of(evm.settlement, evm.platform) == fee_total
        assert chain.escrow_of(evm.settlement, evm.buyer) == 7
        events = [ev for r in receipts for ev in settled_logs(evm, r)]
        assert len(events) == len(costs)
        assert_solvent(evm)
    finally:
        evm.tester.revert_to_snapshot(snap)


# --------------------------------------------------------------------------- settle once, batch


def test_a_lease_settles_once(env):
    chain.deposit(env.w3, env.settlement, env.buyer, 10_000)
    charge = LeaseCharge("lease-1", env.buyer, env.provider, 1000)
    chain.settle(env.w3, env.settlement, [charge], operator=env.operator)
    assert chain.is_settled(env.settlement, "lease-1")

    # the contract refuses a second settlement of the same id, alone or in a batch
    key = chain.lease_key("lease-1")
    with raises_revert("AlreadySettled"):
        chain._transact(env.w3, env.settlement.functions.settle(
            key, env.buyer, env.provider, 1000), env.operator)
    with raises_revert("AlreadySettled"):
        chain._transact(env.w3, env.settlement.functions.settleBatch(
            [(chain.lease_key("new"), env.buyer, env.provider, 5),
             (key, env.buyer, env.provider, 1000)]), env.operator)
    assert not chain.is_settled(env.settlement, "new")  # all or nothing

    # a retried settlement run changes nothing the second time
    assert chain.settle(env.w3, env.settlement, [charge], operator=env.operator) == []
    assert chain.escrow_of(env.settlement, env.buyer) == 9000
    assert chain.credit_of(env.settlement, env.provider) == 850


def test_a_batch_with_a_repeated_lease_is_refused(env):
    chain.deposit(env.w3, env.settlement, env.buyer, 10_000)
    key = chain.lease_key("twice")
    with raises_revert("AlreadySettled"):
        chain._transact(env.w3, env.settlement.functions.settleBatch(
            [(key, env.buyer, env.provider, 5), (key, env.buyer, env.provider, 5)]),
            env.operator)
    with pytest.raises(ValueError, match="appears twice"):
        chain.settle(env.w3, env.settlement, [LeaseCharge("twice", env.buyer, env.provider, 5)]
                     * 2, operator=env.operator)
    assert chain.escrow_of(env.settlement, env.buyer) == 10_000


def test_batch_settles_many_leases_in_one_transaction(env):
    chain.deposit(env.w3, env.settlement, env.buyer, 5_000)
    chain.deposit(env.w3, env.settlement, env.buyer2, 5_000)
    charges = [
        LeaseCharge("a", env.buyer, env.provider, 333),
        LeaseCharge("b", env.buyer2, env.provider2, 1),
        LeaseCharge("c", env.buyer, env.provider2, 4000),
    ]
    [receipt] = chain.settle(env.w3, env.settlement, charges, operator=env.operator)
    logs = settled_logs(env, receipt)
    assert [log["args"]["leaseId"] for log in logs] == [chain.lease_key(c.lease_id)
                                                        for c in charges]
    assert chain.escrow_of(env.settlement, env.buyer) == 5_000 - 333 - 4000
    assert chain.escrow_of(env.settlement, env.buyer2) == 4_999
    assert chain.credit_of(env.settlement, env.provider) == 284
    assert chain.credit_of(env.settlement, env.provider2) == 1 + 3400
    assert chain.credit_of(env.settlement, env.platform) == 49 + 0 + 600
    assert_solvent(env)


def test_batch_is_all_or_nothing(env):
    chain.deposit(env.w3, env.settlement, env.buyer, 1_000)
    charges = [LeaseCharge("ok", env.buyer, env.provider, 600),
               LeaseCharge("too-much", env.buyer, env.provider, 600)]
    with raises_revert("InsufficientEscrow") as exc:
        chain.settle(env.w3, env.settlement, charges, operator=env.operator)
    assert exc.value.args_[1:] == (400, 600)
    assert not chain.is_settled(env.settlement, "ok")
    assert chain.escrow_of(env.settlement, env.buyer) == 1_000
    assert chain.credit_of(env.settlement, env.provider) == 0


def test_settle_splits_into_transactions_of_batch_size(env):
    chain.deposit(env.w3, env.settlement, env.buyer, 10**6)
    charges = [LeaseCharge(f"l{i}", env.buyer, env.provider, 100 + i) for i in range(5)]
    receipts = chain.settle(env.w3, env.settlement, charges, operator=env.operator,
                            batch_size=2)
    assert len(receipts) == 3
    assert sum(len(settled_logs(env, r)) for r in receipts) == 5


def test_settle_refuses_bad_input(env):
    with raises_revert("EmptyBatch"):
        chain._transact(env.w3, env.settlement.functions.settleBatch([]), env.operator)
    with raises_revert("ZeroAddress"):
        chain._transact(env.w3, env.settlement.functions.settle(
            chain.lease_key("z"), env.buyer, "0x" + "00" * 20, 0), env.operator)
    with pytest.raises(ValueError, match="out of range"):
        chain.settle(env.w3, env.settlement, [LeaseCharge("neg", env.buyer, env.provider, -1)],
                     operator=env.operator)
    with pytest.raises(TypeError, match="integer micro-USD"):
        chain.deposit(env.w3, env.settlement, env.buyer, 1.5)


# --------------------------------------------------------------------------- access


def test_only_the_operator_settles_and_refunds(env):
    chain.deposit(env.w3, env.settlement, env.buyer, 1_000)
    for who in (env.owner, env.buyer, env.provider, env.platform, env.stranger):
        with raises_revert("NotOperator"):
            chain.settle(env.w3, env.settlement, [LeaseCharge("x", env.buyer, env.provider, 10)],
                         operator=who)
        with raises_revert("NotOperator"):
            chain.refund(env.w3, env.settlement, env.buyer, 10, operator=who)
    assert chain.escrow_of(env.settlement, env.buyer) == 1_000


def test_owner_replaces_the_operator(env):
    chain.deposit(env.w3, env.settlement, env.buyer, 1_000)
    with raises_revert("OwnableUnauthorizedAccount"):
        chain._transact(env.w3, env.settlement.functions.setOperator(env.stranger),
                        env.operator)
    r = chain._transact(env.w3, env.settlement.functions.setOperator(env.stranger), env.owner)
    [log] = env.settlement.events.OperatorChanged().process_receipt(r, errors=DISCARD)
    assert (log["args"]["previousOperator"], log["args"]["newOperator"]) == (env.operator,
                                                                           env.stranger)
    with raises_revert("NotOperator"):
        chain.settle(env.w3, env.settlement, [LeaseCharge("x", env.buyer, env.provider, 10)],
                     operator=env.operator)
    chain.settle(env.w3, env.settlement, [LeaseCharge("x", env.buyer, env.provider, 10)],
                 operator=env.stranger)
    assert chain.is_settled(env.settlement, "x")


# --------------------------------------------------------------------------- deposit, refund


def test_deposit_and_deposit_for(env):
    r = chain.deposit(env.w3, env.settlement, env.buyer, 2_500_000)
    [log] = env.settlement.events.Deposited().process_receipt(r, errors=DISCARD)
    assert log["args"]["amount"] == 2_500_000 and log["args"]["escrowAfter"] == 2_500_000
    chain._transact(env.w3, env.token.functions.approve(env.settlement.address, 5), env.buyer2)
    chain._transact(env.w3, env.settlement.functions.depositFor(env.buyer, 5), env.buyer2)
    assert chain.escrow_of(env.settlement, env.buyer) == 2_500_005
    assert chain.escrow_of(env.settlement, env.buyer2) == 0
    assert balance(env, env.buyer2) == FUND - 5
    with raises_revert("ZeroAmount"):
        chain._transact(env.w3, env.settlement.functions.deposit(0), env.buyer)
    assert_solvent(env)


def test_operator_refunds_unused_escrow(env):
    chain.deposit(env.w3, env.settlement, env.buyer, 1_000)
    r = chain.refund(env.w3, env.settlement, env.buyer, 400, operator=env.operator)
    [log] = env.settlement.events.Refunded().process_receipt(r, errors=DISCARD)
    assert (log["args"]["amount"], log["args"]["escrowAfter"]) == (400, 600)
    assert balance(env, env.buyer) == FUND - 600
    with raises_revert("InsufficientEscrow"):
        chain.refund(env.w3, env.settlement, env.buyer, 601, operator=env.operator)
    assert_solvent(env)


# --------------------------------------------------------------------------- withdraw


def test_provider_and_platform_withdraw_their_credit(env):
    chain.deposit(env.w3, env.settlement, env.buyer, 10_000)
    chain.settle(env.w3, env.settlement, [LeaseCharge("w1", env.buyer, env.provider, 333),
                                          LeaseCharge("w2", env.buyer, env.provider, 1000)],
                 operator=env.operator)
    r = chain.withdraw(env.w3, env.settlement, env.provider)
    [log] = env.settlement.events.Withdrawn().process_receipt(r, errors=DISCARD)
    assert log["args"]["payee"] == env.provider and log["args"]["amount"] == 284 + 850
    assert balance(env, env.provider) == 1134
    assert chain.credit_of(env.settlement, env.provider) == 0
    with raises_revert("NothingToWithdraw"):
        chain.withdraw(env.w3, env.settlement, env.provider)

    chain.withdraw(env.w3, env.settlement, env.platform, to=env.stranger)
    assert balance(env, env.stranger) == 49 + 150
    assert balance(env, env.platform) == 0
    assert chain.credit_of(env.settlement, env.platform) == 0
    # a buyer has no credit: escrow is not withdrawable except by reclaim
    with raises_revert("NothingToWithdraw"):
        chain.withdraw(env.w3, env.settlement, env.buyer)
    assert chain.escrow_of(env.settlement, env.buyer) == 10_000 - 1333
    assert_solvent(env)


# --------------------------------------------------------------------------- reclaim


def _advance(env, seconds: int) -> None:
    now = env.w3.eth.get_block("latest")["timestamp"]
    env.tester.time_travel(now + seconds)


def test_buyer_reclaims_unused_escrow_after_the_delay(env):
    chain.deposit(env.w3, env.settlement, env.buyer, 7_000)
    chain.settle(env.w3, env.settlement, [LeaseCharge("r1", env.buyer, env.provider, 1_000)],
                 operator=env.operator)
    with raises_revert("NoReclaimRequested"):
        chain.reclaim(env.w3, env.settlement, env.buyer)
    r = chain.request_reclaim(env.w3, env.settlement, env.buyer)
    [log] = env.settlement.events.ReclaimRequested().process_receipt(r, errors=DISCARD)
    requested_at = env.w3.eth.get_block(r["blockNumber"])["timestamp"]
    assert log["args"]["escrow"] == 6_000
    assert log["args"]["availableAt"] == requested_at + DELAY

    _advance(env, DELAY - 10)
    with raises_revert("ReclaimNotYetAvailable"):
        chain.reclaim(env.w3, env.settlement, env.buyer)
    _advance(env, 20)
    r = chain.reclaim(env.w3, env.settlement, env.buyer)
    [log] = env.settlement.events.Reclaimed().process_receipt(r, errors=DISCARD)
    assert log["args"]["amount"] == 6_000
    assert balance(env, env.buyer) == FUND - 1_000
    assert chain.escrow_of(env.settlement, env.buyer) == 0
    # the provider's earned credit is untouched by the buyer leaving
    assert chain.credit_of(env.settlement, env.provider) == 850
    with raises_revert("NoReclaimRequested"):
        chain.reclaim(env.w3, env.settlement, env.buyer)
    assert_solvent(env)


def test_a_settlement_cancels_a_pending_reclaim(env):
    chain.deposit(env.w3, env.settlement, env.buyer, 7_000)
    chain.request_reclaim(env.w3, env.settlement, env.buyer)
    _advance(env, DELAY // 2)
    [r] = chain.settle(env.w3, env.settlement, [LeaseCharge("run", env.buyer, env.provider,
                                                            500)], operator=env.operator)
    [log] = env.settlement.events.ReclaimCancelled().process_receipt(r, errors=DISCARD)
    assert log["args"]["buyer"] == env.buyer and log["args"]["leaseId"] == chain.lease_key("run")
    _advance(env, DELAY)
    with raises_revert("NoReclaimRequested"):
        chain.reclaim(env.w3, env.settlement, env.buyer)
    # the operator then disappears: a new request ages and the buyer gets the rest back
    chain.request_reclaim(env.w3, env.settlement, env.buyer)
    _advance(env, DELAY)
    chain.reclaim(env.w3, env.settlement, env.buyer)
    assert balance(env, env.buyer) == FUND - 500
    assert_solvent(env)


def test_settling_another_buyer_does_not_cancel_a_reclaim(env):
    chain.deposit(env.w3, env.settlement, env.buyer, 100)
    chain.deposit(env.w3, env.settlement, env.buyer2, 100)
    chain.request_reclaim(env.w3, env.settlement, env.buyer)
    chain.settle(env.w3, env.settlement, [LeaseCharge("o", env.buyer2, env.provider, 50)],
                 operator=env.operator)
    _advance(env, DELAY)
    chain.reclaim(env.w3, env.settlement, env.buyer)
    assert balance(env, env.buyer) == FUND


def test_reclaim_with_empty_escrow_is_refused(env):
    chain.request_reclaim(env.w3, env.settlement, env.buyer)
    _advance(env, DELAY)
    with raises_revert("NothingToWithdraw"):
        chain.reclaim(env.w3, env.settlement, env.buyer)


# --------------------------------------------------------------------------- deployment rules


def test_take_rate_above_10000_bps_is_refused_at_deployment(evm):
    with raises_revert("TakeRateTooHigh") as exc:
        chain.deploy_settlement(evm.w3, evm.token.address, platform=evm.platform,
                                operator=evm.operator, sender=evm.owner, take_rate_bps=10_001)
    assert exc.value.args_ == (10_001,)
    s = chain.deploy_settlement(evm.w3, evm.token.address, platform=evm.platform,
                                operator=evm.operator, sender=evm.owner, take_rate_bps=10_000)
    assert s.functions.takeRateBps().call() == 10_000
    assert s.functions.splitOf(333).call() == [333, 0]


def test_deployment_refuses_bad_parameters(evm):
    kw = {"platform": evm.platform, "operator": evm.operator, "sender": evm.owner}
    e18 = chain.deploy(evm.w3, "Mock18", sender=evm.owner)
    with raises_revert("WrongTokenDecimals"):
        chain.deploy_settlement(evm.w3, e18.address, **kw)
    with raises_revert("ReclaimDelayOutOfRange"):
        chain.deploy_settlement(evm.w3, evm.token.address, reclaim_delay_s=59 * 60, **kw)
    with raises_revert("ReclaimDelayOutOfRange"):
        chain.deploy_settlement(evm.w3, evm.token.address, reclaim_delay_s=366 * 86400, **kw)
    with raises_revert("ZeroAddress"):
        chain.deploy_settlement(evm.w3, evm.token.address, platform="0x" + "00" * 20,
                                operator=evm.operator, sender=evm.owner)
    s = chain.deploy_settlement(evm.w3, evm.token.address, **kw)
    assert s.functions.token().call() == evm.token.address
    assert s.functions.takeRateBps().call() == chain.DEFAULT_TAKE_RATE_BPS
    assert s.functions.reclaimDelay().call() == chain.DEFAULT_RECLAIM_DELAY_S
    assert s.functions.operator().call() == evm.operator
    assert s.functions.owner().call() == evm.owner


# --------------------------------------------------------------------------- hostile tokens


def test_fee_on_transfer_token_is_refused(evm):
    fot = chain.deploy(evm.w3, "FeeOnTransferUSD", 100, sender=evm.owner)  # 1 % burned
    s = chain.deploy_settlement(evm.w3, fot.address, platform=evm.platform,
                                operator=evm.operator, sender=evm.owner)
    fot.functions.mint(evm.buyer, 10**9).transact({"from": evm.owner})
    with raises_revert("FeeOnTransferRefused") as exc:
        chain.deposit(evm.w3, s, evm.buyer, 1_000, token=fot)
    assert exc.value.args_ == (1_000, 990)
    assert chain.escrow_of(s, evm.buyer) == 0
    assert fot.functions.balanceOf(evm.buyer).call() == 10**9
    assert fot.functions.balanceOf(s.address).call() == 0


def _selector(signature: str) -> bytes:
    return function_signature_to_4byte_selector(signature)


@pytest.fixture
def hostile(env):
    """A Settlement over ReentrantUSD, with the token itself as a provider holding credit."""
    tok = chain.deploy(env.w3, "ReentrantUSD", sender=env.owner)
    s = chain.deploy_settlement(env.w3, tok.address, platform=env.platform,
                                operator=env.operator, sender=env.owner, reclaim_delay_s=DELAY)
    tok.functions.mint(env.buyer, 10**9).transact({"from": env.owner})
    chain.deposit(env.w3, s, env.buyer, 10_000, token=tok)
    chain.settle(env.w3, s, [LeaseCharge("h", env.buyer, tok.address, 1_000)],
                 operator=env.operator)
    assert chain.credit_of(s, tok.address) == 850
    return SimpleNamespace(token=tok, settlement=s)


def test_reentrant_withdraw_is_refused_and_pays_once(env, hostile):
    tok, s = hostile.token, hostile.settlement
    withdraw = _selector("withdraw()")
    tok.functions.arm(s.address, withdraw, False).transact({"from": env.stranger})
    # the token (a payee) withdraws; during the transfer out it calls withdraw() again
    chain._transact(env.w3, tok.functions.call(s.address, withdraw), env.stranger)
    assert tok.functions.reentryAttempted().call()
    assert not tok.functions.reentrySucceeded().call()
    assert tok.functions.reentryReturnData().call() == _selector("ReentrancyGuardReentrantCall()")
    assert tok.functions.balanceOf(tok.address).call() == 850  # paid exactly once
    assert chain.credit_of(s, tok.address) == 0
    assert_solvent(env, s, tok)


def test_reentrant_withdraw_that_bubbles_reverts_everything(env, hostile):
    tok, s = hostile.token, hostile.settlement
    withdraw = _selector("withdraw()")
    tok.functions.arm(s.address, withdraw, True).transact({"from": env.stranger})
    with raises_revert("ReentrancyGuardReentrantCall"):
        chain._transact(env.w3, tok.functions.call(s.address, withdraw), env.stranger)
    assert chain.credit_of(s, tok.address) == 850
    assert tok.functions.balanceOf(tok.address).call() == 0
    assert_solvent(env, s, tok)


@pytest.mark.parametrize("signature", ["deposit(uint256)", "reclaim()", "withdraw()",
                                       "requestReclaim()"])
def test_reentry_during_a_deposit_is_refused(env, hostile, signature):
    tok, s = hostile.token, hostile.settlement
    payload = _selector(signature) + (b"\x00" * 31 + b"\x01" if "uint256" in signature else b"")
    tok.functions.arm(s.address, payload, False).transact({"from": env.stranger})
    chain.deposit(env.w3, s, env.buyer, 500, token=tok)
    assert tok.functions.reentryAttempted().call()
    assert not tok.functions.reentrySucceeded().call()
    assert tok.functions.reentryReturnData().call() == _selector("ReentrancyGuardReentrantCall()")
    assert chain.escrow_of(s, env.buyer) == 10_000 - 1_000 + 500
    assert chain.credit_of(s, tok.address) == 850
    assert_solvent(env, s, tok)


# --------------------------------------------------------------------------- reconcile on chain


def test_reconcile_agrees_after_settlement_and_finds_every_disagreement(env):
    chain.deposit(env.w3, env.settlement, env.buyer, 10**7)
    costs = {"lease-a": 333, "lease-b": 1, "lease-c": 2_490_000}
    chain.settle(env.w3, env.settlement,
                 [LeaseCharge(k, env.buyer, env.provider, c) for k, c in costs.items()],
                 operator=env.operator)
    events = chain.settled_events(env.settlement)
    ledger = [LedgerSettlement(k, c, split(c, TAKE_RATE).platform_fee,
                               split(c, TAKE_RATE).provider, env.buyer, env.provider)
              for k, c in costs.items()]
    assert chain.reconcile(ledger, events) == []

    # a lease the ledger settled that the chain did not, and one the other way round
    extra = LedgerSettlement("lease-d", 10, 1, 9)
    mismatches = chain.reconcile([*ledger[1:], extra], events)
    assert [(m.kind, m.lease_id) for m in mismatches] == [
        ("missing_on_chain", chain.lease_key("lease-d")),
        ("not_in_ledger", chain.lease_key("lease-a")),
    ]
    # different amounts
    wrong = ledger[0]._replace(platform_fee=50, provider_amount=283)
    [m] = chain.reconcile([wrong, *ledger[1:]], events)
    assert m.kind == "amount" and "49" in m.detail


# --------------------------------------------------------------------------- gas


def test_gas_per_settlement(env, record_property):
    """Measures gas of one settle and of batches; bounds catch a regression."""
    chain.deposit(env.w3, env.settlement, env.buyer, 10**9)
    [single] = chain.settle(env.w3, env.settlement, [LeaseCharge("g0", env.buyer, env.provider,
                                                                 1_000_000)],
                            operator=env.operator)
    record_property("gas_settle_single", single["gasUsed"])
    assert single["gasUsed"] < 120_000
    for n in (10, 50):
        [batch] = chain.settle(
            env.w3, env.settlement,
            [LeaseCharge(f"g{n}-{i}", env.buyer, env.provider, 1_000_000 + i) for i in range(n)],
            operator=env.operator, batch_size=n)
        per_lease = batch["gasUsed"] // n
        record_property(f"gas_settle_batch_{n}", batch["gasUsed"])
        record_property(f"gas_settle_batch_{n}_per_lease", per_lease)
        assert per_lease < 45_000
