"""Ledger services: every movement of money is a balanced journal entry.

Called by the marketplace with user ids, amounts (integer micro-USD) and
references; this module imports nothing of `marketplace`, `providers` or
`frontend`. Every function here must run inside the caller's transaction
(`transaction.atomic`), so the entry commits together with the state change
that causes it; each one opens its own atomic block too, so it is safe alone.

Locking: accounts are locked in primary-key order (SELECT … FOR UPDATE), a
hold is locked before it is changed; a second call on a closed hold changes
nothing and says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from django.db import transaction
from django.db.models import BigIntegerField, Case, F, Q, Value, When
from django.db.models.signals import post_save
from django.utils import timezone

from core import metrics
from core.bulk import execute_arrays, insert_all, insert_columns
from settlement.account_rows import find_accounts as _find_accounts
from settlement.account_rows import locked_account_rows as _locked_account_rows
from settlement.capture import CapturePlan, Settled, plan_capture
from settlement.models import Account, Hold, JournalEntry, Posting
from settlement.money import format_usd

Kind = Account.Kind


class SettlementError(Exception):
    """Base of the ledger's refusals; the message is safe to show to a user."""


class InsufficientFunds(SettlementError):
    def __init__(self, *, needed: int, available: int) -> None:
        self.needed = needed
        self.available = available
        super().__init__(
            f"insufficient balance: this needs {format_usd(needed)} USD held, "
            f"{format_usd(available)} USD is available"
        )


class HoldClosed(SettlementError):
    pass


def account(kind: str, owner_id: int | None = None) -> Account:
    """The account of `kind` for `owner_id` (None for platform and external ones), created
    on first use. External accounts may go below zero; no other may."""
    acct, _ = Account.objects.get_or_create(
        kind=kind, owner_id=owner_id,
        defaults={"allow_negative": kind in Account.EXTERNAL_KINDS},
    )
    _account_ids[(kind, owner_id)] = acct.pk
    return acct


# (kind, owner id) → account id, per process: an account's kind and owner never change
# once created. Every use is checked on the row it locks (a cached id whose row is gone
# or belongs to another (kind, owner) — a restored or flushed database — is looked up
# again), so a stale entry costs a second look-up, never a wrong posting.
_account_ids: dict[tuple[str, int | None], int] = {}


def _lock_accounts(keys: list[tuple[str, int | None]]) -> dict[tuple[str, int | None],
                                                                 tuple[int, int, bool]]:
    """Lock the existing accounts of `keys` (SELECT … FOR UPDATE, by id) and return
    key → (id, balance, allow_negative); a key without an account yet is left out (it is
    not created here). Runs in the caller's transaction."""
    for _attempt in range(2):
        ids = {k: _account_ids[k] for k in keys if k in _account_ids}
        missing = [k for k in keys if k not in ids]
        if missing:  # one term per kind (owner_id IN …), never one per account
            owners: dict[str, set[int | None]] = {}
            for kind, owner in missing:
                owners.setdefault(kind, set()).add(owner)
            for pk, kind, owner in _find_accounts(owners):
                ids[(kind, owner)] = _account_ids[(kind, owner)] = pk
        rows = _locked_account_rows(sorted(ids.values()))
        got = {(kind, owner): (pk, balance, neg) for pk, kind, owner, balance, neg in rows}
        if all(got.get(k, (None,))[0] == pk for k, pk in ids.items()):
            return got
        for k in ids:  # a cached id no longer names that account: look them up again
            _account_ids.pop(k, None)
    return got


def lock_accounts_creating(keys: list[tuple[str, int | None]]
                           ) -> dict[tuple[str, int | None], tuple[int, int, bool]]:
    """_lock_accounts of `keys`, the missing accounts created first in one INSERT (ON
    CONFLICT DO NOTHING: a concurrent first use is not an error)."""
    locked = _lock_accounts(keys)
    missing = [k for k in keys if k not in locked]
    if missing:
        Account.objects.bulk_create(
            [Account(kind=kind, owner_id=owner, allow_negative=kind in Account.EXTERNAL_KINDS)
             for kind, owner in missing], ignore_conflicts=True)
        locked = _lock_accounts(keys)
    return locked


