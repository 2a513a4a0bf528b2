"""The leases page's Stop and Extend through Django's test client: buttons lead to a
confirmation step, the POST does it through the API's services and redirects (PRG) with
the exact final charge or the new end; another buyer's lease is a 404; bad input and
refusals are shown on the page and write nothing. The live cells carry what leases.js
counts on (price, GPUs, start, end, the server's clock)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from marketplace import leases
from marketplace.models import Lease, LeaseExtension
from settlement.models import Hold
from settlement.money import lease_cost
from tests.factories import ask, bid, funded_buyer, registered_node
from tests.frontend.test_pages_buyer import field_error, login
from tests.support.api import snapshot

pytestmark = pytest.mark.django_db
PRICE = 2_490_000


def _lease(client, *, until=None, usd: int = 100):
    provider, node, _ = registered_node()
    ask(provider, node, price=PRICE, until=until)
    buyer = login(client, funded_buyer(usd))
    [lease] = bid(buyer, price=PRICE, gpus=2).leases
    return buyer, lease


def _messages(html: str) -> list[str]:
    return [re.sub(r"\s+", " ", m).strip()
            for m in re.findall(r"<li class=\"[^\"]*\">(.*?)</li>", html.split(
                '<ul class="messages"', 1)[-1].split("</ul>", 1)[0], re.S)]


def test_the_leases_page_offers_stop_and_extend_and_counts_live(client):
    _, lease = _lease(client)
    leases.mark_running(lease=lease, container_id="c" * 64,
                        now=timezone.now() - timedelta(seconds=90))
    html = client.get(reverse("leases-page")).content.decode()
    assert f'href="{reverse("lease-stop-page", args=[lease.pk])}"' in html
    assert f'href="{reverse("lease-extend-page", args=[lease.pk])}"' in html
    cell = re.search(r"<td[^>]*data-live-cost[^>]*>", html).group(0)
    assert f'data-price="{PRICE}"' in cell and 'data-gpus="2"' in cell
    assert 'data-duration="3600"' in cell and "data-started=" in cell
    assert re.search(r"data-live-left data-ends=\"20", html)
    assert "so far" in html and "frontend/leases.js" in html
    assert " on" + "click=" not in html  # CSP: no inline handlers
    for tag in re.findall(r"<script[^>]*>", html):
        assert "src=" in tag or "nonce=" in tag, tag


def test_stop_confirms_then_stops_with_the_exact_charge_shown(client):
    _buyer, lease = _lease(client)
    leases.mark_running(lease=lease, container_id="c" * 64,
                        now=timezone.now() - timedelta(seconds=300))
    url = reverse("lease-stop-page", args=[lease.pk])
    page = client.get(url)
    assert page.status_code == 200 and "Charged if stopped now" in page.content.decode()
    assert Lease.objects.get(pk=lease.pk).status == "running"  # a GET changes nothing

    r = client.post(url)
    assert r.status_code == 302 and r.url == reverse("leases-page")
    ended = Lease.objects.get(pk=lease.pk)
    seconds = int((ended.ended_at - ended.started_at).total_seconds())
    assert ended.status == "cancelled" and ended.cost == lease_cost(PRICE, 2, seconds)
    [message] = _messages(client.get(r.url).content.decode())
    cost = f"{ended.cost / 1e6:.6f}".rstrip("0")
    assert message.startswith(f"Lease #{lease.pk} stopped: charged {cost}")
    assert f"for {seconds} s" in message and "platform" in message

    again = client.post(url)  # idempotent, and says so
    assert again.status_code == 302
    [message] = _messages(client.get(again.url).content.decode())
    assert message.startswith(f"Lease #{lease.pk} had already ended (cancelled)")
    assert Lease.objects.get(pk=lease.pk).cost == ended.cost


def test_another_buyers_lease_is_404_on_both_pages(client):
    _, lease = _lease(client)
    stranger = login(client, funded_buyer(10))
    before = snapshot(stranger)
    for name in ("lease-stop-page", "lease-extend-page"):
        url = reverse(name, args=[lease.pk])
        assert client.get(url).status_code == 404
        assert client.post(url, {"hours": "1"}).status_code == 404
    assert snapshot(stranger) == before
    assert Lease.objects.get(pk=lease.pk).status == "pending"


def test_extend_shows_the_price_refuses_bad_hours_and_extends(client):
    _buyer, lease = _lease(client, until=timezone.now() + timedelta(hours=4))
    url = reverse("lease-extend-page", args=[lease.pk])
    page = client.get(url).content.decode()
    assert "$4.98, held now" in page  # 2 GPUs × 2.49 per hour more
    for bad in ("0", "-1", "1.5", "two", ""):
        before = snapshot()
        r = client.post(url, {"hours": bad})
        assert r.status_code == 400, bad
        assert field_error(r.content.decode(), "hours"), bad
        assert snapshot() == before
    r = client.post(url, {"hours": "5"})  # past the ask's window: shown, nothing written
    assert r.status_code == 400 and "the window ends at" in r.content.decode()
    assert not LeaseExtension.objects.exists()

    holds = Hold.objects.count()
    r = client.post(url, {"hours": "2"})
    assert r.status_code == 302 and r.url == reverse("leases-page")
    assert Hold.objects.count() == holds + 1
    assert Lease.objects.get(pk=lease.pk).duration_seconds == 3 * 3600
    [message] = _messages(client.get(r.url).content.decode())
    assert message == f"Lease #{lease.pk} extended by 2 h to 3 h in all: 9.96 USD more held."
