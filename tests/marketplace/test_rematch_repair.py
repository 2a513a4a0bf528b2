"""A worker that dies between a batch of lease ends and its re-match (docs/MATCHING.md,
"GPUs back from a batch of lease ends"): the asks' pending re-match is on record
(RematchDue, written with the returned GPUs), and the beat's repair sweep runs it once
it is GPUMARKET_REMATCH_REPAIR_SECONDS old. The death is simulated by the re-match
raising where the worker would have stopped (a real SIGKILL lands anywhere: this test
puts it in the one gap)."""

from datetime import timedelta

import pytest
from django.conf import settings

from marketplace import fills_many, tasks
from marketplace.lease_end import end_leases_batch
from marketplace.models import Lease, Order, RematchDue
from settlement.checks import first_violation
from tests.marketplace.test_lease_end_many import CAUSE, _market_with_running_leases

pytestmark = pytest.mark.django_db


class WorkerDied(BaseException):
    """What the worker's SIGKILL is to the code after the last commit: nothing more runs."""


def _ended_without_rematch(monkeypatch):
    ids, ask_ids, rest_ids = _market_with_running_leases()
    market_id = Lease.objects.get(pk=ids[0]).market_id
    now = Lease.objects.get(pk=ids[0]).started_at + timedelta(hours=1, minutes=2)

    def died(**_kwargs):
        raise WorkerDied

    with monkeypatch.context() as patched:
        patched.setattr(fills_many, "rematch_returned", died)
        with pytest.raises(WorkerDied):
            end_leases_batch(market_id=market_id, lease_ids=ids, status="completed",
                             cause=CAUSE, now=now)
    return ids, ask_ids, rest_ids, now


def test_the_repair_sweep_runs_a_rematch_a_dead_worker_skipped(monkeypatch):
    ids, ask_ids, rest_ids, now = _ended_without_rematch(monkeypatch)
    assert set(Lease.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"completed"}
    # the GPUs are back on their asks, the resting bids still wait: the gap
    assert [Order.objects.values_list("remaining_gpus", flat=True).get(pk=pk)
            for pk in ask_ids] == [4, 2]
    assert [Order.objects.values_list("status", flat=True).get(pk=pk)
            for pk in rest_ids] == ["open", "open"]
    assert sorted(RematchDue.objects.values_list("ask_id", flat=True)) == sorted(ask_ids)

    wait = settings.GPUMARKET_REMATCH_REPAIR_SECONDS
    # not yet: a live worker's re-match may still be on its way
    assert fills_many.repair_rematches(now + timedelta(seconds=wait - 1)) == []
    assert RematchDue.objects.count() == 2

    made = fills_many.repair_rematches(now + timedelta(seconds=wait))
    assert sorted(lease.gpu_count for lease in made) == [1, 3]
    assert sorted(lease.fill.bid_id for lease in made) == sorted(rest_ids)
    assert [Order.objects.values_list("status", flat=True).get(pk=pk)
            for pk in rest_ids] == ["filled", "filled"]
    assert sum(Order.objects.values_list("remaining_gpus", flat=True).get(pk=pk)
               for pk in ask_ids) == 6 - 4
    assert not RematchDue.objects.exists()
    assert fills_many.repair_rematches(now + timedelta(seconds=wait + 60)) == []  # once
    assert first_violation() is None


def test_a_batch_that_rematches_leaves_nothing_to_repair():
    ids, _ask_ids, rest_ids = _market_with_running_leases()
    market_id = Lease.objects.get(pk=ids[0]).market_id
    now = Lease.objects.get(pk=ids[0]).started_at + timedelta(hours=1, minutes=2)
    end_leases_batch(market_id=market_id, lease_ids=ids, status="completed", cause=CAUSE,
                     now=now)
    assert [Order.objects.values_list("status", flat=True).get(pk=pk)
            for pk in rest_ids] == ["filled", "filled"]
    assert not RematchDue.objects.exists()


def test_the_beat_runs_the_repair_on_the_leases_queue():
    entry = settings.CELERY_BEAT_SCHEDULE["repair-rematches"]
    assert entry["task"] == tasks.repair_rematches.name
    assert settings.GPUMARKET_CELERY_QUEUE_OF_TASK[entry["task"]] == "leases"
    assert tasks.repair_rematches() == []  # nothing on record: nothing done
