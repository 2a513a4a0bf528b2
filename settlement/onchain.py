"""The ledger mirrored on chain (optional; off unless GPUMARKET_CHAIN_RPC_URL is set).

- Deposits: a buyer escrows the 6-decimal stablecoin in Settlement.sol from its
  registered address; `sync_deposits` credits the buyer's wallet once per `Deposited`
  event (unique tx hash + log index; the journal entry's idempotency key too).
- Settlements: every ledger entry that charged a lease (`lease_settle`, and
  `lease_meter` for each metering period) whose buyer and provider have chain addresses
  is settled on chain by `mirror_settlements`, many per transaction, under the id
  `chain.lease_key(<lease id>, part=<period>)`. The contract computes the same integer
  split (take rate fixed at deployment = GPUMARKET_TAKE_RATE_BPS), so the amounts are
  equal by construction, and `reconcile` proves it from the events.
- Exactly once: the contract refuses a lease id twice and `chain.settle` skips ids
  already settled; a run that crashed after its transaction and before recording finds
  them settled and records them (tx hash unknown). Nothing here holds a database lock
  while it talks to the chain node.
Units: micro-USD = token base units.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction
from web3 import Web3

from settlement import chain
from settlement.models import (
    Account,
    ChainAddress,
    ChainDeposit,
    ChainSettlement,
    JournalEntry,
)
from settlement.services import account, post_entry, wallet_credit_postings

log = logging.getLogger("gpumarket.chain")

SETTLING_KINDS = (JournalEntry.Kind.LEASE_SETTLE, JournalEntry.Kind.LEASE_METER)


@dataclass(frozen=True)
class ChainConfig:
    w3: Web3
    settlement: object  # web3 Contract
    operator: str


def from_settings() -> ChainConfig | None:
    """The configured chain, or None when on-chain settlement is off."""
    if not settings.GPUMARKET_CHAIN_RPC_URL:
        return None
    w3 = Web3(Web3.HTTPProvider(settings.GPUMARKET_CHAIN_RPC_URL,
                                request_kwargs={"timeout": 30}))
    contract = chain.contract_at(w3, "Settlement", settings.GPUMARKET_CHAIN_SETTLEMENT_ADDRESS)
    return ChainConfig(w3=w3, settlement=contract, operator=settings.GPUMARKET_CHAIN_OPERATOR)


def address_register(*, user_id: int, address: str) -> ChainAddress:
    """Set the user's chain address (checksummed). Raises ValueError for a malformed one
    or one registered to somebody else."""
    if not Web3.is_address(address):
        raise ValueError("is not an Ethereum address (0x followed by 40 hex digits)")
    address = Web3.to_checksum_address(address)
    if ChainAddress.objects.filter(address=address).exclude(user_id=user_id).exists():
        raise ValueError("is registered to another user")
    row, _ = ChainAddress.objects.update_or_create(user_id=user_id,
                                                   defaults={"address": address})
    return row


def sync_deposits(cfg: ChainConfig, *, from_block: int = 0) -> int:
    """Credit every new `Deposited` event from a registered address; returns how many.
    Deposits from unknown addresses are left alone (logged) until the address is
    registered, then credited by a later run."""
    users = {a.lower(): u for a, u in ChainAddress.objects.values_list("address", "user_id")}
    credited = 0
    for ev in cfg.settlement.events.Deposited().get_logs(from_block=from_block):
        buyer = users.get(ev["args"]["buyer"].lower())
        tx, index = Web3.to_hex(ev["transactionHash"]), ev["logIndex"]
        if buyer is None:
            log.warning("deposit %s:%s from unregistered %s left uncredited", tx, index,
                        ev["args"]["buyer"])
            continue
        amount = int(ev["args"]["amount"])
        try:
            with transaction.atomic():
                ChainDeposit.objects.create(tx_hash=tx, log_index=index, buyer_id=buyer,
                                            amount=amount, block_number=ev["blockNumber"])
                post_entry(kind=JournalEntry.Kind.CHAIN_DEPOSIT,
                           postings=wallet_credit_postings(
                               user_id=buyer, amount=amount,
                               source=account(Account.Kind.EXTERNAL_CHAIN)),
                           memo=f"escrow deposit {tx}", reference=f"user:{buyer}",
                           idempotency_key=f"chain-deposit:{tx}:{index}")
        except IntegrityError:
            continue  # credited by an earlier run
        credited += 1
    return credited


@dataclass(frozen=True)
class _Row:
    entry: JournalEntry
    key: bytes
    buyer: str
    provider: str
    cost: int
    provider_amount: int
    platform_fee: int


def _lease_key(entry: JournalEntry) -> bytes:
    lease_id = entry.reference.removeprefix("lease:")
    if entry.kind == JournalEntry.Kind.LEASE_METER:  # meter:lease:<id>:<period>
        return chain.lease_key(lease_id, part=int(entry.idempotency_key.rsplit(":", 1)[1]))
    return chain.lease_key(lease_id)


def _rows(entries) -> list[_Row]:
    addresses = dict(ChainAddress.objects.values_list("user_id", "address"))
    rows = []
    for entry in entries:
        by_kind = {p.account.kind: p for p in entry.postings.all()}
        provider = by_kind.get(Account.Kind.PROVIDER_EARNED)
        fee = by_kind.get(Account.Kind.PLATFORM_REVENUE)
        provider_amount = provider.amount if provider else 0
        platform_fee = fee.amount if fee else 0
        buyer_id = entry.hold.buyer_id if entry.hold_id else None
        provider_id = provider.account.owner_id if provider else None
        if provider_amount + platform_fee == 0 or buyer_id not in addresses \
                or provider_id not in addresses:
            continue  # nothing charged, or a party without a chain address
        rows.append(_Row(entry, _lease_key(entry), addresses[buyer_id], addresses[provider_id],
                         provider_amount + platform_fee, provider_amount, platform_fee))
    return rows


def _pending() -> list[_Row]:
    entries = (JournalEntry.objects.filter(kind__in=SETTLING_KINDS, chain_settlement=None)
               .select_related("hold").prefetch_related("postings__account").order_by("pk"))
    return _rows(entries)


def _record(row: _Row, tx_hash: str) -> None:
    with contextlib.suppress(IntegrityError), transaction.atomic():  # a concurrent run won
        ChainSettlement.objects.create(
            entry=row.entry, lease_key=Web3.to_hex(row.key), cost=row.cost,
            provider_amount=row.provider_amount, platform_fee=row.platform_fee, tx_hash=tx_hash)


def mirror_settlements(cfg: ChainConfig, *, batch_size: int = chain.DEFAULT_BATCH_SIZE
                       ) -> tuple[int, list[str]]:
    """Settle on chain every ledger charge not yet mirrored. Returns (settled now,
    problems): a charge the contract refuses (e.g. not enough escrow) is left out, named
    in `problems`, and shows up in `reconcile` as missing on chain."""
    rows = _pending()
    problems: list[str] = []
    todo = []
    for row in rows:
        if cfg.settlement.functions.settled(row.key).call():
            _record(row, "")  # settled by a run that crashed before recording it
        else:
            todo.append(row)
    settled = 0
    for i in range(0, len(todo), batch_size):
        chunk = todo[i:i + batch_size]
        charges = [chain.LeaseCharge(r.key, r.buyer, r.provider, r.cost) for r in chunk]
        try:
            receipts = chain.settle(cfg.w3, cfg.settlement, charges, operator=cfg.operator,
                                    batch_size=batch_size)
            tx = Web3.to_hex(receipts[0]["transactionHash"]) if receipts else ""
            for row in chunk:
                _record(row, tx)
            settled += len(chunk)
        except chain.ChainError:
            for row, charge in zip(chunk, charges, strict=True):  # find the refused ones
                try:
                    receipts = chain.settle(cfg.w3, cfg.settlement, [charge],
                                            operator=cfg.operator)
                except chain.ChainError as exc:
                    problems.append(f"{row.entry.reference} (entry {row.entry.pk}): {exc}")
                    continue
                _record(row, Web3.to_hex(receipts[0]["transactionHash"]) if receipts else "")
                settled += 1
    if settled or problems:
        log.info("chain: %s settlements mirrored, %s refused", settled, len(problems))
    return settled, problems


def reconcile(cfg: ChainConfig) -> list[chain.Mismatch]:
    """Ledger vs chain: every mirrored-eligible ledger charge has its `LeaseSettled` event
    with equal amounts and parties, and no event lacks its ledger charge."""
    entries = (JournalEntry.objects.filter(kind__in=SETTLING_KINDS)
               .select_related("hold").prefetch_related("postings__account").order_by("pk"))
    ledger = [chain.LedgerSettlement(r.key, r.cost, r.platform_fee, r.provider_amount,
                                     r.buyer, r.provider) for r in _rows(entries)]
    return chain.reconcile(ledger, chain.settled_events(cfg.settlement))
