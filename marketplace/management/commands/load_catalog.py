"""`manage.py load_catalog`: (re)load the GPU class catalog and its MIG slice markets, and
move registered whole GPUs whose product name now maps to another class — what migration
0012 does, re-runnable after a catalog change (docs/CATALOG.md)."""

from django.core.management.base import BaseCommand
from django.db import transaction

from marketplace.catalog import load_catalog, reclassify_gpus
from marketplace.models import GpuClass, LeaseGpu, Order
from providers.models import Gpu


class Command(BaseCommand):
    help = "Load the GPU class catalog and move GPUs whose class changed."

    def handle(self, *args, **options):
        with transaction.atomic():
            classes = load_catalog(GpuClass)
            moved, kept = reclassify_gpus(Gpu, Order, LeaseGpu, GpuClass)
        self.stdout.write(f"{classes} GPU classes loaded; {moved} GPU(s) moved to their class")
        if kept:
            self.stdout.write(f"{len(kept)} GPU(s) kept in their old class while an ask or a "
                              f"lease holds them (run again later): {', '.join(kept)}")
