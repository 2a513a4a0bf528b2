"""Statements bound on the server (issue 17): `cursor()` is a Django cursor on the default
connection whose psycopg cursor sends the values apart from the SQL text (the extended
protocol), where Django's default psycopg cursor binds on the client, quoting every value
into the text: for a statement with long arrays (a heartbeat group's write) that quoting
was most of the web process's CPU for the statement (bench/README.md, "Heartbeats at
fleet scale").

Never prepared (an unnamed statement each time, as Django's own are: psycopg's
prepare_threshold is None), so a PgBouncer in transaction mode carries it
(tests/test_pgbouncer.py). Use it for statements whose text is the same whatever the
number of rows (arrays, unnest). Elsewhere than PostgreSQL: Django's own cursor. Errors
are Django's (wrapped), queries logged as Django's (CaptureQueriesContext sees them).
"""

from __future__ import annotations

import psycopg
from django.db import connection


def cursor():
    """A cursor (use as a context manager) binding on the server, as the module says."""
    if connection.vendor != "postgresql":
        return connection.cursor()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = psycopg.Cursor(connection.connection)
    if connection.queries_logged:
        return connection.make_debug_cursor(raw)
    return connection.make_cursor(raw)