def check_funds(rows: Iterable[tuple[int, int]],
                locked: dict[tuple[str, int | None], tuple[int, int, bool]]) -> None:
    """InsufficientFunds when the signed (account id, micro-USD) `rows`, applied in order,
    would take an account that may not go negative below zero (as post_entry checks each
    entry against the balance it finds)."""
    by_id = {pk: (balance, neg) for pk, balance, neg in locked.values()}
    left = {pk: balance for pk, (balance, _) in by_id.items()}
    for pk, amt in rows:
        if amt < 0 and not by_id[pk][1] and left[pk] + amt < 0:
            raise InsufficientFunds(needed=-amt, available=left[pk])
        left[pk] += amt


@dataclass(frozen=True)
class _Entry:
    """One balanced entry to write: (account id, signed micro-USD) rows."""

    kind: str
    rows: list[tuple[int, int]]
    memo: str = ""
    reference: str = ""
    hold: Hold | None = None
    idempotency_key: str | None = None
    hold_id: int | None = None  # the hold by id alone (settlement.bulk's releases)


def _write_entries(entries: list[_Entry]) -> list[JournalEntry]:
    """The writes of balanced entries whose accounts the caller has locked and checked:
    one INSERT of the entries, one of all their postings and one UPDATE of the balances,
    whatever their number (core.bulk). That sends no post_save, so it is sent here
    for each entry (the live feed listens to it)."""
    if not entries:
        return []
    made = insert_all([
        JournalEntry(kind=e.kind, memo=e.memo[:200], reference=e.reference,
                     idempotency_key=e.idempotency_key,
                     **({"hold": e.hold} if e.hold is not None else {"hold_id": e.hold_id}))
        for e in entries])
    rows = [(entry.pk, pk, amt) for entry, e in zip(made, entries, strict=True)
            for pk, amt in e.rows]
    insert_columns(Posting, {"entry_id": [r[0] for r in rows],
                             "account_id": [r[1] for r in rows],
                             "amount": [r[2] for r in rows]})
    delta: dict[int, int] = {}
    for e in entries:
        for pk, amt in e.rows:
            delta[pk] = delta.get(pk, 0) + amt
    _add_to_balances(delta)
    using = JournalEntry.objects.db
    for entry in made:
        post_save.send(sender=JournalEntry, instance=entry, created=True, raw=False,
                       using=using, update_fields=None)
    return made


def _add_to_balances(delta: dict[int, int]) -> None:
    """One UPDATE adding delta[id] micro-USD to each account's balance. On PostgreSQL the
    pairs travel as two arrays (unnest), which costs the same for 2 accounts or 200; a
    CASE per account is built elsewhere (Django builds an expression object per WHEN,
    which dominated the cost of a group of bids)."""
    connection = transaction.get_connection()
    if connection.vendor == "postgresql":
        execute_arrays(
            connection,
            'UPDATE "settlement_account" SET "balance" = "settlement_account"."balance" '
            '+ d.amount FROM unnest(%s::bigint[], %s::bigint[]) AS d(id, amount) '
            'WHERE "settlement_account"."id" = d.id', [list(delta), list(delta.values())])
        return
    Account.objects.filter(pk__in=list(delta)).update(balance=F("balance") + Case(
        *(When(pk=pk, then=Value(amt)) for pk, amt in delta.items()),
        default=Value(0), output_field=BigIntegerField()))


def _write_entry(*, kind: str, rows: list[tuple[int, int]], memo: str = "",
                 reference: str = "", hold: Hold | None = None,
                 idempotency_key: str | None = None) -> JournalEntry:
    """The writes of one balanced entry (see _write_entries)."""
    return _write_entries([_Entry(kind, rows, memo, reference, hold, idempotency_key)])[0]


