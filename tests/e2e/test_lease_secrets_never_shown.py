"""A bid's secret is never shown: a buyer places a bid with a distinctive secret value
(and a sealed bid with another), the runner — its own process, real Docker — runs the
lease to `running` and to its end with a workload that prints the secret; then every
buyer, provider and admin page and API answer the lease touches, the /ws/me/ and market
feed frames, the captured log lines and the runner's own output are searched: the values
appear nowhere but in the runner's lease payload (GET /api/v1/runner/leases/), and the
printed secret reads `[redacted]` in GET /api/v1/leases/<id>/logs/."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.contrib import admin
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from marketplace import api_tokens, auctions
from marketplace.models import Lease, Order, SealedBid
from providers.models import LeaseLog
from tests.factories import (
    H100,
    H100_DUMP,
    MISSING,
    RTX4090_DUMP,
    UserFactory,
    bid_body,
    funded_buyer,
    in_a_day,
    registered_node,
)
from tests.frontend.conftest import call, clean_channel_layer, connect, drain, recv  # noqa: F401
from tests.support.api import body_text, client_for, runner_client
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker,
              pytest.mark.usefixtures("clean_channel_layer")]

SECRET = "gm-SECRET-9c41e7-do-not-show"
SEALED_SECRET = "gm-SEALED-2b77d0-do-not-show"
LEASE_S = 8


def _ws(user) -> str:
    ticket, _ = api_tokens.issue_ticket(user=user)
    return f"/ws/me/?ticket={ticket}"


def _pages(client: Client, urls: list[str]) -> dict[str, str]:
    """url → status and body of each GET (every one must answer, none may 500)."""
    seen = {}
    for url in urls:
        r = client.get(url)
        assert r.status_code in (200, 302, 404), (url, r.status_code)
        seen[url] = f"{r.status_code} {r.content.decode('utf-8', 'replace')}"
    return seen


def _admin_urls() -> list[str]:
    """Every registered model's changelist, and the change page of every order, lease,
    sealed bid (and lease log, where the admin has them)."""
    urls = []
    for model in admin.site._registry:
        meta = model._meta
        urls.append(reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist"))
    for model in (Order, Lease, SealedBid, LeaseLog):
        if model not in admin.site._registry:
            continue
        meta = model._meta
        urls += [reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[pk])
                 for pk in model.objects.values_list("pk", flat=True)]
    return urls


def test_a_secret_appears_nowhere_but_in_the_runner_payload(
        live_server, runner_factory, test_image, caplog, capfd):
    caplog.set_level(logging.DEBUG)
    provider, node, token = registered_node(H100_DUMP, name="h100-secrets")
    node.gpus.all().delete()  # the runner registers them itself
    runner = runner_factory(live_server.url, token, H100_DUMP)
    assert runner.register().returncode == 0
    runner.start()
    buyer, rival = funded_buyer(100), funded_buyer(100)
    provider_api = client_for(provider)
    assert provider_api.post("/api/v1/orders/", {
        "side": "ask", "node": node.pk, "price": "2.00", "gpus": 2,
        "available_until": in_a_day().isoformat()}, format="json").status_code == 201
    # a sealed lot on a node no runner serves: its bids and lease stay put
    lot_provider, lot_node, _ = registered_node(RTX4090_DUMP, name="rtx-secrets")
    lot = auctions.open_auction(provider_id=lot_provider.pk, node_id=lot_node.pk, gpus=1,
                                reserve_price=500_000, duration_seconds=3600,
                                closes_at=timezone.now() + timedelta(hours=1))
    api = client_for(buyer)
    captured: dict[str, str] = {}

    def drive() -> int:
        r = api.post("/api/v1/orders/", bid_body(
            gpus=1, hours=MISSING, duration_seconds=LEASE_S, image=test_image,
            command=["sh", "-c", "echo token=$MY_TOKEN; sleep 600"],
            env={"MODE": "eval"}, secrets={"MY_TOKEN": SECRET}), format="json")
        assert r.status_code == 201, r.content
        captured["bid answer"] = body_text(r)
        (lease_id,) = r.json()["leases"]
        listed = runner_client(token).get("/api/v1/runner/leases/").json()["leases"]
        assert listed[0]["secrets"] == {"MY_TOKEN": SECRET}  # the one place it is in clear
        r = api.post(f"/api/v1/auctions/{lot.pk}/bids/",
                     {"price": "0.60", "secrets": {"MY_TOKEN": SEALED_SECRET}}, format="json")
        assert r.status_code == 201, r.content
        captured["sealed bid answer"] = body_text(r)
        client_for(rival).post(f"/api/v1/auctions/{lot.pk}/bids/", {"price": "0.90"},
                               format="json")
        wait_until("the lease to run and its tail to arrive",
                   lambda: LeaseLog.objects.filter(lease_id=lease_id,
                                                   tail__contains="token=").exists(),
                   timeout=90)
        wait_until("the lease to end", lambda: Lease.objects.get(pk=lease_id).status
                   in Lease.ENDED, timeout=90)
        auctions.close_auction(auction_id=lot.pk, now=lot.closes_at + timedelta(seconds=1))
        return lease_id

    paths = [_ws(buyer), _ws(provider), f"/ws/markets/{H100}/", f"/ws/auctions/{lot.pk}/"]

    async def scenario():
        comms = []
        for path in paths:
            comm, connected, detail = await connect(path)
            assert connected, (path, detail)
            comms.append(comm)
        lease_id = await call(drive)
        frames = [frame for comm in comms for frame in await drain(comm, timeout=1.0)]
        for comm in comms:
            await comm.disconnect()
        return lease_id, frames

    lease_id, frames = async_to_sync(scenario)()
    lease = Lease.objects.get(pk=lease_id)
    assert lease.status == "completed", lease.cause
    assert any(json.loads(f).get("type") == "lease" for f in frames)  # the feed did speak

    logs = api.get(f"/api/v1/leases/{lease_id}/logs/").json()["tail"]
    assert logs.splitlines()[0] == "token=[redacted]", logs
    assert api.get(f"/api/v1/leases/{lease_id}/").json()["secret_names"] == ["MY_TOKEN"]

    order = Order.objects.get(owner=buyer)
    sealed = SealedBid.objects.get(bidder=buyer)
    assert lease.secrets_sealed and sealed.secrets_sealed
    api_urls = ["/api/v1/orders/", f"/api/v1/orders/{order.pk}/", "/api/v1/leases/",
                f"/api/v1/leases/{lease_id}/", f"/api/v1/leases/{lease_id}/logs/",
                "/api/v1/sealed-bids/", f"/api/v1/auctions/{lot.pk}/", "/api/v1/auctions/",
                "/api/v1/me/", "/api/v1/wallet/", "/api/v1/ledger/entries/",
                "/api/v1/fills/", f"/api/v1/gpu-classes/{H100}/book/"]
    for who in (buyer, provider, rival):
        for url in api_urls:
            r = client_for(who).get(url)
            assert r.status_code in (200, 404), (url, r.status_code)
            captured[f"{who.username} {url}"] = body_text(r)
    page_urls = ["/", "/orders/", "/leases/", "/wallet/", f"/markets/{H100}/", "/auctions/",
                 f"/auctions/{lot.pk}/", "/provider/", f"/provider/nodes/{node.pk}/",
                 "/provider/earnings/"]
    for who in (buyer, provider):
        browser = Client()
        browser.force_login(type(who).objects.get(pk=who.pk))
        captured.update({f"{who.username} {k}": v
                         for k, v in _pages(browser, page_urls).items()})
    operator = Client()
    operator.force_login(UserFactory(is_staff=True, is_superuser=True))
    captured.update(_pages(operator, _admin_urls()))
    reveal = reverse("admin:marketplace_sealedbid_reveal", args=[sealed.pk])
    r = operator.post(reveal, {"reason": "support ticket 1234"})
    assert r.status_code == 200 and "MY_TOKEN" in r.content.decode()  # the name only
    captured["reveal"] = r.content.decode()
    out, err = capfd.readouterr()
    captured.update({"frames": "\n".join(frames), "log records": caplog.text,
                     "stdout": out, "stderr": err, "runner output": runner.output()})

    # nor their ciphertext (no page or answer shows a *_sealed column)
    for value in (SECRET, SEALED_SECRET, lease.secrets_sealed, sealed.secrets_sealed):
        leaked = sorted(where for where, text in captured.items() if value in text)
        assert leaked == [], f"{value} shown in: {leaked}"
    assert "runner output" in captured and "token=" in logs
