from django.core.management.base import BaseCommand, CommandError

from settlement.checks import CHECKS


class Command(BaseCommand):
    help = "Verify the ledger's invariants; exit non-zero naming the first violation."

    def handle(self, *args, **options):
        for check in CHECKS:
            problem = check()
            if problem:
                raise CommandError(f"{check.__name__}: {problem}")
            self.stdout.write(f"ok  {check.__name__}: {check.__doc__.strip()}")
        self.stdout.write(self.style.SUCCESS("ledger is consistent"))
