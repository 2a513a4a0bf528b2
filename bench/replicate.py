"""Bulk setup for the lease-end benches: copy a block of rows the services wrote.

`replicate(copies)` copies every row of the block tables below `copies` times with one
INSERT … SELECT … generate_series per table: copy r of a row has id + r × (the table's
largest id), every reference to a copied table (foreign keys, hold_id, chain ids, the
"lease:<id>"/"order:<id>"/"user:<id>" references of holds and journal entries) moves by
the referenced table's offset, unique texts (username, GPU UUID, node token hash and
uid, idempotency keys) get the copy's number. Shared rows stay single: the GPU classes,
and the ledger accounts without an owner (the platform's, the external dev-credit
account), whose balances then grow by `copies` × their postings in the block, so that
balances still equal the postings (ledger_check). Each copy is therefore one more block
of providers, nodes, GPUs, asks, buyers with their credits, bids, fills, leases, holds,
events, journal entries and postings — the very rows book.place_ask / place_bids wrote,
with other ids. Sequences are moved past the copies; the process's book cache cleared.

Refuses (RuntimeError, nothing written) a block with rows it does not know how to copy
(a sealed bid, an extension, a webhook endpoint, …): every other table must be empty.
"""

from __future__ import annotations

# table → {column: referenced copied table}; the id column always moves by its own table
BLOCK: dict[str, dict[str, str]] = {
    "auth_user": {},
    "providers_provider": {"user_id": "auth_user"},
    "providers_node": {"provider_id": "providers_provider"},
    "providers_gpu": {"node_id": "providers_node", "parent_id": "providers_gpu"},
    "settlement_account": {"owner_id": "auth_user"},
    "settlement_hold": {"buyer_id": "auth_user"},
    "marketplace_order": {"owner_id": "auth_user", "node_id": "providers_node",
                          "hold_id": "settlement_hold", "avoid_node_id": "providers_node",
                          "continues_lease_id": "marketplace_lease"},
    "marketplace_orderevent": {"order_id": "marketplace_order"},
    "marketplace_fill": {"bid_id": "marketplace_order", "ask_id": "marketplace_order"},
    "marketplace_lease": {"buyer_id": "auth_user", "provider_id": "auth_user",
                          "fill_id": "marketplace_fill", "node_id": "providers_node",
                          "ask_id": "marketplace_order", "hold_id": "settlement_hold",
                          "carry_hold_id": "settlement_hold", "chain_id": "marketplace_lease",
                          "continues_id": "marketplace_lease",
                          "preempted_for_id": "marketplace_order"},
    "marketplace_leaseevent": {"lease_id": "marketplace_lease"},
    "marketplace_leasegpu": {"gpu_id": "providers_gpu", "lease_id": "marketplace_lease"},
    "settlement_journalentry": {"hold_id": "settlement_hold"},
    "settlement_posting": {"account_id": "settlement_account",
                           "entry_id": "settlement_journalentry"},
}
# rows that stay single (not copied); references to them stay as they are
SHARED = {"settlement_account": "owner_id IS NULL"}
# tables the block may hold rows of without copying them (catalog, framework)
UNCOPIED = {"marketplace_gpuclass", "django_migrations", "django_content_type",
            "auth_permission"}
# "<prefix>:<id>" references in texts → the table the id belongs to
REFERENCES = {"lease": "marketplace_lease", "order": "marketplace_order",
              "user": "auth_user"}
SUFFIXED = {("auth_user", "username"), ("providers_gpu", "uuid"),
            ("settlement_journalentry", "idempotency_key")}


def _ref_text(col: str, offsets: dict[str, int]) -> str:
    """SQL for `col` ("kind:id") with its id moved by the copy's offset of `kind`'s table."""
    cases = " ".join(
        f"WHEN '{kind}' THEN split_part({col}, ':', 2)::bigint + r * {offsets[table]}"
        for kind, table in REFERENCES.items())
    return (f"CASE WHEN {col} ~ '^[a-z]+:[0-9]+$' THEN split_part({col}, ':', 1) || ':' || "
            f"(CASE split_part({col}, ':', 1) {cases} "
            f"ELSE split_part({col}, ':', 2)::bigint END)::text ELSE {col} END")


def _expr(table: str, col: str, dtype: str, offsets: dict[str, int]) -> str:
    if col == "id":
        return f"id + r * {offsets[table]}"
    target = BLOCK[table].get(col)
    if target is not None:
        moved = f"{col} + r * {offsets[target]}"
        if target in SHARED:  # a shared row keeps its id
            return (f"CASE WHEN {col} IN (SELECT id FROM {target} WHERE {SHARED[target]})"
                    f" THEN {col} ELSE {moved} END")
        return moved
    if (table, col) in SUFFIXED:
        return f"CASE WHEN {col} IS NULL OR {col} = '' THEN {col} ELSE {col} || '-' || r END"
    if table in ("settlement_hold", "settlement_journalentry") and col == "reference":
        return _ref_text(col, offsets)
    if table == "providers_node" and col == "token_hash":
        return f"encode(sha256(convert_to({col} || '-' || r, 'UTF8')), 'hex')"
    if table == "providers_node" and col == "uid":
        return f"md5({col}::text || '-' || r)::uuid"
    if table == "providers_node" and col == "name":
        return f"'bench-' || (id + r * {offsets[table]})"
    return col


def replicate(copies: int) -> dict[str, int]:
    """Copy the block `copies` times (above); returns the rows per table afterwards."""
    from django.db import connection, transaction

    from marketplace.locking import book_cache

    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT table_name FROM information_schema.tables"
                    " WHERE table_schema = 'public' AND table_type = 'BASE TABLE'")
        for (table,) in cur.fetchall():
            if table in BLOCK or table in UNCOPIED:
                continue
            cur.execute(f'SELECT EXISTS (SELECT 1 FROM "{table}")')
            if cur.fetchone()[0]:
                raise RuntimeError(f"replicate: {table} has rows it cannot copy")
        offsets = {}
        for table in BLOCK:
            cur.execute(f"SELECT coalesce(max(id), 0) FROM {table}")
            offsets[table] = cur.fetchone()[0]
        shared_moves = {}
        for table, where in SHARED.items():  # postings of the block on shared accounts
            cur.execute(f"SELECT a.id, coalesce(sum(p.amount), 0) FROM {table} a"
                        f" LEFT JOIN settlement_posting p ON p.account_id = a.id"
                        f" WHERE a.{where} GROUP BY a.id")
            shared_moves[table] = cur.fetchall()
        for table in BLOCK:
            cur.execute("SELECT column_name, data_type FROM information_schema.columns"
                        " WHERE table_schema = 'public' AND table_name = %s"
                        " ORDER BY ordinal_position", [table])
            cols = cur.fetchall()
            names = ", ".join(f'"{c}"' for c, _ in cols)
            exprs = ", ".join(_expr(table, c, t, offsets) for c, t in cols)
            where = f"WHERE NOT ({SHARED[table]})" if table in SHARED else ""
            cur.execute(f"INSERT INTO {table} ({names}) SELECT {exprs} FROM {table}"
                        f" CROSS JOIN generate_series(1, %s) AS r {where}", [copies])
        for table, moves in shared_moves.items():
            for pk, amount in moves:
                cur.execute(f"UPDATE {table} SET balance = balance + %s WHERE id = %s",
                            [amount * copies, pk])
        counts = {}
        for table in BLOCK:
            cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'),"
                        f" greatest(1, (SELECT max(id) FROM {table})))")
            cur.execute(f"SELECT count(*) FROM {table}")
            counts[table] = cur.fetchone()[0]
    book_cache.clear()
    return counts
