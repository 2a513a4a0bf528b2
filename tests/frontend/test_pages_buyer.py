"""Buyer pages through Django's test client: sign up / log in, wallet, market page and
bid form, my orders (cancel), my leases. Bad input shows the error next to its field and
writes nothing."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from marketplace import book
from marketplace.models import Lease, Order
from settlement import services as ledger
from settlement.models import Hold, JournalEntry
from tests.factories import ensure_catalog, funded_buyer, in_a_day, registered_node

pytestmark = pytest.mark.django_db
MARKET = "h100-sxm-80gb"


def field_error(html: str, field: str) -> str:
    """The error list rendered right after the field `field` (empty when none)."""
    m = re.search(rf'id="id_{field}_error"[^>]*>(.*?)</ul>', html, re.S)
    return re.sub(r"<[^>]+>", " ", m.group(1)).strip() if m else ""


def login(client, user):
    """force_login with the user as stored (the factory's password is not saved)."""
    user = type(user).objects.get(pk=user.pk)
    client.force_login(user)
    return user


@pytest.fixture
def buyer(client):
    return login(client, funded_buyer(1000))


def test_signup_logs_in_and_lands_on_the_wallet(client):
    page = client.get(reverse("signup-page"))
    assert page.status_code == 200
    html = page.content.decode()
    for name in ("username", "password1", "password2"):
        assert f'<label for="id_{name}"' in html
    r = client.post(reverse("signup-page"), {"username": "alice", "password1": "a long password 1",
                                             "password2": "a long password 1"})
    assert r.status_code == 302 and r.url == reverse("wallet-page")
    assert client.get(reverse("wallet-page")).status_code == 200


def test_signup_errors_next_to_the_field_and_no_user(client, django_user_model):
    r = client.post(reverse("signup-page"), {"username": "bob", "password1": "a long password 1",
                                             "password2": "different"})
    assert r.status_code == 400
    assert field_error(r.content.decode(), "password2")
    assert not django_user_model.objects.filter(username="bob").exists()


def test_login_and_logout(client, django_user_model):
    django_user_model.objects.create_user(username="carol", password="correct-horse-battery")
    page = client.get(reverse("login"))
    assert '<label for="id_username"' in page.content.decode()
    r = client.post(reverse("login"), {"username": "carol", "password": "correct-horse-battery"})
    assert r.status_code == 302 and r.url == reverse("wallet-page")
    r = client.post(reverse("logout"))
    assert r.status_code == 302
    assert client.get(reverse("wallet-page")).status_code == 302  # to the login page


def test_pages_need_login(client):
    for name in ("wallet-page", "orders-page", "leases-page", "portal", "earnings"):
        r = client.get(reverse(name))
        assert r.status_code == 302 and r.url.startswith(reverse("login")), name


def test_wallet_shows_balances_and_holds(client, buyer):
    ensure_catalog()
    book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=2_500_000, gpus=2,
                   duration_seconds=3600)
    html = client.get(reverse("wallet-page")).content.decode()
    assert "$995.00" in html       # available: 1000 − 2.5 × 2 × 1
    assert "$5.00" in html          # held
    assert "order:" in html         # the hold's reference


def test_dev_credit_form(client, buyer, settings):
    settings.GPUMARKET_DEV_CREDIT = True
    html = client.get(reverse("wallet-page")).content.decode()
    assert '<label for="id_amount"' in html
    r = client.post(reverse("wallet-dev-credit"), {"amount": "25.50"})
    assert r.status_code == 302
    assert ledger.wallet(user_id=buyer.pk).available == 1025_500_000


@pytest.mark.parametrize("amount", ["-5", "1.1234567", "abc", "", "0"])
def test_dev_credit_bad_amount_changes_nothing(client, buyer, settings, amount):
    settings.GPUMARKET_DEV_CREDIT = True
    entries = JournalEntry.objects.count()
    r = client.post(reverse("wallet-dev-credit"), {"amount": amount})
    assert r.status_code == 400
    assert field_error(r.content.decode(), "amount")
    assert JournalEntry.objects.count() == entries


