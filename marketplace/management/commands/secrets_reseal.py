"""`manage.py secrets_reseal`: seal every stored secret again under the first key of
GPUMARKET_SECRETS_KEY (rotation, docs/SECRETS.md). Prints counts only, never a value."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from marketplace.models import Lease, Order, SealedBid
from marketplace.sealing import Unsealable, reseal
from webhooks.models import WebhookEndpoint

COLUMNS = [(Order, "secrets_sealed"), (SealedBid, "secrets_sealed"),
           (Lease, "secrets_sealed"), (Lease, "jupyter_token_sealed"),
           (Order, "checkpoint_sealed"), (SealedBid, "checkpoint_sealed"),
           (Lease, "checkpoint_sealed"), (WebhookEndpoint, "secret_sealed")]


class Command(BaseCommand):
    help = ("Re-seal bids' and leases' secrets, Jupyter tokens and webhook signing secrets "
            "under the first key of "
            "GPUMARKET_SECRETS_KEY; then the old keys may be removed.")

    def handle(self, *args, **options):
        failed = 0
        for model, column in COLUMNS:
            done = 0
            rows = model.objects.exclude(**{column: ""}).values_list("pk", flat=True)
            for pk in rows.iterator():
                with transaction.atomic():
                    row = model.objects.select_for_update().only(column).get(pk=pk)
                    try:
                        setattr(row, column, reseal(getattr(row, column)))
                    except Unsealable:
                        failed += 1
                        self.stderr.write(f"{model.__name__} {pk}: {column} cannot be opened "
                                          "with any configured key; left as it is")
                        continue
                    row.save(update_fields=[column])
                    done += 1
            self.stdout.write(f"{model.__name__}.{column}: {done} re-sealed")
        if failed:
            raise CommandError(f"{failed} values could not be opened (see above)")
