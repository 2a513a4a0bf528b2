"""Read-only ledger queries for pages and the API: a buyer's wallet history.

Called with user ids (settlement imports nothing of the market). Amounts are integer
micro-USD. A history row is one journal entry that touches the buyer's own wallet
accounts (available, held, owed), with what it changed on each and the running balances
after it, computed over all of the buyer's entries (a kind filter hides rows, never
changes the balances shown on the others). Newest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from settlement.models import Account, JournalEntry, Posting

Kind = Account.Kind
EntryKind = JournalEntry.Kind

# the wallet accounts a buyer's history follows
WALLET_KINDS = (Kind.BUYER_AVAILABLE, Kind.BUYER_HELD, Kind.BUYER_DEBT)

# `?kind=` filter: a word people use → the journal entry kinds it covers
KIND_GROUPS: dict[str, tuple[str, ...]] = {
    "topup": (EntryKind.STRIPE_TOPUP, EntryKind.CHAIN_DEPOSIT),
    "credit": (EntryKind.DEV_CREDIT,),
    "hold": (EntryKind.HOLD_PLACE, EntryKind.HOLD_RELEASE, EntryKind.HOLD_REDUCE),
    "charge": (EntryKind.LEASE_SETTLE, EntryKind.LEASE_METER),
    "refund": (EntryKind.STRIPE_REFUND, EntryKind.STRIPE_DISPUTE,
               EntryKind.STRIPE_DISPUTE_REINSTATED),
}

# what a buyer reads for each entry kind
ENTRY_WORDS: dict[str, str] = {
    EntryKind.DEV_CREDIT: "credit",
    EntryKind.STRIPE_TOPUP: "top-up (card)",
    EntryKind.CHAIN_DEPOSIT: "deposit (on chain)",
    EntryKind.HOLD_PLACE: "hold placed",
    EntryKind.HOLD_RELEASE: "hold released",
    EntryKind.HOLD_REDUCE: "hold reduced",
    EntryKind.LEASE_SETTLE: "lease charged",
    EntryKind.LEASE_METER: "lease charged (period)",
    EntryKind.STRIPE_REFUND: "refund",
    EntryKind.STRIPE_DISPUTE: "dispute (funds withdrawn)",
    EntryKind.STRIPE_DISPUTE_REINSTATED: "dispute won (funds back)",
}


class UnknownKind(ValueError):
    """A `kind` filter that is none of KIND_GROUPS; the message names the choices."""

    field = "kind"


def kinds_for(group: str | None) -> tuple[str, ...] | None:
    """The entry kinds of a `?kind=` word; None (no filter) for None or "".
    Raises UnknownKind."""
    if not group:
        return None
    if group not in KIND_GROUPS:
        raise UnknownKind(f"must be one of {', '.join(KIND_GROUPS)}")
    return KIND_GROUPS[group]


@dataclass(frozen=True)
class HistoryRow:
    entry_id: int
    created_at: datetime
    kind: str            # JournalEntry.Kind value
    reference: str       # "order:12", "lease:7", "payment_intent:pi_…"
    memo: str
    available: int       # change of the available balance (micro-USD, signed)
    held: int            # change of the held balance
    owed: int            # change of the owed (debt) account; negative: owes more
    available_after: int  # running balances after this entry
    held_after: int
    owed_after: int

    @property
    def words(self) -> str:
        return ENTRY_WORDS.get(self.kind, self.kind.replace("_", " "))


def _sql(select: str, *, kinds: tuple[str, ...] | None) -> str:
    """The history query ending in `select` (over `running`; "{where}" in it takes the
    kind filter). Parameters: see WalletHistory._params."""
    p, a, e = (m._meta.db_table for m in (Posting, Account, JournalEntry))
    where = ""
    if kinds:
        where = f"WHERE kind IN ({', '.join(['%s'] * len(kinds))})"
    sql = f"""
      WITH per_entry AS (
        SELECT e.id, e.created_at, e.kind, e.reference, e.memo,
               SUM(CASE WHEN a.kind = %s THEN p.amount ELSE 0 END) AS available,
               SUM(CASE WHEN a.kind = %s THEN p.amount ELSE 0 END) AS held,
               SUM(CASE WHEN a.kind = %s THEN p.amount ELSE 0 END) AS owed
        FROM {p} p JOIN {a} a ON a.id = p.account_id JOIN {e} e ON e.id = p.entry_id
        WHERE a.owner_id = %s AND a.kind IN (%s, %s, %s)
        GROUP BY e.id, e.created_at, e.kind, e.reference, e.memo
      ), running AS (
        SELECT per_entry.*,
               SUM(available) OVER (ORDER BY id) AS available_after,
               SUM(held) OVER (ORDER BY id) AS held_after,
               SUM(owed) OVER (ORDER BY id) AS owed_after
        FROM per_entry
      )
      {select.format(where=where)}"""  # noqa: S608 (table names and placeholders only)
    return sql


class WalletHistory:
    """A buyer's history rows, newest first, lazily read: `len()`/`count()` and slices
    (`history[0:50]`) each run one query, so DRF's pagination and the page's paging read
    only the rows they show."""

    def __init__(self, *, user_id: int, kinds: tuple[str, ...] | None = None) -> None:
        self.user_id, self.kinds = user_id, kinds
        self._count: int | None = None

    def _params(self) -> list:
        return [Kind.BUYER_AVAILABLE, Kind.BUYER_HELD, Kind.BUYER_DEBT, self.user_id,
                *WALLET_KINDS, *(self.kinds or ())]

    def count(self) -> int:
        if self._count is None:
            sql = _sql("SELECT COUNT(*) FROM running {where}", kinds=self.kinds)
            with connection.cursor() as cur:
                cur.execute(sql, self._params())
                self._count = cur.fetchone()[0]
        return self._count

    __len__ = count

    def totals(self) -> tuple[int, int, int]:
        """(available, held, owed): the sums of these rows' changes, micro-USD. Unfiltered,
        they are the wallet's balances (the ledger's accounts). The same query counts the
        rows (count() then reads no more)."""
        sql = _sql("SELECT COALESCE(SUM(available), 0), COALESCE(SUM(held), 0), "
                   "COALESCE(SUM(owed), 0), COUNT(*) FROM running {where}", kinds=self.kinds)
        with connection.cursor() as cur:
            cur.execute(sql, self._params())
            available, held, owed, self._count = (int(x) for x in cur.fetchone())
            return available, held, owed

    def __getitem__(self, item: slice) -> list[HistoryRow]:
        if not isinstance(item, slice) or item.step not in (None, 1):
            raise TypeError("WalletHistory takes slices only")
        start = max(0, int(item.start or 0))
        limit = 10**18 if item.stop is None else max(0, int(item.stop) - start)
        sql = _sql("SELECT id, created_at, kind, reference, memo, available, held, owed, "
                   "available_after, held_after, owed_after FROM running {where} "
                   "ORDER BY id DESC LIMIT %s OFFSET %s", kinds=self.kinds)
        with connection.cursor() as cur:
            cur.execute(sql, [*self._params(), limit, start])
            return [_row(r) for r in cur.fetchall()]

    def __iter__(self):
        """Every row, newest first, from one query (one consistent read: the CSV)."""
        sql = _sql("SELECT id, created_at, kind, reference, memo, available, held, owed, "
                   "available_after, held_after, owed_after FROM running {where} "
                   "ORDER BY id DESC", kinds=self.kinds)
        with connection.cursor() as cur:
            cur.execute(sql, self._params())
            while batch := cur.fetchmany(1000):
                yield from (_row(r) for r in batch)


def _row(r) -> HistoryRow:
    created = r[1] if isinstance(r[1], datetime) else parse_datetime(str(r[1]))
    if timezone.is_naive(created):  # SQLite (the demo) gives naive UTC text
        created = timezone.make_aware(created, UTC)
    return HistoryRow(entry_id=r[0], created_at=created, kind=r[2], reference=r[3],
                      memo=r[4], available=int(r[5]), held=int(r[6]), owed=int(r[7]),
                      available_after=int(r[8]), held_after=int(r[9]),
                      owed_after=int(r[10]))


def wallet_history(*, user_id: int, group: str | None = None) -> WalletHistory:
    """The buyer's history, optionally only the entries of one KIND_GROUPS word.
    Raises UnknownKind."""
    return WalletHistory(user_id=user_id, kinds=kinds_for(group))