def post_entry(
    *,
    kind: str,
    postings: Iterable[tuple[Account, int]],
    memo: str = "",
    reference: str = "",
    hold: Hold | None = None,
    idempotency_key: str | None = None,
) -> JournalEntry:
    """Write one journal entry of `postings` (account, signed micro-USD) and move balances.

    Raises ValueError when the postings do not sum to zero, and InsufficientFunds
    when a non-external account would go below zero (nothing is written then).
    """
    rows = [(a, int(amt)) for a, amt in postings if int(amt) != 0]
    if sum(amt for _, amt in rows) != 0:
        raise ValueError(f"journal entry {kind} does not balance: {rows}")
    with transaction.atomic():
        ids = sorted({a.pk for a, _ in rows})
        locked = {a.pk: a for a in Account.objects.select_for_update().filter(pk__in=ids)
                  .order_by("pk")}
        for acct, amt in rows:
            current = locked[acct.pk]
            if amt < 0 and not current.allow_negative and current.balance + amt < 0:
                raise InsufficientFunds(needed=-amt, available=current.balance)
        entry = _write_entry(kind=kind, rows=[(a.pk, amt) for a, amt in rows], memo=memo,
                             reference=reference, hold=hold, idempotency_key=idempotency_key)
    return entry


def _post_by_keys(*, kind: str, postings: list[tuple[tuple[str, int | None], int]],
                  memo: str = "", reference: str = "", hold: Hold | None = None,
                  idempotency_key: str | None = None) -> JournalEntry:
    """post_entry with accounts named by (kind, owner id): locked by their cached ids in
    one statement (_lock_accounts) instead of a look-up each; an account not yet made is
    created first (account). Same checks and errors as post_entry."""
    rows = [(k, int(amt)) for k, amt in postings if int(amt) != 0]
    if sum(amt for _, amt in rows) != 0:
        raise ValueError(f"journal entry {kind} does not balance: {rows}")
    keys = list(dict.fromkeys(k for k, _ in rows))
    with transaction.atomic():
        locked = _lock_accounts(keys)
        if any(k not in locked for k in keys):
            for k in keys:
                if k not in locked:
                    account(*k)
            locked = _lock_accounts(keys)
        for k, amt in rows:
            _, balance, allow_negative = locked[k]
            if amt < 0 and not allow_negative and balance + amt < 0:
                raise InsufficientFunds(needed=-amt, available=balance)
        return _write_entry(kind=kind, rows=[(locked[k][0], amt) for k, amt in rows],
                            memo=memo, reference=reference, hold=hold,
                            idempotency_key=idempotency_key)


def wallet_credit_postings(*, user_id: int, amount: int,
                           source: Account) -> list[tuple[Account, int]]:
    """Postings that bring `amount` micro-USD from `source` into a buyer's wallet: what the
    buyer owes (a negative `buyer_debt` after a refund or dispute took back money already
    spent) is repaid first, the rest becomes available."""
    # locked: two credits at once must not both repay the same debt (callers run inside
    # a transaction); all three in primary-key order, as post_entry and the refunds lock
    # them, so that a credit and a refund of one buyer cannot deadlock
    wallet = account(Kind.BUYER_AVAILABLE, user_id)
    locked = list(Account.objects.select_for_update()
                  .filter(Q(pk__in=[source.pk, wallet.pk])
                          | Q(kind=Kind.BUYER_DEBT, owner_id=user_id)).order_by("pk"))
    debt = next((a for a in locked if a.kind == Kind.BUYER_DEBT), None)
    repay = min(amount, -debt.balance) if debt is not None and debt.balance < 0 else 0
    postings = [(source, -amount), (wallet, amount - repay)]
    if repay:
        postings.append((debt, repay))
    return postings


def dev_credit(*, user_id: int, amount: int, memo: str = "development credit") -> JournalEntry:
    """Credit `amount` micro-USD to a buyer's available balance from the development
    credit account. Only for the demo and tests (GPUMARKET_DEV_CREDIT); the view checks
    the setting. Raises ValueError for a non-positive amount."""
    if amount <= 0:
        raise ValueError("amount must be positive")
    with transaction.atomic():
        return post_entry(
            kind=JournalEntry.Kind.DEV_CREDIT,
            postings=wallet_credit_postings(user_id=user_id, amount=amount,
                                            source=account(Kind.EXTERNAL_DEV_CREDIT)),
            memo=memo, reference=f"user:{user_id}",
        )


