"""The account rows settlement.services locks, read set-based: by (kind, owners) and by
id, each kind's owners or the ids one array bound server-side on PostgreSQL (`= ANY`),
the ORM elsewhere. Why: bench/README.md "Sealed close" (an IN list of 10,000–20,000 ids
rendered and parsed client-side cost more than the statement)."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Q

from core.bulk import execute_arrays
from settlement.models import Account


def find_accounts(owners: dict[str, set[int | None]]) -> list[tuple[int, str, int | None]]:
    """(id, kind, owner id) of the existing accounts of each kind's owners (None: the
    platform's), one term per kind. On PostgreSQL each kind's owners are one array bound
    server-side (`= ANY`): an IN list of 10,000 owners costs ~0.5 s of CPU to render."""
    connection = transaction.get_connection()
    if connection.vendor != "postgresql":
        q = Q(pk__in=[])
        for kind, of in owners.items():
            named = sorted(o for o in of if o is not None)
            if named:
                q |= Q(kind=kind, owner_id__in=named)
            if None in of:
                q |= Q(kind=kind, owner__isnull=True)
        return list(Account.objects.filter(q).values_list("pk", "kind", "owner_id"))
    terms, params = [], []
    for kind, of in owners.items():
        named = sorted(o for o in of if o is not None)
        if named:
            terms.append("(kind = %s AND owner_id = ANY(%s::bigint[]))")
            params += [kind, named]
        if None in of:
            terms.append("(kind = %s AND owner_id IS NULL)")
            params.append(kind)
    where = " OR ".join(terms)  # fixed terms; every value is a parameter
    sql = f"SELECT id, kind, owner_id FROM settlement_account WHERE {where}"  # noqa: S608
    return execute_arrays(connection, sql, params)


def locked_account_rows(ids: list[int]) -> list[tuple[int, str, int | None, int, bool]]:
    """(id, kind, owner id, balance, allow_negative) of the accounts `ids`, locked in id
    order (SELECT … FOR UPDATE); the ids one array on PostgreSQL (as find_accounts)."""
    connection = transaction.get_connection()
    if connection.vendor != "postgresql":
        return list(Account.objects.select_for_update().filter(pk__in=ids).order_by("pk")
                    .values_list("pk", "kind", "owner_id", "balance", "allow_negative"))
    return execute_arrays(connection, "SELECT id, kind, owner_id, balance, allow_negative "
                          "FROM settlement_account WHERE id = ANY(%s::bigint[]) "
                          "ORDER BY id FOR UPDATE", [ids])
