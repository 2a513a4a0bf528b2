"""Integration over real JSON-RPC: a Hardhat 2 node the test starts on 127.0.0.1.

deploy → deposit → batch settle → withdraw → reclaim after the delay → reconcile, all
through settlement.chain and web3's HTTPProvider, exactly as against a production node.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest
from web3 import HTTPProvider, Web3

from settlement import chain
from settlement.chain import LeaseCharge, LedgerSettlement, SettlementRevert
from settlement.split import split
from tests.conftest import ROOT, require_or_skip

CONTRACTS = ROOT / "contracts"
DELAY = 3600


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def hardhat_w3():
    node = shutil.which("node")
    if node is None:
        require_or_skip("node is not installed: cannot start a Hardhat node")
    cli = CONTRACTS / "node_modules" / "hardhat" / "internal" / "cli" / "cli.js"
    if not cli.exists():
        require_or_skip("contracts/node_modules missing: run `npm ci --prefix contracts`")
    port = _free_port()
    env = {**os.environ, "HARDHAT_DISABLE_TELEMETRY_PROMPT": "true", "CI": "true"}
    proc = subprocess.Popen(
        [node, str(cli), "node", "--hostname", "127.0.0.1", "--port", str(port)],
        cwd=CONTRACTS, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        w3 = Web3(HTTPProvider(f"http://127.0.0.1:{port}", request_kwargs={"timeout": 30}))
        deadline = time.monotonic() + 60
        while not w3.is_connected():
            if proc.poll() is not None:
                out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
                pytest.fail(f"hardhat node exited with {proc.returncode}:\n{out[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("hardhat node did not answer within 60 s")
            time.sleep(0.25)
        assert w3.eth.chain_id == 31337
        yield w3
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()


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