def hold_place(*, buyer_id: int, amount: int, reference: str) -> Hold:
    """Reserve `amount` micro-USD of the buyer's available balance.

    Raises InsufficientFunds (nothing written) when the available balance is lower.
    """
    placed = holds_place_many([(buyer_id, amount, reference)])[0]
    if isinstance(placed, InsufficientFunds):
        raise placed
    return placed


def holds_place_many(requests: list[tuple[int, int, str]]) -> list[Hold | InsufficientFunds]:
    """Reserve several amounts at once: `requests` are (buyer id, micro-USD, reference),
    taken in order, each against what the buyer has left after the earlier ones. Returns,
    per request, its Hold, or the InsufficientFunds refusing it (nothing written for a
    refused one; the others stand). The accounts of every buyer are locked in one
    statement (by id), and all holds, entries, postings and balances are written in a
    fixed number of statements: this is the hot path of every bid (marketplace/book.py
    place_bids groups concurrent bids into one transaction).

    Raises ValueError when an amount is not positive (nothing written)."""
    if any(amount <= 0 for _, amount, _ in requests):
        raise ValueError("a hold must be positive")
    buyers = list(dict.fromkeys(buyer for buyer, _, _ in requests))
    results: list[Hold | InsufficientFunds] = []
    # The accounts are locked and checked before anything is written, so a refusal needs
    # no savepoint.
    with transaction.atomic(savepoint=False):
        locked = _lock_accounts([(kind, b) for b in buyers
                                 for kind in (Kind.BUYER_AVAILABLE, Kind.BUYER_HELD)])
        left = {b: locked.get((Kind.BUYER_AVAILABLE, b), (None, 0, False))[1] for b in buyers}
        accepted: list[tuple[int, int, str]] = []
        for buyer, amount, reference in requests:
            if left[buyer] >= amount:
                left[buyer] -= amount
                accepted.append((buyer, amount, reference))
                results.append(None)  # type: ignore[arg-type]  (filled in below)
            else:
                results.append(InsufficientFunds(needed=amount, available=left[buyer]))
        if accepted:
            held = {b: locked[(Kind.BUYER_HELD, b)][0] if (Kind.BUYER_HELD, b) in locked
                    else account(Kind.BUYER_HELD, b).pk  # first use; nobody else sees it
                    for b in {buyer for buyer, _, _ in accepted}}
            holds = insert_all([
                Hold(buyer_id=buyer, original=amount, amount=amount, reference=reference)
                for buyer, amount, reference in accepted])
            _write_entries([
                _Entry(JournalEntry.Kind.HOLD_PLACE,
                       [(locked[(Kind.BUYER_AVAILABLE, buyer)][0], -amount),
                        (held[buyer], amount)], reference=reference, hold=hold)
                for hold, (buyer, amount, reference) in zip(holds, accepted, strict=True)])
            metrics.ledger_held(sum(amount for _, amount, _ in accepted))
            it = iter(holds)
            results = [next(it) if r is None else r for r in results]
    return results


def _locked_active_hold(hold_id: int) -> Hold:
    hold = Hold.objects.select_for_update().get(pk=hold_id)
    if hold.status != Hold.Status.ACTIVE:
        raise HoldClosed(f"hold {hold_id} is already {hold.status}")
    return hold


def hold_release(*, hold_id: int, cause: str) -> int:
    """Give everything still held back to the buyer; the hold becomes `released`.

    Returns the micro-USD released. Raises HoldClosed on a hold that is not active.
    """
    with transaction.atomic():
        hold = _locked_active_hold(hold_id)
        released = hold.amount
        if released:
            post_entry(
                kind=JournalEntry.Kind.HOLD_RELEASE,
                postings=[(account(Kind.BUYER_HELD, hold.buyer_id), -released),
                          (account(Kind.BUYER_AVAILABLE, hold.buyer_id), released)],
                memo=cause, reference=hold.reference, hold=hold,
            )
        hold.released += released
        hold.amount = 0
        hold.status = Hold.Status.RELEASED
        hold.closed_at = timezone.now()
        hold.save(update_fields=["released", "amount", "status", "closed_at"])
    return released


