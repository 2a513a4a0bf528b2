"""settlement.chain's pure parts: lease keys and reconcile (no chain needed)."""

from __future__ import annotations

import pytest

from settlement import chain
from settlement.chain import LedgerSettlement, SettledEvent
from settlement.split import split

BUYER = "0x" + "11" * 20
PROVIDER = "0x" + "22" * 20


def event(lease_id, cost, rate=1500, **kw) -> SettledEvent:
    s = split(cost, rate)
    fields = {"lease_id": chain.lease_key(lease_id), "buyer": BUYER, "provider": PROVIDER,
              "cost": cost, "provider_amount": s.provider, "platform_fee": s.platform_fee}
    fields.update(kw)
    return SettledEvent(**fields)


def row(lease_id, cost, rate=1500, **kw) -> LedgerSettlement:
    s = split(cost, rate)
    fields = {"lease_id": lease_id, "cost": cost, "platform_fee": s.platform_fee,
              "provider_amount": s.provider}
    fields.update(kw)
    return LedgerSettlement(**fields)


def test_lease_key_is_stable_and_distinct():
    assert chain.lease_key("42") == chain.lease_key(42)
    assert chain.lease_key(42) != chain.lease_key(43)
    assert chain.lease_key(42, part=0) != chain.lease_key(42)
    assert chain.lease_key(42, part=1) != chain.lease_key(42, part=2)
    raw = bytes(range(32))
    assert chain.lease_key(raw) == raw
    assert len(chain.lease_key("uuid-like-id")) == 32


def test_agreement_is_no_mismatch():
    ledger = [row("a", 333), row("b", 1), row("c", 0)]
    events = [event("a", 333), event("b", 1), event("c", 0)]
    assert chain.reconcile(ledger, events) == []
    # mappings work as ledger rows too; addresses compare case-insensitively
    as_dicts = [r._asdict() | {"buyer": BUYER.upper().replace("0X", "0x")} for r in ledger]
    assert chain.reconcile(as_dicts, events) == []


def test_every_kind_of_disagreement_is_reported():
    ledger = [row("missing", 100), row("amount", 333, platform_fee=50, provider_amount=283),
              row("party", 10, provider="0x" + "33" * 20), row("dup", 5), row("dup", 5),
              row("badsplit", 10, platform_fee=1, provider_amount=8)]
    events = [event("amount", 333), event("party", 10), event("dup", 5), event("badsplit", 10),
              event("orphan", 7), event("orphan", 7),
              event("evsplit", 10, platform_fee=2)]
    kinds = [(m.kind, m.lease_id) for m in chain.reconcile(ledger, events)]
    k = chain.lease_key
    assert kinds == [
        ("duplicate_event", k("orphan")),
        ("split", k("evsplit")),
        ("missing_on_chain", k("missing")),
        ("amount", k("amount")),
        ("party", k("party")),
        ("duplicate_ledger", k("dup")),
        ("split", k("badsplit")),
        ("amount", k("badsplit")),
        ("not_in_ledger", k("orphan")),
        ("not_in_ledger", k("evsplit")),
    ]


@pytest.mark.parametrize("amount", [-1, 2**256])
def test_amounts_out_of_range_are_refused(amount):
    with pytest.raises(ValueError, match="out of range"):
        chain._check_amount(amount)


def test_missing_artifact_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(chain, "ARTIFACTS_DIR", tmp_path)
    chain.load_artifact.cache_clear()
    try:
        with pytest.raises(chain.ChainError, match="npm run build"):
            chain.load_artifact("Settlement")
    finally:
        chain.load_artifact.cache_clear()
