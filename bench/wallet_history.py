"""Wallet history reads (settlement/selectors.py) over one buyer with many entries.

    DATABASE_URL=postgres://… .venv/bin/python bench/wallet_history.py [ENTRIES]

Writes ENTRIES journal entries (default 20,000: holds placed and released in turns, in
bulk) for one new buyer inside a transaction that is rolled back at the end, then
times, best of 5: the count, the totals, the first page (50 rows), the last page, and
the whole CSV iteration. Prints one line per read in milliseconds.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "marketplace.settings")

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.db import transaction  # noqa: E402

from settlement import selectors  # noqa: E402
from settlement import services as ledger  # noqa: E402
from settlement.models import Account, JournalEntry, Posting  # noqa: E402

Kind = Account.Kind


class Rollback(Exception):
    pass


def best(fn, n: int = 5) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1000


def _write(user_id: int, entries: int) -> None:
    """`entries` balanced entries in bulk (holds placed and released in turns, each moving
    1.234567 USD between the buyer's available and held accounts); the reads below sum
    postings, so the accounts' cached balances are left as they are (rolled back)."""
    available = ledger.account(Kind.BUYER_AVAILABLE, user_id)
    held = ledger.account(Kind.BUYER_HELD, user_id)
    kinds = [JournalEntry.Kind.HOLD_PLACE, JournalEntry.Kind.HOLD_RELEASE]
    rows = JournalEntry.objects.bulk_create(
        JournalEntry(kind=kinds[i % 2], reference="order:bench") for i in range(entries))
    postings = []
    for i, e in enumerate(rows):
        sign = -1 if i % 2 == 0 else 1
        postings += [Posting(entry=e, account=available, amount=sign * 1_234_567),
                     Posting(entry=e, account=held, amount=-sign * 1_234_567)]
    Posting.objects.bulk_create(postings, batch_size=5000)


def main() -> None:
    entries = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    try:
        with transaction.atomic():
            user = get_user_model().objects.create(username=f"bench-history-{time.time_ns()}")
            _write(user.pk, entries)
            history = selectors.wallet_history(user_id=user.pk)
            n = history.count()
            print(f"wallet history of one buyer with {n} entries ({os.cpu_count()} CPUs, "
                  f"load {os.getloadavg()[0]:.2f})")
            for name, fn in [
                ("count", lambda: selectors.wallet_history(user_id=user.pk).count()),
                ("totals", lambda: history.totals()),
                ("first page (50)", lambda: history[0:50]),
                ("last page (50)", lambda: history[n - 50:n]),
                ("hold filter, first page", lambda: selectors.wallet_history(
                    user_id=user.pk, group="hold")[0:50]),
                ("whole CSV rows", lambda: sum(1 for _ in history)),
            ]:
                print(f"{name:>26}: {best(fn):8.1f} ms")
            raise Rollback
    except Rollback:
        pass


if __name__ == "__main__":
    main()
