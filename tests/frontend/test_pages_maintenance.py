"""The node page's "Maintenance windows": announce (a POST form with CSRF), a refusal shown
on its field with nothing written, withdraw; another provider's node is a 404."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from providers.models import MaintenanceWindow
from tests.factories import registered_node
from tests.frontend.test_pages_buyer import field_error, login

pytestmark = pytest.mark.django_db


def _when(hours: float) -> str:
    return (timezone.now() + timedelta(hours=hours)).strftime("%Y-%m-%dT%H:%M")


def test_a_provider_announces_and_withdraws_a_window_on_the_node_page(client):
    user, node, _token = registered_node()
    login(client, user)
    page = client.get(reverse("node", args=[node.pk])).content.decode()
    assert 'id="no-maintenance"' in page and 'id="announce-maintenance"' in page
    r = client.post(reverse("node-maintenance-page", args=[node.pk]),
                    {"starts_at": _when(3), "ends_at": _when(5), "reason": "PSU swap"})
    assert r.status_code == 302
    [window] = MaintenanceWindow.objects.filter(node=node)
    assert window.reason == "PSU swap"
    page = client.get(reverse("node", args=[node.pk])).content.decode()
    assert 'id="maintenance-rows"' in page and "PSU swap" in page
    assert window.starts_at.strftime("%Y-%m-%d %H:%M") in page

    r = client.post(reverse("node-maintenance-withdraw", args=[node.pk, window.pk]))
    assert r.status_code == 302
    assert not MaintenanceWindow.objects.exists()


@pytest.mark.parametrize(("starts", "ends", "field"), [
    (-1, 2, "starts_at"), (3, 2, "ends_at"), ("", 2, "starts_at")])
def test_a_bad_window_is_shown_on_its_field_and_nothing_is_written(client, starts, ends,
                                                                   field):
    user, node, _token = registered_node()
    login(client, user)
    r = client.post(reverse("node-maintenance-page", args=[node.pk]),
                    {"starts_at": _when(starts) if starts != "" else "",
                     "ends_at": _when(ends)})
    assert r.status_code == 400
    says = field_error(r.content.decode(), field)
    assert says and "_at" not in says  # people's words, not the API's field names
    assert not MaintenanceWindow.objects.exists()


def test_another_provider_s_node_is_a_404(client):
    _user, node, _token = registered_node()
    other, _n, _t = registered_node(name="other", own_uuids=True)
    login(client, other)
    r = client.post(reverse("node-maintenance-page", args=[node.pk]),
                    {"starts_at": _when(3), "ends_at": _when(5)})
    assert r.status_code == 404
    assert not MaintenanceWindow.objects.exists()


def test_the_buyer_s_leases_page_shows_the_maintenance_deadline(client, settings):
    from marketplace import book, maintenance
    from tests.factories import H100, ask, funded_buyer

    settings.GPUMARKET_PREEMPTION_NOTICE_SECONDS = 120
    user, node, _token = registered_node()
    ask(user, node, price=2_000_000, gpus=8)
    buyer = funded_buyer(100)
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=2_000_000, gpus=1,
                             duration_seconds=3600).leases
    start = timezone.now() + timedelta(seconds=600)
    # announced before the lease (the bid above would not have filled into it)
    maintenance.announce(user_id=user.pk, node_id=node.pk, starts_at=start,
                         ends_at=start + timedelta(hours=1), now=timezone.now())
    assert maintenance.give_due_notices(now=start - timedelta(seconds=120)) == [lease.pk]
    login(client, buyer)
    html = client.get(reverse("leases-page")).content.decode()
    assert (f"ends at {start.strftime('%Y-%m-%d %H:%M:%S')} UTC: the node's maintenance"
            in html)
