"""Tell a node's runner, after commit, that its lease list changed (providers/push.py).

A post_save receiver on Lease: a lease created, a state change (`set_status` saves
`status`), a preemption deadline set or called off (`preempt_at`), a notice given or
withdrawn (`notice_deadline`: marketplace/lease_notice.py), or an extension by its
buyer (`ends_at`, `duration_seconds`: marketplace/lease_control.py) notes the lease's
node in the current transaction; the notice goes out once it commits. Other saves (none
today) send nothing. Connected in MarketplaceConfig.ready(), so web processes and Celery
workers (preemption, silent nodes, overdue leases) all notify.
"""

from __future__ import annotations

from django.db.models.signals import post_save

from providers import push

DISPATCH_UID = "gpumarket.runner_push.Lease"
WATCHED = frozenset({"status", "preempt_at", "ends_at", "duration_seconds",
                     "notice_deadline"})


def _lease_saved(sender, instance, created, update_fields=None, **kwargs) -> None:
    if created or update_fields is None or WATCHED & set(update_fields):
        push.leases_changed(instance.node_id)


def connect() -> None:
    from marketplace.models import Lease

    post_save.connect(_lease_saved, sender=Lease, weak=False, dispatch_uid=DISPATCH_UID)
