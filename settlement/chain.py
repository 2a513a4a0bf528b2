"""On-chain settlement client (optional; off by default): web3.py over any EVM JSON-RPC.

Plain functions that take a `Web3` instance, contract objects or addresses, and integer
amounts. No Django. The contract is `contracts/Settlement.sol`; its ABI and bytecode are
the committed artifacts in `contracts/build/` (rebuild with `npm run build` there).

Units: every amount is an integer in **micro-USD**, which is exactly the base unit of the
6-decimal USD stablecoin the contract escrows (DESIGN.md, "Units"): 1 USD = 1,000,000
micro-USD = 1,000,000 token units. Nothing here converts, rounds or uses floats.

The split: the contract computes `platform_fee = cost × take_rate_bps // 10000`,
`provider = cost − platform_fee` — the same integers as `settlement.split.split`.

Sending: functions send transactions `from` the given address with `eth_sendTransaction`
(the in-process test chain and a Hardhat node hold unlocked accounts). Against a remote
node, add web3's `SignAndSendRawMiddlewareBuilder` with the operator's key to the `Web3`
instance; nothing else changes.

Exactly once: a lease id settles once on chain (the contract refuses a second time), and
`settle` skips ids that are already settled before it sends, so a retried task changes
nothing the second time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

from eth_abi import decode as abi_decode
from eth_utils import function_abi_to_4byte_selector, keccak, to_checksum_address
from web3 import Web3
from web3.contract import Contract
from web3.exceptions import ContractCustomError, ContractLogicError

ARTIFACTS_DIR = Path(__file__).resolve().parent.parent / "contracts" / "build"
DEFAULT_TAKE_RATE_BPS = 1500
DEFAULT_RECLAIM_DELAY_S = 7 * 24 * 3600
DEFAULT_BATCH_SIZE = 100
UINT256_MAX = 2**256 - 1


# --------------------------------------------------------------------------- errors


class ChainError(RuntimeError):
    """A chain operation failed (transaction reverted, bad input, missing artifact)."""


class SettlementRevert(ChainError):
    """The contract refused a call with one of its custom errors.

    `name` is the Solidity error name (e.g. "AlreadySettled"), `args` its decoded arguments.
    """

    def __init__(self, name: str, args: tuple[Any, ...], raw: str | None = None):
        self.name = name
        self.args_ = args
        self.raw = raw
        super().__init__(f"{name}{args!r}" if args else name)


# --------------------------------------------------------------------------- artifacts


@cache
def load_artifact(name: str) -> dict[str, Any]:
    """The committed artifact `contracts/build/<name>.json` (abi, bytecode, compiler)."""
    path = ARTIFACTS_DIR / f"{name}.json"
    if not path.exists():
        raise ChainError(f"missing contract artifact {path}; run `npm run build` in contracts/")
    return json.loads(path.read_text())


def contract_at(w3: Web3, name: str, address: str) -> Contract:
    """The contract `name` (an artifact name) at `address`."""
    return w3.eth.contract(address=to_checksum_address(address), abi=load_artifact(name)["abi"])


@cache
def _error_selectors(name: str) -> dict[bytes, dict[str, Any]]:
    errors = [item for item in load_artifact(name)["abi"] if item["type"] == "error"]
    return {function_abi_to_4byte_selector(item): item for item in errors}


def decode_revert(data: Any, artifact: str = "Settlement") -> tuple[str, tuple[Any, ...]] | None:
    """Decode revert data (hex string) into (error name, args) using the artifact's ABI
    (also OpenZeppelin's errors, which are in the ABI); None if it is not one of them."""
    if isinstance(data, dict):
        data = data.get("data")
    if not isinstance(data, str | bytes) or len(data) < 4:
        return None
    raw = bytes.fromhex(data[2:] if data.startswith("0x") else data) if isinstance(data, str) \
        else data
    item = _error_selectors(artifact).get(raw[:4])
    if item is None:
        return None
    types = [inp["type"] for inp in item["inputs"]]
    return item["name"], tuple(abi_decode(types, raw[4:]))


def _revert_bytes(exc: BaseException) -> bytes | None:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for arg in e.args:
            if isinstance(arg, bytes):
                return arg
        e = e.__cause__ or e.__context__
    return None


def _raise_revert(data: Any, message: str | None, exc: BaseException) -> NoReturn:
    for artifact in ("Settlement", "ReentrantUSD"):
        decoded = decode_revert(data, artifact)
        if decoded is not None:
            raw = data.hex() if isinstance(data, bytes) else str(data)
            raise SettlementRevert(decoded[0], decoded[1], raw=raw) from exc
    raise ChainError(f"transaction reverted: {message or data}") from exc


def _transact(w3: Web3, fn: Any, sender: str, gas: int | None = None) -> Any:
    """Send `fn` from `sender`, wait for the receipt, raise on revert; returns the receipt."""
    tx: dict[str, Any] = {"from": to_checksum_address(sender)}
    if gas is not None:
        tx["gas"] = gas
    try:
        tx_hash = fn.transact(tx)
    except (ContractCustomError, ContractLogicError) as exc:  # a JSON-RPC node
        _raise_revert(exc.data, exc.message, exc)
    except Exception as exc:
        # the in-process test chain (eth-tester) raises TransactionFailed carrying the raw
        # revert bytes on the exception it wraps
        if type(exc).__name__ != "TransactionFailed":
            raise
        _raise_revert(_revert_bytes(exc), str(exc), exc)
    receipt = w3.eth.wait_for_transaction_receipt(tx_hash)
    if receipt["status"] != 1:
        raise ChainError(f"transaction {tx_hash.hex()} reverted (status 0)")
    return receipt


# --------------------------------------------------------------------------- deploy


def deploy(w3: Web3, name: str, *args: Any, sender: str) -> Contract:
    """Deploy the artifact `name` with constructor `args` from `sender`."""
    art = load_artifact(name)
    factory = w3.eth.contract(abi=art["abi"], bytecode=art["bytecode"])
    receipt = _transact(w3, factory.constructor(*args), sender)
    return contract_at(w3, name, receipt["contractAddress"])


def deploy_settlement(
    w3: Web3,
    token: str,
    *,
    platform: str,
    operator: str,
    sender: str,
    take_rate_bps: int = DEFAULT_TAKE_RATE_BPS,
    reclaim_delay_s: int = DEFAULT_RECLAIM_DELAY_S,
) -> Contract:
    """Deploy Settlement for the 6-decimal stablecoin at `token`.

    take_rate_bps: platform fee in basis points, 0..10000, fixed for the contract's life
    (the contract refuses more than 10000 with TakeRateTooHigh). reclaim_delay_s: seconds a
    buyer's reclaim request must age, with no settlement against it, before the buyer can
    take its unused escrow back (1 hour .. 365 days). `sender` becomes the owner, who may
    replace the operator.
    """
    return deploy(
        w3, "Settlement", to_checksum_address(token), take_rate_bps,
        to_checksum_address(platform), to_checksum_address(operator), reclaim_delay_s,
        sender=sender,
    )


def token_of(w3: Web3, settlement: Contract) -> Contract:
    """The stablecoin contract (ERC-20 ABI of MockUSD) the settlement escrows."""
    return contract_at(w3, "MockUSD", settlement.functions.token().call())


# --------------------------------------------------------------------------- buyers


def deposit(w3: Web3, settlement: Contract, buyer: str, amount: int,
            *, token: Contract | None = None) -> Any:
    """Escrow `amount` micro-USD from `buyer`: approve the settlement contract, then deposit.

    Refused by the contract (FeeOnTransferRefused) if the token delivers less than `amount`.
    Returns the deposit receipt.
    """
    _check_amount(amount)
    token = token or token_of(w3, settlement)
    _transact(w3, token.functions.approve(settlement.address, amount), buyer)
    return _transact(w3, settlement.functions.deposit(amount), buyer)


def request_reclaim(w3: Web3, settlement: Contract, buyer: str) -> Any:
    """Start `buyer`'s reclaim clock (see Settlement.sol: reclaimDelay seconds with no
    settlement against the buyer, then `reclaim`)."""
    return _transact(w3, settlement.functions.requestReclaim(), buyer)


def reclaim(w3: Web3, settlement: Contract, buyer: str) -> Any:
    """Take back `buyer`'s whole unused escrow after an aged reclaim request."""
    return _transact(w3, settlement.functions.reclaim(), buyer)


def escrow_of(settlement: Contract, buyer: str) -> int:
    """`buyer`'s unused escrow in micro-USD."""
    return settlement.functions.escrowOf(to_checksum_address(buyer)).call()


def credit_of(settlement: Contract, payee: str) -> int:
    """A provider's (or the platform's) withdrawable credit in micro-USD."""
    return settlement.functions.creditOf(to_checksum_address(payee)).call()


# --------------------------------------------------------------------------- operator


def lease_key(lease_id: str | int | bytes, part: int | None = None) -> bytes:
    """The 32-byte on-chain id of a lease settlement.

    A 32-byte value passes through unchanged; otherwise keccak256 of
    "gpumarket:lease:<lease_id>" (with ":<part>" when a long lease settles in parts, e.g.
    one part per metering period — each part then settles once).
    """
    if isinstance(lease_id, bytes | bytearray) and len(lease_id) == 32 and part is None:
        return bytes(lease_id)
    if isinstance(lease_id, bytes | bytearray):
        lease_id = "0x" + bytes(lease_id).hex()
    text = f"gpumarket:lease:{lease_id}" + ("" if part is None else f":{int(part)}")
    return keccak(text=text)


class LeaseCharge(NamedTuple):
    """One lease to settle: `cost` micro-USD from `buyer`'s escrow to `provider` (less the
    platform fee). `lease_id` is anything `lease_key` accepts."""

    lease_id: str | int | bytes
    buyer: str
    provider: str
    cost: int


def is_settled(settlement: Contract, lease_id: str | int | bytes) -> bool:
    """Whether the lease id has settled on chain."""
    return settlement.functions.settled(lease_key(lease_id)).call()


def settle(
    w3: Web3,
    settlement: Contract,
    charges: Iterable[LeaseCharge],
    *,
    operator: str,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> list[Any]:
    """Settle many leases, `batch_size` per transaction (`settleBatch`), all-or-nothing
    within a transaction. Leases already settled on chain are skipped (idempotent retry);
    a lease id given twice raises ValueError. Returns the receipts (empty if nothing to do).
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    pending: list[tuple[bytes, str, str, int]] = []
    seen: set[bytes] = set()
    for c in charges:
        key = lease_key(c.lease_id)
        if key in seen:
            raise ValueError(f"lease {c.lease_id!r} appears twice in one settlement run")
        seen.add(key)
        _check_amount(c.cost, allow_zero=True)
        if settlement.functions.settled(key).call():
            continue
        pending.append((key, to_checksum_address(c.buyer), to_checksum_address(c.provider),
                        int(c.cost)))
    receipts = []
    for i in range(0, len(pending), batch_size):
        chunk = pending[i : i + batch_size]
        if len(chunk) == 1:
            fn = settlement.functions.settle(*chunk[0])
        else:
            fn = settlement.functions.settleBatch(chunk)
        receipts.append(_transact(w3, fn, operator))
    return receipts


def refund(w3: Web3, settlement: Contract, buyer: str, amount: int, *, operator: str) -> Any:
    """Return `amount` micro-USD of `buyer`'s unused escrow to the buyer (operator only)."""
    _check_amount(amount)
    return _transact(w3, settlement.functions.refund(to_checksum_address(buyer), amount),
                     operator)


# --------------------------------------------------------------------------- payees


def withdraw(w3: Web3, settlement: Contract, payee: str, *, to: str | None = None) -> Any:
    """Pay out `payee`'s whole credit (provider earnings or platform fees), to `payee` or
    to `to`. Refused (NothingToWithdraw) when the credit is zero."""
    if to is None:
        return _transact(w3, settlement.functions.withdraw(), payee)
    return _transact(w3, settlement.functions.withdrawTo(to_checksum_address(to)), payee)


# --------------------------------------------------------------------------- reconcile


class SettledEvent(NamedTuple):
    """A `LeaseSettled` event. Amounts in micro-USD."""

    lease_id: bytes
    buyer: str
    provider: str
    cost: int
    provider_amount: int
    platform_fee: int
    block_number: int = 0
    tx_hash: str = ""


class LedgerSettlement(NamedTuple):
    """A lease settlement as the ledger recorded it. Amounts in micro-USD; `buyer` and
    `provider` (chain addresses) are compared only when given."""

    lease_id: str | int | bytes
    cost: int
    platform_fee: int
    provider_amount: int
    buyer: str | None = None
    provider: str | None = None


@dataclass(frozen=True)
class Mismatch:
    """One disagreement between ledger and chain.

    kind: "missing_on_chain" (ledger settlement without its event), "not_in_ledger" (event
    without its ledger settlement), "amount" (cost, provider amount or fee differ),
    "party" (buyer or provider address differ), "duplicate_event", "duplicate_ledger",
    "split" (an event or ledger row whose provider + fee ≠ cost).
    """

    kind: str
    lease_id: bytes
    detail: str


def settled_events(
    settlement: Contract, *, from_block: int = 0, to_block: int | str = "latest"
) -> list[SettledEvent]:
    """All `LeaseSettled` events of `settlement` in the block range, oldest first."""
    logs = settlement.events.LeaseSettled().get_logs(from_block=from_block, to_block=to_block)
    return [
        SettledEvent(
            lease_id=bytes(log["args"]["leaseId"]),
            buyer=log["args"]["buyer"],
            provider=log["args"]["provider"],
            cost=log["args"]["cost"],
            provider_amount=log["args"]["providerAmount"],
            platform_fee=log["args"]["platformFee"],
            block_number=log["blockNumber"],
            tx_hash=Web3.to_hex(log["transactionHash"]),
        )
        for log in logs
    ]


def _get(row: Any, name: str, default: Any = None) -> Any:
    if isinstance(row, Mapping):
        return row.get(name, default)
    return getattr(row, name, default)


def _same_address(a: str | None, b: str | None) -> bool:
    return a is None or b is None or a.lower() == b.lower()


def reconcile(
    ledger_settlements: Iterable[LedgerSettlement | Mapping[str, Any]],
    chain_events: Iterable[SettledEvent],
) -> list[Mismatch]:
    """Compare the ledger's lease settlements with the chain's `LeaseSettled` events.

    Every ledger settlement must have exactly one event with equal cost, provider amount and
    platform fee (and equal buyer/provider addresses where the ledger gives them); every
    event must have its ledger settlement. Rows may be `LedgerSettlement`s or mappings with
    the same keys. Returns the mismatches (empty: ledger and chain agree), ledger order
    first, then events without a ledger row in chain order.
    """
    mismatches: list[Mismatch] = []
    events: dict[bytes, SettledEvent] = {}
    for ev in chain_events:
        if ev.lease_id in events:
            mismatches.append(Mismatch("duplicate_event", ev.lease_id,
                                       f"settled again in tx {ev.tx_hash}"))
            continue
        events[ev.lease_id] = ev
        if ev.provider_amount + ev.platform_fee != ev.cost:
            mismatches.append(Mismatch(
                "split", ev.lease_id,
                f"event: provider {ev.provider_amount} + fee {ev.platform_fee} ≠ cost {ev.cost}"))

    matched: set[bytes] = set()
    for row in ledger_settlements:
        key = lease_key(_get(row, "lease_id"))
        cost, fee = int(_get(row, "cost")), int(_get(row, "platform_fee"))
        provider_amount = int(_get(row, "provider_amount"))
        if key in matched:
            mismatches.append(Mismatch("duplicate_ledger", key, "ledger settles the lease twice"))
            continue
        matched.add(key)
        if provider_amount + fee != cost:
            mismatches.append(Mismatch(
                "split", key, f"ledger: provider {provider_amount} + fee {fee} ≠ cost {cost}"))
        ev = events.get(key)
        if ev is None:
            mismatches.append(Mismatch("missing_on_chain", key,
                                       f"ledger settled {cost} micro-USD; no event"))
            continue
        if (ev.cost, ev.provider_amount, ev.platform_fee) != (cost, provider_amount, fee):
            mismatches.append(Mismatch(
                "amount", key,
                f"ledger cost/provider/fee {cost}/{provider_amount}/{fee} ≠ chain "
                f"{ev.cost}/{ev.provider_amount}/{ev.platform_fee}"))
        buyer, provider = _get(row, "buyer"), _get(row, "provider")
        if not (_same_address(buyer, ev.buyer) and _same_address(provider, ev.provider)):
            mismatches.append(Mismatch(
                "party", key,
                f"ledger buyer/provider {buyer}/{provider} ≠ chain {ev.buyer}/{ev.provider}"))
    for key, ev in events.items():
        if key not in matched:
            mismatches.append(Mismatch("not_in_ledger", key,
                                       f"chain settled {ev.cost} micro-USD in tx {ev.tx_hash}"))
    return mismatches


# --------------------------------------------------------------------------- helpers


def _check_amount(amount: Any, *, allow_zero: bool = False) -> None:
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise TypeError("amounts are integer micro-USD (token base units)")
    if amount < 0 or amount > UINT256_MAX or (amount == 0 and not allow_zero):
        raise ValueError(f"amount {amount} micro-USD out of range")


__all__: Sequence[str] = (
    "ChainError", "LeaseCharge", "LedgerSettlement", "Mismatch", "SettledEvent",
    "SettlementRevert", "credit_of", "decode_revert", "deploy", "deploy_settlement",
    "deposit", "escrow_of", "is_settled", "lease_key", "load_artifact", "reclaim",
    "reconcile", "refund", "request_reclaim", "settle", "settled_events", "withdraw",
)