def hold_relabel(*, hold_id: int, reference: str) -> None:
    """Name what a hold now secures (a sealed bid's hold once it wins: "lease:<id>"); its
    journal entries keep the reference they were written with."""
    Hold.objects.filter(pk=hold_id).update(reference=reference)


def hold_reduce(*, hold_id: int, to_amount: int, cause: str) -> int:
    """Cut an active hold down to `to_amount` micro-USD, releasing the rest to the buyer
    (a winner's hold cut to what it pays). Returns the micro-USD released."""
    with transaction.atomic():
        hold = _locked_active_hold(hold_id)
        if not 0 <= to_amount <= hold.amount:
            raise ValueError(f"cannot reduce hold {hold_id} from {hold.amount} to {to_amount}")
        released = hold.amount - to_amount
        if released:
            post_entry(
                kind=JournalEntry.Kind.HOLD_REDUCE,
                postings=[(account(Kind.BUYER_HELD, hold.buyer_id), -released),
                          (account(Kind.BUYER_AVAILABLE, hold.buyer_id), released)],
                memo=cause, reference=hold.reference, hold=hold,
            )
            hold.released += released
            hold.amount = to_amount
            hold.save(update_fields=["released", "amount"])
    return released


def _locked_active_holds(hold_ids: list[int]) -> list[Hold]:
    """The holds of `hold_ids`, locked in primary-key order, returned in the order given
    (the order a charge fills them). HoldClosed if one is not active."""
    locked = {h.pk: h for h in Hold.objects.select_for_update().filter(pk__in=hold_ids)
              .order_by("pk")}
    holds = [locked[pk] for pk in hold_ids]
    for hold in holds:
        if hold.status != Hold.Status.ACTIVE:
            raise HoldClosed(f"hold {hold.pk} is already {hold.status}")
    return holds


def _capture(holds: list[Hold], *, amount: int, provider_id: int, release: bool, kind: str,
             reference: str, idempotency_key: str, carry: bool = False) -> Settled:
    """Capture `amount` micro-USD from `holds` (filled in the order given: the first hold
    first), split once over the whole amount, and, with `release`, return every hold's rest
    to the buyer — or, with `carry` too, keep it held (the caller puts it on a new hold):
    one journal entry. Each hold keeps its own share of the capture and of the fee
    (cumulative floors, so the shares sum to the split's fee exactly)."""
    plan = capture_plan(holds, amount=amount, provider_id=provider_id, release=release,
                        carry=carry)
    entry = _post_by_keys(kind=kind, postings=plan.postings, memo=plan.memo,
                          reference=reference, hold=holds[0],
                          idempotency_key=idempotency_key)
    return plan.apply(holds, entry.pk)


def capture_plan(holds: list[Hold], *, amount: int, provider_id: int, release: bool,
                 carry: bool = False) -> CapturePlan:
    """settlement.capture.plan_capture over hold instances (see _capture)."""
    return plan_capture([h.amount for h in holds], buyer_id=holds[0].buyer_id,
                        amount=amount, provider_id=provider_id, release=release,
                        carry=carry)


def hold_capture(*, hold_id: int, through_cost: int, provider_id: int, reference: str,
                 period: str) -> Settled | None:
    """hold_capture_many on one hold."""
    return hold_capture_many(hold_ids=[hold_id], through_cost=through_cost,
                             provider_id=provider_id, reference=reference, period=period)


def hold_capture_many(*, hold_ids: list[int], through_cost: int, provider_id: int,
                      reference: str, period: str) -> Settled | None:
    """Periodic settlement: capture what a running lease owes so far.

    `through_cost` is the lease's whole cost up to now (micro-USD) over its holds
    `hold_ids` (its first hold, then one per extension: filled in that order); what was
    captured before is subtracted, and the difference is split and paid now; the holds
    stay active. Idempotent per `period` (the entry's key is `meter:<reference>:<period>`):
    a repeated call returns None and changes nothing, as does a cost not above what was
    already captured. Raises HoldClosed, and ValueError when through_cost exceeds what
    the holds were placed for.

    Rounding: each capture is split on its own (fee = amount × bps // 10000), so over a
    lease the platform gets Σ floor(p_i × bps / 10000) ≤ floor(Σ p_i × bps / 10000):
    at most one micro-USD per period less than the split of the whole, and that dust
    goes to the provider, as DESIGN.md's rule does for a single split.
    """
    key = f"meter:{reference}:{period}"
    with transaction.atomic():
        holds = _locked_active_holds(hold_ids)
        if JournalEntry.objects.filter(idempotency_key=key).exists():
            return None
        if through_cost > sum(h.original - h.released for h in holds):
            raise ValueError(f"cost {through_cost} is beyond holds {hold_ids}")
        amount = through_cost - sum(h.captured for h in holds)
        if amount <= 0:
            return None
        settled = _capture(holds, amount=amount, provider_id=provider_id, release=False,
                           kind=JournalEntry.Kind.LEASE_METER, reference=reference,
                           idempotency_key=key)
        for hold in holds:
            hold.save(update_fields=["captured", "captured_fee", "released", "amount"])
    return settled


