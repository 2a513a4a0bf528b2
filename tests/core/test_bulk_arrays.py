"""core.bulk's array helpers on PostgreSQL: list parameters sent binary, rows inserted
column-wise (refused, nothing written, when a field is missing), rows read by one array."""

import pytest
from django.db import connection, transaction
from django.utils import timezone

from core.bulk import (
    _Int8Array,
    _lists_binary,
    _packed_bigints,
    execute_arrays,
    insert_columns,
    select_by_ids,
)
from settlement import services as ledger
from settlement.models import Hold, JournalEntry, Posting
from tests.factories import funded_buyer

pytestmark = pytest.mark.django_db


def test_only_list_parameters_are_made_binary():
    sql = "SELECT %s, %%s, unnest(%s::text[]), %s"
    assert _lists_binary(sql, ["a", ["b", None], 3]) == "SELECT %s, %%s, unnest(%b::text[]), %s"
    rows = execute_arrays(connection, "SELECT %s::text, u FROM unnest(%s::text[]) AS u",
                          ["x", ["é'\"", None, ""]])
    assert rows == [("x", "é'\""), ("x", None), ("x", "")]


def test_bigint_arrays_are_packed_and_read_back_exactly():
    values = [0, 1, -1, 2**63 - 1, -(2**63), 2_490_001, 10**12]
    sql = "SELECT u FROM unnest(%s::bigint[]) WITH ORDINALITY AS t(u, n) ORDER BY n"
    assert isinstance(_packed_bigints(sql, [values])[0], _Int8Array)  # the packed path
    assert [r[0] for r in execute_arrays(connection, sql, [values])] == values
    # a None, or a list bound as another type, goes through psycopg's own dumper
    assert [r[0] for r in execute_arrays(connection, sql, [[5, None]])] == [5, None]
    assert execute_arrays(connection, "SELECT '%%', %s::bigint[], %s::text[], %s::bigint[]",
                          [[], ["a"], [7]]) == [("%", [], ["a"], [7])]


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


@pytest.mark.ledger("ledger_only")  # a hold without a bid: the ledger's own checks only
def test_insert_columns_returning_gives_the_ids_in_the_order_of_the_rows():
    buyer = funded_buyer(10)
    hold = ledger.hold_place(buyer_id=buyer.pk, amount=1000, reference="t:r")
    with transaction.atomic():
        refs = [f"r:{i}" for i in (3, 1, 2)]
        ids = insert_columns(JournalEntry, {
            "kind": ["lease_meter"] * 3, "memo": ["m"] * 3, "hold_id": [hold.pk] * 3,
            "reference": refs, "idempotency_key": [f"k:{r}" for r in refs],
            "evidence": [""] * 3, "created_at": [timezone.now()] * 3}, returning=True)
        assert [JournalEntry.objects.get(pk=pk).reference for pk in ids] == refs
        assert ids == sorted(ids)
        assert insert_columns(Posting, {"entry_id": [], "account_id": [], "amount": []},
                              returning=True) == []
        transaction.set_rollback(True)


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
