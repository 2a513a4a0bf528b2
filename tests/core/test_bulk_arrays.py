"""core.bulk's array helpers on PostgreSQL: list parameters sent binary, rows inserted
column-wise (refused, nothing written, when a field is missing), rows read by one array."""

import pytest
from django.db import connection, transaction

from core.bulk import _lists_binary, execute_arrays, insert_columns, select_by_ids
from settlement import services as ledger
from settlement.models import Hold, Posting
from tests.factories import funded_buyer

pytestmark = pytest.mark.django_db


def test_only_list_parameters_are_made_binary():
    sql = "SELECT %s, %%s, unnest(%s::text[]), %s"
    assert _lists_binary(sql, ["a", ["b", None], 3]) == "SELECT %s, %%s, unnest(%b::text[]), %s"
    rows = execute_arrays(connection, "SELECT %s::text, u FROM unnest(%s::text[]) AS u",
                          ["x", ["é'\"", None, ""]])
    assert rows == [("x", "é'\""), ("x", None), ("x", "")]


def test_insert_columns_writes_the_rows_and_refuses_a_missing_field():
    buyer = funded_buyer(10)
    entry = ledger.dev_credit(user_id=buyer.pk, amount=1)
    accounts = sorted(entry.postings.values_list("account_id", flat=True))
    before = Posting.objects.count()
    with pytest.raises(ValueError, match="not its fields"):
        insert_columns(Posting, {"entry_id": [entry.pk], "amount": [5]})
    with pytest.raises(ValueError, match="different lengths"):
        insert_columns(Posting, {"entry_id": [entry.pk], "account_id": accounts,
                                 "amount": [5, -5]})
    assert Posting.objects.count() == before
    with transaction.atomic():
        insert_columns(Posting, {"entry_id": [entry.pk] * 2, "account_id": accounts,
                                 "amount": [7, -7]})
        assert sorted(Posting.objects.filter(entry=entry, amount__in=[7, -7])
                      .values_list("account_id", "amount")) == sorted(
            zip(accounts, [7, -7], strict=True))
        transaction.set_rollback(True)  # the ledger stays balanced


def test_select_by_ids_reads_instances_in_key_order():
    buyer = funded_buyer(10)
    holds = [ledger.hold_place(buyer_id=buyer.pk, amount=1000 + i, reference=f"t:{i}")
             for i in range(3)]
    with transaction.atomic():
        got = select_by_ids(Hold, [holds[2].pk, holds[0].pk, 10**12], for_update=True)
    assert [(h.pk, h.amount, h.reference, h.created_at) for h in got] == [
        (h.pk, h.amount, h.reference, h.created_at) for h in (holds[0], holds[2])]
    for h in holds:  # a hold must secure something once the test ends
        ledger.hold_release(hold_id=h.pk, cause="test over")
