"""The buyer's wallet history: every journal entry of their wallet, newest first, with
running balances (available, held), paged and filtered by kind, and the same rows as
CSV. Rows come from settlement/selectors.py, as the API's /api/v1/wallet/history/."""

from __future__ import annotations

import csv

from django.core.paginator import Paginator
from django.http import HttpResponse, StreamingHttpResponse

from frontend.views import _page, member
from settlement import selectors
from settlement import services as ledger
from settlement.money import format_usd

PER_PAGE = 50
CSV_COLUMNS = ["entry", "created_at", "kind", "description", "reference", "available",
               "held", "owed", "available_after", "held_after", "owed_after"]
FILTERS = [("", "all"), ("topup", "top-ups"), ("credit", "credits"), ("hold", "holds"),
           ("charge", "lease charges"), ("refund", "refunds and disputes")]


@member
def wallet_history(request):
    group = request.GET.get("kind", "")
    try:
        history = selectors.wallet_history(user_id=request.user.pk, group=group)
    except selectors.UnknownKind as exc:
        return _page(request, "frontend/wallet_history.html", {
            "error": f"kind: {exc}", "filters": FILTERS, "kind": ""}, status=400)
    available, held, owed = history.totals()  # and the count, in one query
    page = Paginator(history, PER_PAGE).get_page(request.GET.get("page"))
    w = ledger.wallet(user_id=request.user.pk)
    return _page(request, "frontend/wallet_history.html", {
        "page": page, "rows": page.object_list, "filters": FILTERS, "kind": group,
        "totals": {"available": available, "held": held, "owed": owed},
        "balances": {"available": w.available, "held": w.held},
        "count": history.count(),
    })


class _Echo:
    def write(self, value: str) -> str:
        return value


@member
def wallet_history_csv(request):
    """All rows (the `kind` filter applies), amounts as 6-place USD strings."""
    try:
        history = selectors.wallet_history(user_id=request.user.pk,
                                           group=request.GET.get("kind", ""))
    except selectors.UnknownKind as exc:
        return HttpResponse(f"kind: {exc}\n", status=400, content_type="text/plain")
    writer = csv.writer(_Echo())

    def lines():
        yield writer.writerow(CSV_COLUMNS)
        for r in history:
            yield writer.writerow([
                r.entry_id, r.created_at.isoformat(), r.kind, r.words, r.reference,
                *(format_usd(x) for x in (r.available, r.held, r.owed, r.available_after,
                                          r.held_after, r.owed_after))])

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="wallet-history.csv"'
    return response