def test_dev_credit_refused_when_disabled(client, buyer, settings):
    settings.GPUMARKET_DEV_CREDIT = False
    settings.STRIPE_SECRET_KEY = ""
    assert "No payment method" in client.get(reverse("wallet-page")).content.decode()
    assert client.post(reverse("wallet-dev-credit"), {"amount": "5"}).status_code == 404
    assert ledger.wallet(user_id=buyer.pk).available == 1000_000_000


def test_stripe_topup_form_shown_when_configured(client, buyer, settings):
    settings.STRIPE_SECRET_KEY = "sk_test_x"
    html = client.get(reverse("wallet-page")).content.decode()
    assert "Top up with Stripe" in html
    r = client.post(reverse("wallet-topup"), {"amount": "10.005"})
    assert r.status_code == 400 and "whole cents" in field_error(r.content.decode(), "amount")


def test_market_page_renders_datasheet_depth_and_form(client, buyer):
    user, node, _ = registered_node()
    book.place_ask(provider_id=user.pk, node_id=node.pk, market_slug=MARKET, price=2_000_000,
                   gpus=4, available_until=in_a_day())
    r = client.get(reverse("market", args=[MARKET]))
    assert r.status_code == 200
    html = r.content.decode()
    assert "Source:" in html and "vendor/chartjs/chart.umd.min.js" in html
    assert '"asks":[["2.00",4]]' in html
    for name in ("gpus", "hours", "price", "gang_size", "time_in_force", "image", "command"):
        assert f'<label for="id_{name}"' in html, name
    assert 'id="hold-preview"' in html


def test_market_page_anonymous_and_unknown(client):
    ensure_catalog()
    html = client.get(reverse("market", args=[MARKET])).content.decode()
    assert "to bid" in html and 'id="bid-form"' not in html
    assert client.get(reverse("market", args=["no-such-gpu"])).status_code == 404


def test_bid_fills_against_an_ask_and_shows_the_lease(client, buyer):
    user, node, _ = registered_node()
    book.place_ask(provider_id=user.pk, node_id=node.pk, market_slug=MARKET, price=2_000_000,
                   gpus=8, available_until=in_a_day())
    r = client.post(reverse("market", args=[MARKET]), {
        "gpus": "2", "hours": "1", "price": "2.50", "gang_size": "", "time_in_force": "GTC",
        "image": "gpumarket/busybox:local", "command": "sleep 3600"})
    assert r.status_code == 302
    lease = Lease.objects.get(buyer=buyer)
    assert lease.gpu_count == 2 and lease.price == 2_000_000 and lease.command == ["sleep", "3600"]
    html = client.get(reverse("market", args=[MARKET])).content.decode()
    assert f'id="lease-{lease.pk}"' in html and "2 of 2 GPUs filled" in html


@pytest.mark.parametrize(("data", "field", "words"), [
    ({"price": "2.1234567"}, "price", "6 decimal"),
    ({"price": "-1"}, "price", "negative"),
    ({"price": "0"}, "price", "greater than zero"),
    ({"gpus": "0"}, "gpus", ""),
    ({"hours": "x"}, "hours", ""),
    ({"gpus": "3", "gang_size": "2"}, "gang_size", "divide"),
    ({"time_in_force": "NOPE"}, "time_in_force", ""),
    ({"command": "echo 'unclosed"}, "command", "split"),
])
def test_bad_bid_shows_error_next_to_field_and_writes_nothing(client, buyer, data, field, words):
    ensure_catalog()
    form = {"gpus": "1", "hours": "1", "price": "2.00", "gang_size": "", "time_in_force": "GTC",
            "image": "", "command": "", **data}
    before = (Order.objects.count(), Hold.objects.count(), JournalEntry.objects.count())
    r = client.post(reverse("market", args=[MARKET]), form)
    assert r.status_code == 400
    error = field_error(r.content.decode(), field)
    assert error and words in error
    assert (Order.objects.count(), Hold.objects.count(), JournalEntry.objects.count()) == before


def test_bid_beyond_balance_shows_the_service_error(client):
    ensure_catalog()
    login(client, funded_buyer(1))
    r = client.post(reverse("market", args=[MARKET]), {
        "gpus": "8", "hours": "10", "price": "3.00", "time_in_force": "GTC"})
    assert r.status_code == 400
    assert "insufficient balance" in r.content.decode()
    assert not Order.objects.exists()


