"""The benches drop and re-create their databases: only ones a bench created (marked by a
COMMENT), never a database of the user's (`--db gpumarket` refused, nothing dropped)."""

from __future__ import annotations

import os
import uuid

import psycopg
import pytest

from bench.api_orders import drop_bench_database, fresh_database

PG = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/x").rsplit("/", 1)[0]


def _exists(conn, name: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() \
        is not None


@pytest.mark.skipif(not PG.startswith("postgres"), reason="needs PostgreSQL")
def test_a_bench_recreates_its_own_database_and_refuses_anyone_elses():
    mine, theirs = f"gpumarket_bench_t_{uuid.uuid4().hex[:8]}", f"t_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        try:
            assert fresh_database(PG, mine) == f"{PG}/{mine}"
            with psycopg.connect(f"{PG}/{mine}", autocommit=True) as db:
                db.execute("CREATE TABLE left_over (x int)")
            fresh_database(PG, mine)  # dropped and made again: the table is gone
            with psycopg.connect(f"{PG}/{mine}", autocommit=True) as db:
                assert db.execute("SELECT to_regclass('left_over')").fetchone() == (None,)

            conn.execute(f'CREATE DATABASE "{theirs}"')
            with pytest.raises(SystemExit, match=f"database '{theirs}' exists and was not "
                                                 "created by a bench; not dropping it"):
                fresh_database(PG, theirs)
            assert _exists(conn, theirs)
        finally:
            drop_bench_database(conn, mine)
            conn.execute(f'DROP DATABASE IF EXISTS "{theirs}"')
        assert not _exists(conn, mine)
