"""Lease log tails through the HTTP API: the runner of the lease's node sends them; the
lease's buyer and provider read the latest; everyone else gets 404."""

from __future__ import annotations

import pytest

from marketplace import book
from providers.models import LeaseLog
from tests.factories import RTX4090_DUMP, UserFactory, funded_buyer, in_a_day, registered_node
from tests.support.api import client_for, runner_client

pytestmark = pytest.mark.django_db


def _lease(name="node-1"):
    provider, node, token = registered_node(name=name)
    buyer = funded_buyer(100)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_000_000, gpus=2, available_until=in_a_day())
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=2_000_000,
                             gpus=2, duration_seconds=3600).leases
    return provider, buyer, node, token, lease


def test_the_runner_posts_the_tail_and_buyer_and_provider_read_the_latest():
    provider, buyer, node, token, lease = _lease()
    url = f"/api/v1/runner/leases/{lease.pk}/logs/"
    r = runner_client(token).post(url, {"tail": "step 1\n"}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["tail"] == "step 1\n" and r.json()["lease"] == lease.pk
    r = runner_client(token).post(url, {"tail": "step 1\nstep 2 é\n"}, format="json")
    assert r.status_code == 200
    assert LeaseLog.objects.get().node == node  # one row per lease, replaced

    for user in (buyer, provider):
        r = client_for(user).get(f"/api/v1/leases/{lease.pk}/logs/")
        assert r.status_code == 200, r.content
        body = r.json()
        assert body["lease"] == lease.pk and body["tail"] == "step 1\nstep 2 é\n"
        assert body["updated_at"]


def test_before_any_tail_the_log_is_empty():
    _, buyer, _, _, lease = _lease()
    r = client_for(buyer).get(f"/api/v1/leases/{lease.pk}/logs/")
    assert r.status_code == 200
    assert r.json() == {"lease": lease.pk, "tail": "", "updated_at": None}


def test_strangers_get_404_and_anonymous_401():
    _, _, _, token, lease = _lease()
    runner_client(token).post(f"/api/v1/runner/leases/{lease.pk}/logs/", {"tail": "secret"},
                              format="json")
    r = client_for(UserFactory()).get(f"/api/v1/leases/{lease.pk}/logs/")
    assert r.status_code == 404
    assert "secret" not in r.content.decode()
    # as the lease's own 404: a detail, no `errors` (no request field caused it)
    assert r.json() == {"detail": f"no lease {lease.pk} of yours"}
    assert client_for(UserFactory()).get("/api/v1/leases/999999/logs/").status_code == 404
    assert client_for().get(f"/api/v1/leases/{lease.pk}/logs/").status_code == 401


def test_another_nodes_runner_cannot_write_the_tail():
    _, _, _, _, lease = _lease()
    _, _, other_token = registered_node(dump=RTX4090_DUMP, name="node-2")
    r = runner_client(other_token).post(f"/api/v1/runner/leases/{lease.pk}/logs/",
                                        {"tail": "x"}, format="json")
    assert r.status_code == 404
    assert "lease" in r.json()["detail"]
    assert not LeaseLog.objects.exists()
    r = runner_client("gmr_not-a-token").post(f"/api/v1/runner/leases/{lease.pk}/logs/",
                                              {"tail": "x"}, format="json")
    assert r.status_code == 401


@pytest.mark.parametrize(("body", "field"), [
    ({"tail": "é" * 40_000}, "tail"),  # 80,000 bytes of UTF-8 but only 40,000 characters
    ({"tail": "x" * (64 * 1024 + 1)}, "tail"),
    ({}, "tail"),
    ({"tail": 5}, "tail"),
    ({"tail": "a\x00b"}, "tail"),
])
def test_bad_tails_are_refused_naming_the_field_and_change_nothing(body, field):
    _, _, _, token, lease = _lease()
    r = runner_client(token).post(f"/api/v1/runner/leases/{lease.pk}/logs/", body,
                                  format="json")
    assert r.status_code == 400, r.content
    assert field in r.content.decode()
    assert not LeaseLog.objects.exists()


def test_exactly_64_kib_is_accepted():
    _, _, _, token, lease = _lease()
    tail = "é" * (32 * 1024)  # 65,536 bytes
    r = runner_client(token).post(f"/api/v1/runner/leases/{lease.pk}/logs/", {"tail": tail},
                                  format="json")
    assert r.status_code == 200
    assert LeaseLog.objects.get().tail == tail