def test_my_orders_and_cancel(client, buyer):
    ensure_catalog()
    placed = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=1_000_000, gpus=1,
                            duration_seconds=3600)
    html = client.get(reverse("orders-page")).content.decode()
    assert f'id="order-{placed.order.pk}"' in html and "Cancel order" in html
    r = client.post(reverse("order-cancel-page", args=[placed.order.pk]))
    assert r.status_code == 302
    placed.order.refresh_from_db()
    assert placed.order.status == "cancelled"
    assert ledger.wallet(user_id=buyer.pk).held == 0


@pytest.mark.parametrize(("nxt", "lands"), [
    ("nosuchview", "/orders/"),           # a URL name was reversed: NoReverseMatch, a 500
    ("market", "/orders/"),
    ("x\x00y", "/orders/"),
    ("https://elsewhere.example/", "/orders/"),
    ("//elsewhere.example/", "/orders/"),
    ("/markets/h100-sxm-80gb/", "/markets/h100-sxm-80gb/"),
])
def test_cancel_goes_back_only_to_a_path_of_this_site(client, buyer, nxt, lands):
    ensure_catalog()
    placed = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=1_000_000, gpus=1,
                            duration_seconds=3600)
    r = client.post(reverse("order-cancel-page", args=[placed.order.pk]), {"next": nxt})
    assert (r.status_code, r["Location"]) == (302, lands)


def test_cannot_cancel_another_users_order(client, buyer):
    ensure_catalog()
    other = funded_buyer(10)
    placed = book.place_bid(buyer_id=other.pk, market_slug=MARKET, price=1_000_000, gpus=1,
                            duration_seconds=3600)
    r = client.post(reverse("order-cancel-page", args=[placed.order.pk]), follow=True)
    assert "no order" in r.content.decode()
    placed.order.refresh_from_db()
    assert placed.order.status == "open"
    mine = client.get(reverse("orders-page")).content.decode()
    assert f'id="order-{placed.order.pk}"' not in mine


def test_my_leases_show_status_container_cause_and_split(client, buyer):
    from marketplace import lease_end, leases

    user, node, _ = registered_node()
    book.place_ask(provider_id=user.pk, node_id=node.pk, market_slug=MARKET, price=3_600_000,
                   gpus=8, available_until=in_a_day())
    placed = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=3_600_000, gpus=1,
                            duration_seconds=3600)
    lease = placed.leases[0]
    leases.mark_running(lease=lease, container_id="c0ffee1234")
    lease_end.end_lease(lease_id=lease.pk, status="failed", cause="GPU fell off the bus (XID 79)")
    lease.refresh_from_db()
    html = client.get(reverse("leases-page")).content.decode()
    assert "c0ffee1234" in html and "XID 79" in html and "failed" in html
    assert lease.cost is not None
    from frontend.views import usd
    for amount in (lease.cost, lease.provider_amount, lease.platform_fee):
        assert usd(amount) in html


def test_usd_formatting():
    from frontend.views import usd

    assert usd(2_490_000) == "2.49"
    assert usd(1) == "0.000001"
    assert usd(0) == "0.00"
    assert usd(1_234_560) == "1.23456"
    assert usd(None) == "—"


def test_my_leases_show_the_log_tail_and_a_preemption_notice(client, buyer):
    from datetime import timedelta

    from django.utils import timezone

    from marketplace import leases
    from providers.models import LeaseLog

    user, node, _ = registered_node()
    book.place_ask(provider_id=user.pk, node_id=node.pk, market_slug=MARKET, price=3_600_000,
                   gpus=8, available_until=in_a_day())
    lease = book.place_bid(buyer_id=buyer.pk, market_slug=MARKET, price=3_600_000, gpus=1,
                           duration_seconds=3600).leases[0]
    leases.mark_running(lease=lease, container_id="c0ffee1234")
    LeaseLog.objects.create(lease_id=lease.pk, node=node, tail="epoch 3 loss 0.42 <ok>\n",
                            updated_at=timezone.now())
    Lease.objects.filter(pk=lease.pk).update(
        preempt_at=timezone.now() + timedelta(seconds=120))
    html = client.get(reverse("leases-page")).content.decode()
    assert "epoch 3 loss 0.42 &lt;ok&gt;" in html  # escaped, never raw HTML
    assert "preempted by a higher bid at" in html
