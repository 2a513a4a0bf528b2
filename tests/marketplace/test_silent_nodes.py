"""Missed heartbeats: a silent node's leases fail with a clear cause, the buyer pays only
up to the last heartbeat, the node's GPUs leave its asks and come back when it speaks."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace import book
from marketplace.health import fail_silent_nodes
from marketplace.leases import mark_running
from marketplace.models import Lease, Order
from providers.models import Node
from settlement.checks import first_violation
from settlement.money import lease_cost
from tests.factories import RTX4090_DUMP, funded_buyer, in_a_day, registered_node

pytestmark = pytest.mark.django_db

PRICE = 2_000_000


def _leases(node_name="node-1", dump=None, leases=1):
    kwargs = {"dump": dump} if dump else {}
    provider, node, token = registered_node(name=node_name, **kwargs)
    slug = node.gpus.first().gpu_class.slug
    buyer = funded_buyer(1000)
    ask = book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                         price=PRICE, gpus=8, available_until=in_a_day()).order
    made = []
    for _ in range(leases):
        made += book.place_bid(buyer_id=buyer.pk, market_slug=slug, price=PRICE, gpus=2,
                               duration_seconds=3600).leases
    return node, token, buyer, ask, made


def _heard_at(node, moment):
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=moment)


def test_silent_node_fails_its_leases_charging_up_to_the_last_heartbeat(settings):
    settings.GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS = 90
    node, _, _, ask, (running, pending) = _leases(leases=2)
    now = timezone.now()
    running = mark_running(lease=running, container_id="c" * 64,
                           now=now - timedelta(seconds=1000))
    last = now - timedelta(seconds=400)  # 600 s served, then silence
    _heard_at(node, last)

    failed = fail_silent_nodes(now=now)

    assert sorted(failed) == sorted([running.pk, pending.pk])
    running.refresh_from_db()
    pending.refresh_from_db()
    since = last.isoformat(timespec="seconds")
    assert running.status == "failed" and pending.status == "failed"
    assert running.cause == f"node {node.name} missed heartbeats since {since}"
    assert running.cost == lease_cost(PRICE, 2, 600)  # not 1000 s: refunded the silence
    assert running.ended_at == last
    assert pending.cost == 0
    # (the transition; the provider's fault credit is a later note, docs/FAULTS.md)
    event = running.events.exclude(from_status="failed").order_by("-pk").first()
    assert event.to_status == "failed" and event.detail["seconds"] == 600
    ask.refresh_from_db()
    assert ask.remaining_gpus == 0  # a silent node offers nothing
    assert ask.events.filter(cause__contains="node missed heartbeats").exists()
    assert first_violation() is None
    assert fail_silent_nodes(now=now) == []  # a second run changes nothing


def test_a_node_that_heartbeats_in_time_is_left_alone(settings):
    settings.GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS = 90
    node, _, _, ask, [lease] = _leases()
    now = timezone.now()
    _heard_at(node, now - timedelta(seconds=89))
    assert fail_silent_nodes(now=now) == []
    lease.refresh_from_db()
    ask.refresh_from_db()
    assert lease.status == "pending" and ask.remaining_gpus == 6


def test_only_the_silent_node_is_touched(settings):
    settings.GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS = 30
    quiet, _, _, _, [lost] = _leases("quiet")
    alive, _, _, _, [kept] = _leases("alive", dump=RTX4090_DUMP)
    now = timezone.now()
    _heard_at(quiet, now - timedelta(seconds=31))
    _heard_at(alive, now - timedelta(seconds=5))
    assert fail_silent_nodes(now=now) == [lost.pk]
    assert Lease.objects.get(pk=kept.pk).status == "pending"
    assert first_violation() is None


def test_a_lease_started_after_the_last_heartbeat_is_charged_nothing(settings):
    settings.GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS = 90
    node, _, _, _, [lease] = _leases()
    now = timezone.now()
    _heard_at(node, now - timedelta(seconds=500))
    lease = mark_running(lease=lease, container_id="c" * 64, now=now - timedelta(seconds=300))
    fail_silent_nodes(now=now)
    lease.refresh_from_db()
    assert lease.status == "failed" and lease.cost == 0
    assert lease.ended_at == lease.started_at


def test_the_gpus_return_to_the_ask_when_the_node_heartbeats_again(
        settings, django_capture_on_commit_callbacks):
    settings.GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS = 90
    node, token, _, ask, [_lease] = _leases()
    now = timezone.now()
    _heard_at(node, now - timedelta(seconds=200))
    fail_silent_nodes(now=now)
    ask.refresh_from_db()
    assert ask.remaining_gpus == 0

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    with django_capture_on_commit_callbacks(execute=True):
        r = api.post("/api/v1/runner/heartbeat/", {"runtime": "docker", "gpus": []},
                     format="json")
    assert r.status_code == 200
    ask.refresh_from_db()
    assert ask.remaining_gpus == 8 and ask.status in Order.ACTIVE
    assert first_violation() is None


def test_the_beat_entry_and_the_task_are_registered():
    from django.conf import settings as django_settings

    from marketplace.celery import app

    entry = django_settings.CELERY_BEAT_SCHEDULE["fail-silent-nodes"]
    assert entry == {"task": "marketplace.tasks.fail_silent_nodes", "schedule": 15.0}
    app.loader.import_default_modules()
    assert "marketplace.tasks.fail_silent_nodes" in app.tasks
