"""Set-based ledger moves over many holds at once: a sealed close's losers
(`holds_release_many`), a batch of lease ends (`holds_settle_batch`), a metering run
(`holds_capture_batch`). Each writes exactly the journal entries, postings and hold
figures that the one-at-a-time services (settlement.services) write for the same holds
in the same order, in a fixed number of statements whatever their number: one lock of
all holds (primary-key order), one lock of all accounts (by id, one term per kind), one
INSERT of the entries, one of the postings, one UPDATE of the balances and one of the
holds (core.bulk). Run inside the caller's transaction; a refusal raises before anything
is written and the caller's transaction stays usable (a savepoint). Source of the rules:
the services they stand for.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from core import metrics
from core.bulk import execute_arrays, insert_columns, select_by_ids, update_all
from settlement.capture import plan_capture
from settlement.models import Hold, JournalEntry, Posting
from settlement.services import (
    CapturePlan,
    HoldClosed,
    Kind,
    Settled,
    _add_to_balances,
    _Entry,
    _write_entries,
    capture_plan,
    check_funds,
    lock_accounts_creating,
)
from settlement.signals import entries_written

_HOLD_FIGURES = ["captured", "captured_fee", "released", "amount"]


def _locked_holds(hold_ids: list[int]) -> dict[int, Hold]:
    """The holds of `hold_ids` locked in primary-key order (one statement), by id;
    HoldClosed if one is missing or not active."""
    locked = {h.pk: h for h in select_by_ids(Hold, sorted(set(hold_ids)), for_update=True)}
    for pk in hold_ids:
        hold = locked.get(pk)
        if hold is None:
            raise Hold.DoesNotExist(f"no hold {pk}")
        if hold.status != Hold.Status.ACTIVE:
            raise HoldClosed(f"hold {pk} is already {hold.status}")
    return locked


def _write(entries: list[tuple[str, list[tuple[tuple[str, int | None], int]], str, str,
                               Hold | int, str | None]]) -> list[JournalEntry]:
    """Lock (creating) every account the entries name, check them and write all entries:
    (kind, postings by (kind, owner id), memo, reference, hold or its id, idempotency
    key)."""
    keys = list(dict.fromkeys(k for _, postings, *_ in entries for k, _ in postings))
    locked = lock_accounts_creating(keys)
    made = [_Entry(kind, [(locked[k][0], amt) for k, amt in postings if amt != 0],
                   memo, reference, None if isinstance(hold, int) else hold, key,
                   hold if isinstance(hold, int) else None)
            for kind, postings, memo, reference, hold, key in entries]
    check_funds((row for e in made for row in e.rows), locked)
    return _write_entries(made)


def holds_release_many(releases: list[tuple[int, str]]) -> list[int]:
    """hold_release of each (hold id, cause) in `releases`: everything still held goes
    back to its buyer, the hold becomes `released` (one `hold_release` entry per hold
    with something left). Returns the micro-USD released per hold, in order. HoldClosed
    (nothing written) when a hold is not active or appears twice. The holds are read as
    rows and updated by one set-based UPDATE (no instances: 10,000 holds, bench/README.md
    "Sealed close")."""
    ids = [pk for pk, _ in releases]
    if len(set(ids)) != len(ids):
        raise HoldClosed("a hold is released twice in one call")
    with transaction.atomic():  # a savepoint: a refusal leaves the caller's transaction usable
        holds = _locked_hold_rows(ids)
        _write([(JournalEntry.Kind.HOLD_RELEASE,
                 [((Kind.BUYER_HELD, buyer), -amount), ((Kind.BUYER_AVAILABLE, buyer), amount)],
                 cause, reference, pk, None)
                for pk, cause in releases
                for buyer, amount, reference in [holds[pk]] if amount])
        _close_released(ids, timezone.now())
    return [holds[pk][1] for pk in ids]


def _locked_hold_rows(hold_ids: list[int]) -> dict[int, tuple[int, int, str]]:
    """_locked_holds as rows: id → (buyer id, amount, reference), locked in primary-key
    order; the same errors."""
    connection = transaction.get_connection()
    if connection.vendor == "postgresql":
        rows = execute_arrays(connection, "SELECT id, buyer_id, status, amount, reference "
                              "FROM settlement_hold WHERE id = ANY(%s::bigint[]) "
                              "ORDER BY id FOR UPDATE", [sorted(set(hold_ids))])
    else:
        rows = list(Hold.objects.select_for_update().filter(pk__in=hold_ids).order_by("pk")
                    .values_list("pk", "buyer_id", "status", "amount", "reference"))
    locked = {pk: (buyer, status, amount, ref) for pk, buyer, status, amount, ref in rows}
    for pk in hold_ids:
        row = locked.get(pk)
        if row is None:
            raise Hold.DoesNotExist(f"no hold {pk}")
        if row[1] != Hold.Status.ACTIVE:
            raise HoldClosed(f"hold {pk} is already {row[1]}")
    return {pk: (buyer, amount, ref) for pk, (buyer, _, amount, ref) in locked.items()}


def _close_released(hold_ids: list[int], closed_at) -> None:
    """The released holds' figures, as hold_release leaves them: released += amount,
    amount 0, status `released`, closed_at — one UPDATE."""
    connection = transaction.get_connection()
    if connection.vendor == "postgresql":
        execute_arrays(connection, "UPDATE settlement_hold SET released = released + amount, "
                       "amount = 0, status = %s, closed_at = %s "
                       "WHERE id = ANY(%s::bigint[])",
                       [Hold.Status.RELEASED.value, closed_at, hold_ids])
        return
    Hold.objects.filter(pk__in=hold_ids).update(
        released=F("released") + F("amount"), amount=0, status=Hold.Status.RELEASED,
        closed_at=closed_at)


@dataclass(frozen=True)
class Charge:
    """One lease's charge in a batch: its holds (filled in this order), the cost through
    now (micro-USD), the provider paid, the reference ("lease:<id>"); `period` for a
    periodic capture (its idempotency key is meter:<reference>:<period>)."""

    hold_ids: list[int]
    cost: int
    provider_id: int
    reference: str
    period: str = ""


def holds_settle_batch(charges: list[Charge]) -> list[Settled]:
    """hold_settle_many of each charge (final settlement, nothing carried): what periodic
    captures have not paid is captured and split, the rest of every hold returned, the
    holds closed `captured`; one `lease_settle` entry per charge, keyed
    settle:<reference>. Same errors as hold_settle_many (HoldClosed, ValueError), for
    the first charge at fault; nothing is written then."""
    with transaction.atomic():  # a savepoint: a refusal leaves the caller's transaction usable
        locked = _locked_holds([pk for c in charges for pk in c.hold_ids])
        plans: list[tuple[Charge, list[Hold], CapturePlan]] = []
        for c in charges:
            holds = [locked[pk] for pk in c.hold_ids]
            captured, held = sum(h.captured for h in holds), sum(h.amount for h in holds)
            amount = c.cost - captured
            if amount < 0 or amount > held:
                raise ValueError(f"cost {c.cost} is outside holds {c.hold_ids} "
                                 f"({captured} captured, {held} held)")
            plans.append((c, holds, capture_plan(holds, amount=amount,
                                                 provider_id=c.provider_id, release=True)))
        entries = _write([(JournalEntry.Kind.LEASE_SETTLE, plan.postings, plan.memo,
                           c.reference, holds[0], f"settle:{c.reference}")
                          for c, holds, plan in plans])
        out = [plan.apply(holds, entry.pk)
               for (_, holds, plan), entry in zip(plans, entries, strict=True)]
        closed_at = timezone.now()
        for hold in locked.values():
            hold.status = Hold.Status.CAPTURED
            hold.closed_at = closed_at
        update_all(list(locked.values()), [*_HOLD_FIGURES, "status", "closed_at"])
    return out


def holds_capture_batch(charges: list[Charge]) -> list[Settled | None]:
    """hold_capture_many of each charge (periodic settlement): the cost through now less
    what was captured before is captured and split (settlement.capture.plan_capture), the
    holds stay active; idempotent per period (a charge whose key
    meter:<reference>:<period> exists, or whose cost is not above what was captured,
    gives None and writes nothing). ValueError for a cost beyond its holds; HoldClosed;
    nothing written then. Works on plain rows, no model instances (bench/README.md "The
    hour boundary": 100,000 leases a metering run): one lock of the holds, one read of
    the keys, one lock of the accounts, one INSERT each of the entries and postings, one
    UPDATE each of the balances and holds. Every refusal is raised before anything is
    written (only a missing, empty account may have been created), so no savepoint: the
    caller's transaction stays usable without one (two round trips less a batch)."""
    with transaction.atomic(savepoint=False):
        holds = _locked_capture_rows([pk for c in charges for pk in c.hold_ids])
        keys = [f"meter:{c.reference}:{c.period}" for c in charges]
        done = _existing_keys(keys)
        out: list[Settled | None] = [None] * len(charges)
        entries, made, changed = [], [], {}
        for i, (c, key) in enumerate(zip(charges, keys, strict=True)):
            if key in done:
                continue
            figures = [holds[pk] for pk in c.hold_ids]
            if c.cost > sum(h[1] - h[5] for h in figures):  # original - released
                raise ValueError(f"cost {c.cost} is beyond holds {c.hold_ids}")
            amount = c.cost - sum(h[3] for h in figures)
            if amount <= 0:
                continue
            plan = plan_capture([h[2] for h in figures], buyer_id=figures[0][0],
                                amount=amount, provider_id=c.provider_id, release=False)
            for h, (take, fee, rest) in zip(figures, plan.shares, strict=True):
                h[2] -= take + rest
                h[3] += take
                h[4] += fee
                h[5] += rest
            changed.update((pk, holds[pk]) for pk in c.hold_ids)
            entries.append((JournalEntry.Kind.LEASE_METER, plan.postings, plan.memo,
                            c.reference, c.hold_ids[0], key))
            made.append((i, plan, sum(h[3] for h in figures), sum(h[4] for h in figures)))
        entry_ids = _write_rows(entries)
        for (i, plan, captured, fee), entry_id in zip(made, entry_ids, strict=True):
            out[i] = Settled(split=plan.split, released=0, entry_id=entry_id,
                             captured_total=captured, fee_total=fee)
        _update_hold_figures(changed)
        if made:
            metrics.ledger_captured(sum(p.split.gross for _, p, *_ in made),
                                    sum(p.split.platform_fee for _, p, *_ in made))
    return out


_CAPTURE_COLUMNS = "id, buyer_id, status, original, amount, captured, captured_fee, released"


def _locked_capture_rows(hold_ids: list[int]) -> dict[int, list[int]]:
    """The holds of `hold_ids` locked in primary-key order (one statement): id →
    [buyer id, original, amount, captured, captured_fee, released] (micro-USD; a list, so
    a capture moves the figures in place). Hold.DoesNotExist / HoldClosed as
    _locked_holds."""
    connection = transaction.get_connection()
    ids = sorted(set(hold_ids))
    if connection.vendor == "postgresql":
        rows = execute_arrays(connection, f"SELECT {_CAPTURE_COLUMNS} FROM settlement_hold "  # noqa: S608
                              "WHERE id = ANY(%s::bigint[]) ORDER BY id FOR UPDATE", [ids])
    else:
        rows = list(Hold.objects.select_for_update().filter(pk__in=ids).order_by("pk")
                    .values_list(*_CAPTURE_COLUMNS.split(", ")))
    locked = {pk: (status, [buyer, *figures]) for pk, buyer, status, *figures in rows}
    for pk in hold_ids:
        row = locked.get(pk)
        if row is None:
            raise Hold.DoesNotExist(f"no hold {pk}")
        if row[0] != Hold.Status.ACTIVE:
            raise HoldClosed(f"hold {pk} is already {row[0]}")
    return {pk: figures for pk, (_, figures) in locked.items()}


def _existing_keys(keys: list[str]) -> set[str]:
    """Those of the idempotency `keys` that a journal entry already has (one statement)."""
    connection = transaction.get_connection()
    if connection.vendor == "postgresql":
        return {k for (k,) in execute_arrays(
            connection, "SELECT idempotency_key FROM settlement_journalentry "
            "WHERE idempotency_key = ANY(%s::text[])", [keys])}
    return set(JournalEntry.objects.filter(idempotency_key__in=keys)
               .values_list("idempotency_key", flat=True))


def _write_rows(entries: list[tuple[str, list[tuple[tuple[str, int | None], int]], str,
                                    str, int, str | None]]) -> list[int]:
    """_write on plain rows: (kind, postings by (kind, owner id), memo, reference, hold
    id, idempotency key) → the new entries' ids, in order. Accounts locked (created) and
    checked, then one INSERT of the entries, one of the postings, one UPDATE of the
    balances; `entries_written` is sent for them (no post_save per entry)."""
    if not entries:
        return []
    keys = list(dict.fromkeys(k for _, postings, *_ in entries for k, _ in postings))
    locked = lock_accounts_creating(keys)
    rows = [[(locked[k][0], amt) for k, amt in postings if amt != 0]
            for _, postings, *_ in entries]
    check_funds((r for one in rows for r in one), locked)
    now = timezone.now()
    ids = insert_columns(JournalEntry, {
        "kind": [e[0] for e in entries], "memo": [e[2][:200] for e in entries],
        "hold_id": [e[4] for e in entries], "reference": [e[3] for e in entries],
        "idempotency_key": [e[5] for e in entries], "evidence": [""] * len(entries),
        "created_at": [now] * len(entries)}, returning=True)
    entry_col, account_col, amount_col, delta = [], [], [], {}
    for entry_id, one in zip(ids, rows, strict=True):
        for account_id, amt in one:
            entry_col.append(entry_id)
            account_col.append(account_id)
            amount_col.append(amt)
            delta[account_id] = delta.get(account_id, 0) + amt
    insert_columns(Posting, {"entry_id": entry_col, "account_id": account_col,
                             "amount": amount_col})
    _add_to_balances(delta)
    entries_written.send(sender=JournalEntry, entry_ids=ids)
    return ids


def _update_hold_figures(figures: dict[int, list[int]]) -> None:
    """Write each hold's [buyer, original, amount, captured, captured_fee, released]
    figures back (the last four; one UPDATE)."""
    if not figures:
        return
    connection = transaction.get_connection()
    ids = list(figures)
    cols = [[figures[pk][i] for pk in ids] for i in (2, 3, 4, 5)]
    if connection.vendor == "postgresql":
        execute_arrays(connection, "UPDATE settlement_hold SET amount = u.a, captured = u.c, "
                       "captured_fee = u.f, released = u.r FROM unnest(%s::bigint[], "
                       "%s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[]) "
                       "AS u(id, a, c, f, r) WHERE settlement_hold.id = u.id", [ids, *cols])
        return
    for pk, (_, _, amount, captured, fee, released) in figures.items():
        Hold.objects.filter(pk=pk).update(amount=amount, captured=captured,
                                          captured_fee=fee, released=released)


def holds_reduce_many(cuts: list[tuple[int, int, str]]) -> list[int]:
    """hold_reduce of each (hold id, micro-USD to release, cause) of `cuts`, in order: a
    hold may appear several times (cut in turn, as a bid's hold is per fill). Each cut
    with something to release writes one `hold_reduce` entry (memo the cause, reference
    the hold's), the buyer's held balance → available; the holds' `released` and
    `amount` are written by one UPDATE. Returns the micro-USD released per cut.
    ValueError when a cut is negative or beyond what its hold has left, HoldClosed for a
    hold not active; nothing written then."""
    if any(amount < 0 for _, amount, _ in cuts):
        raise ValueError("a cut must not be negative")
    with transaction.atomic():  # a savepoint: a refusal leaves the caller's transaction usable
        locked = _locked_holds([pk for pk, _, _ in cuts])
        entries = []
        for pk, amount, cause in cuts:
            hold = locked[pk]
            if amount > hold.amount:
                raise ValueError(f"cannot reduce hold {pk} from {hold.amount} to "
                                 f"{hold.amount - amount}")
            hold.amount -= amount
            hold.released += amount
            if amount:
                entries.append((JournalEntry.Kind.HOLD_REDUCE,
                                [((Kind.BUYER_HELD, hold.buyer_id), -amount),
                                 ((Kind.BUYER_AVAILABLE, hold.buyer_id), amount)],
                                cause, hold.reference, hold, None))
        if entries:
            _write(entries)
        update_all(list(locked.values()), ["released", "amount"])
    return [amount for _, amount, _ in cuts]
