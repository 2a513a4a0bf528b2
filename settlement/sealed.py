"""Which holds are sealed: their amounts would reveal a sealed bid's price × quantity.

settlement imports nothing of the market, so the market registers a source at start-up
(`marketplace.apps`): a callable answering a queryset of the sealed holds' ids, e.g.
`SealedBid.objects.filter(…).values("hold_id")`. The admin masks the amounts of those
holds, of their journal entries' postings, and the wallet balances of a buyer while one
of its sealed holds is active.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db.models import Q, QuerySet

_sources: list[Callable[[], QuerySet]] = []


def register(source: Callable[[], QuerySet]) -> None:
    """Add a source of sealed hold ids (a queryset of one column of Hold ids). Idempotent."""
    if source not in _sources:
        _sources.append(source)


def sealed_holds_q(path: str = "pk") -> Q:
    """A Q matching rows whose `path` (a Hold id: "pk" on Hold, "hold" on JournalEntry,
    "entry__hold" on Posting) is a sealed hold; matches nothing when no source is
    registered."""
    q = Q(pk__in=[])
    for i, source in enumerate(_sources):
        here = Q(**{f"{path}__in": source()})
        q = here if i == 0 else q | here
    return q