def hold_settle(*, hold_id: int, cost: int, provider_id: int, reference: str) -> Settled:
    """hold_settle_many on one hold."""
    return hold_settle_many(hold_ids=[hold_id], cost=cost, provider_id=provider_id,
                            reference=reference)


def hold_settle_many(*, hold_ids: list[int], cost: int, provider_id: int,
                     reference: str, carry_reference: str = "") -> Settled:
    """Final settlement: the lease's whole cost is `cost` micro-USD over its holds
    `hold_ids` (filled in that order); capture what periodic captures have not yet paid,
    split it (settlement.split, GPUMARKET_TAKE_RATE_BPS), return the rest of every hold to
    the buyer and close them all — one journal entry.

    With `carry_reference`, the rest is not returned but stays held on one new hold of
    that reference (a failed lease's unused hold moving to its continuation, issue 15):
    `Settled.carried_hold_id` (None when there is no rest).

    Exactly once: the entry's idempotency key is `settle:<reference>`, and a closed hold
    raises HoldClosed. Raises ValueError when cost is below what was already captured or
    beyond the holds.
    """
    with transaction.atomic():
        holds = _locked_active_holds(hold_ids)
        amount = cost - sum(h.captured for h in holds)
        if amount < 0 or amount > sum(h.amount for h in holds):
            raise ValueError(f"cost {cost} is outside holds {hold_ids} "
                             f"({sum(h.captured for h in holds)} captured, "
                             f"{sum(h.amount for h in holds)} held)")
        settled = _capture(holds, amount=amount, provider_id=provider_id, release=True,
                           kind=JournalEntry.Kind.LEASE_SETTLE, reference=reference,
                           idempotency_key=f"settle:{reference}",
                           carry=bool(carry_reference))
        closed_at = timezone.now()
        for hold in holds:
            hold.status = Hold.Status.CAPTURED
            hold.closed_at = closed_at
            hold.save(update_fields=["captured", "captured_fee", "released", "amount",
                                     "status", "closed_at"])
        if carry_reference and settled.released:
            carried = Hold.objects.create(buyer_id=holds[0].buyer_id,
                                          original=settled.released,
                                          amount=settled.released, reference=carry_reference)
            settled = replace(settled, carried_hold_id=carried.pk)
    return settled


@dataclass(frozen=True)
class Wallet:
    available: int  # micro-USD
    held: int       # micro-USD
    earned: int     # micro-USD earned as a provider, not yet paid out


def wallet(*, user_id: int) -> Wallet:
    """A user's balances in micro-USD, read from the ledger's accounts."""
    return wallets(user_ids=[user_id])[user_id]


def wallets(*, user_ids: Iterable[int]) -> dict[int, Wallet]:
    """Several users' balances in micro-USD (one query), by user id."""
    ids = set(user_ids)
    balances: dict[int, dict[str, int]] = {u: {} for u in ids}
    for owner, kind, balance in (Account.objects.filter(owner_id__in=ids)
                                 .values_list("owner_id", "kind", "balance")):
        balances[owner][kind] = balance
    return {u: Wallet(available=b.get(Kind.BUYER_AVAILABLE, 0), held=b.get(Kind.BUYER_HELD, 0),
                      earned=b.get(Kind.PROVIDER_EARNED, 0)) for u, b in balances.items()}
