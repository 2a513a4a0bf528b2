from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from settlement.checks import CHECKS


def _pending_migrations() -> int:
    """How many migrations the default database still lacks. Raises CommandError when the
    database cannot be reached."""
    connection = connections[DEFAULT_DB_ALIAS]
    # a one-shot command needs no pool (GPUMARKET_DB_POOL), and without one an unreachable
    # server is named by its own error, not by the pool's timeout and retry warnings
    # (only before this process's first connection: called from code that is already
    # connected, e.g. a test, it leaves the process's pool as it is)
    if connection.connection is None and not connection.in_atomic_block:
        connection.settings_dict.get("OPTIONS", {}).pop("pool", None)
    try:
        connection.ensure_connection()
        executor = MigrationExecutor(connection)
        return len(executor.migration_plan(executor.loader.graph.leaf_nodes()))
    except DatabaseError as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CommandError(f"cannot connect to the database: {reason}") from None


class Command(BaseCommand):
    help = "Verify the ledger's invariants; exit non-zero naming the first violation."

    def handle(self, *args, **options):
        pending = _pending_migrations()
        if pending:
            raise CommandError(f"the database is not migrated ({pending} migrations "
                               "missing): run `manage.py migrate` first")
        for check in CHECKS:
            problem = check()
            if problem:
                raise CommandError(f"{check.__name__}: {problem}")
            self.stdout.write(f"ok  {check.__name__}: {' '.join(check.__doc__.split())}")
        self.stdout.write(self.style.SUCCESS("ledger is consistent"))
