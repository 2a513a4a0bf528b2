"""A bid's env and secrets (marketplace/workload_env.py, sealing.py): the secrets are sealed
at rest, copied to the lease, handed in clear to that lease's runner only, and known
elsewhere by name only; bad env or secrets are refused naming the field and key, with
nothing written and no hold left. The Jupyter token of a lease with a "jupyter" port role
(marketplace/jupyter.py) reaches its workload as JUPYTER_TOKEN and its buyer as a link."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from marketplace import auctions, sealing
from marketplace.models import Lease, Order, SealedBid
from settlement.models import Hold
from tests.factories import RTX4090_DUMP, ask, bid, bid_body, funded_buyer, registered_node
from tests.frontend.test_pages_buyer import login
from tests.support.api import assert_refused, body_text, client_for, runner_client, snapshot

pytestmark = pytest.mark.django_db
SECRET = "hf_Zq8sEcReT-vAlUe-42x"


def _market():
    provider, node, token = registered_node()
    buyer = funded_buyer(100)
    ask(provider, node, price=2_000_000)
    return provider, node, token, buyer


def _post_bid(buyer, **changes):
    return client_for(buyer).post("/api/v1/orders/", bid_body(**{"gpus": 1, **changes}),
                                  format="json")


def test_secrets_are_sealed_named_in_answers_and_in_clear_for_the_runner_only():
    provider, _, token, buyer = _market()
    r = _post_bid(buyer, env={"MODEL": "llama-3-8b"},
                  secrets={"HF_TOKEN": SECRET, "WANDB_API_KEY": "wandb-" + SECRET})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["env"] == {"MODEL": "llama-3-8b"}
    assert body["secret_names"] == ["HF_TOKEN", "WANDB_API_KEY"]
    assert "secrets" not in body and SECRET not in body_text(r)
    (lease_id,) = body["leases"]
    # at rest: a Fernet token, on the order and (copied) on the lease
    order, lease = Order.objects.get(pk=body["id"]), Lease.objects.get(pk=lease_id)
    for sealed in (order.secrets_sealed, lease.secrets_sealed):
        assert sealed and SECRET not in sealed
        assert sealing.unseal(sealed)["HF_TOKEN"] == SECRET
    assert lease.env == {"MODEL": "llama-3-8b"}

    for user in (buyer, provider):
        r = client_for(user).get(f"/api/v1/leases/{lease_id}/")
        assert r.status_code == 200
        assert r.json()["secret_names"] == ["HF_TOKEN", "WANDB_API_KEY"]
        assert r.json()["env"] == {"MODEL": "llama-3-8b"} and SECRET not in body_text(r)
    r = client_for(buyer).get(f"/api/v1/orders/{order.pk}/")
    assert r.json()["secret_names"] == ["HF_TOKEN", "WANDB_API_KEY"]
    assert SECRET not in body_text(r)

    [listed] = runner_client(token).get("/api/v1/runner/leases/").json()["leases"]
    assert listed["secrets"] == {"HF_TOKEN": SECRET, "WANDB_API_KEY": "wandb-" + SECRET}
    assert listed["env"] == {"MODEL": "llama-3-8b", "GPUMARKET_LEASE_ID": str(lease_id)}
    # another node's runner does not see it
    _, _, other_token = registered_node(RTX4090_DUMP, name="node-2")
    assert runner_client(other_token).get("/api/v1/runner/leases/").json()["leases"] == []


def test_a_replayed_client_order_id_compares_the_secrets_opened():
    _, _, _, buyer = _market()
    first = _post_bid(buyer, client_order_id="job-1", secrets={"HF_TOKEN": SECRET})
    assert first.status_code == 201, first.content
    again = _post_bid(buyer, client_order_id="job-1", secrets={"HF_TOKEN": SECRET})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    other = _post_bid(buyer, client_order_id="job-1", secrets={"HF_TOKEN": "another"})
    assert_refused(other, "client_order_id", status=409, contains="other secrets")
    assert SECRET not in body_text(other) and "another" not in body_text(other)


def test_a_sealed_bids_secrets_are_sealed_with_it_and_reach_its_lease():
    provider, node, token = registered_node()
    buyer = funded_buyer(100)
    now = timezone.now()
    lot = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=2,
                                reserve_price=1_000_000, duration_seconds=3600,
                                closes_at=now + timedelta(minutes=5))
    r = client_for(buyer).post(f"/api/v1/auctions/{lot.pk}/bids/",
                               {"price": "1.50", "env": {"A": "1"},
                                "secrets": {"HF_TOKEN": SECRET}}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["secret_names"] == ["HF_TOKEN"] and SECRET not in body_text(r)
    assert SECRET not in SealedBid.objects.get().secrets_sealed
    mine = client_for(buyer).get("/api/v1/sealed-bids/")
    assert mine.json()["results"][0]["secret_names"] == ["HF_TOKEN"]
    assert SECRET not in body_text(mine)
    auctions.close_auction(auction_id=lot.pk, now=now + timedelta(minutes=6))
    lease = Lease.objects.get(sealed_bid__auction=lot)
    assert lease.env == {"A": "1"}
    [listed] = runner_client(token).get("/api/v1/runner/leases/").json()["leases"]
    assert listed["secrets"] == {"HF_TOKEN": SECRET}


def test_rotation_a_new_key_first_still_opens_what_the_old_key_sealed(settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.GPUMARKET_SECRETS_KEYS = [old]
    sealed = sealing.seal({"HF_TOKEN": SECRET})
    settings.GPUMARKET_SECRETS_KEYS = [new, old]
    assert sealing.unseal(sealed) == {"HF_TOKEN": SECRET}
    resealed = sealing.reseal(sealed)
    settings.GPUMARKET_SECRETS_KEYS = [new]
    assert sealing.unseal(resealed) == {"HF_TOKEN": SECRET}
    with pytest.raises(sealing.Unsealable) as refused:
        sealing.unseal(sealed)
    assert SECRET not in str(refused.value)


TOO_MANY = {f"V{i}": "x" for i in range(33)}
BIG = "x" * (4 * 1024 + 1)


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"env": {"lower": "x"}}, "env", "is not a name"),
    ({"secrets": {"1ABC": "x"}}, "secrets", "is not a name"),
    ({"secrets": {"HF-TOKEN": "x"}}, "secrets", "is not a name"),
    ({"env": {"GPUMARKET_LEASE_ID": "7"}}, "env.GPUMARKET_LEASE_ID", "reserved"),
    ({"secrets": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "secrets.NVIDIA_VISIBLE_DEVICES",
     "reserved"),
    ({"secrets": {"HF_TOKEN": "a\u0000b"}}, "secrets.HF_TOKEN", "NUL"),
    ({"secrets": {"HF_TOKEN": 42}}, "secrets.HF_TOKEN", "must be a string"),
    ({"env": TOO_MANY}, "env", "at most 32"),
    ({"secrets": {"HF_TOKEN": BIG}}, "secrets.HF_TOKEN", "4 KiB"),
    ({"env": {f"V{i}": "y" * 4000 for i in range(9)}}, "env", "32 KiB"),
    ({"env": {"HF_TOKEN": "x"}, "secrets": {"HF_TOKEN": "y"}}, "secrets.HF_TOKEN", "env"),
    ({"secrets": ["HF_TOKEN"]}, "secrets", "JSON object"),
])
def test_bad_env_and_secrets_are_refused_naming_field_and_key(changes, field, words):
    _, _, _, buyer = _market()
    before, holds = snapshot(buyer), Hold.objects.count()
    r = _post_bid(buyer, **changes)
    body = assert_refused(r, field, contains=words)
    assert "yyyy" not in str(body) and "xxxx" not in str(body)  # never the value back
    assert snapshot(buyer) == before and Hold.objects.count() == holds


def test_bad_secrets_of_a_sealed_bid_and_of_an_ask_write_nothing():
    provider, node, _ = registered_node()
    buyer = funded_buyer(100)
    lot = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=2,
                                reserve_price=1_000_000, duration_seconds=3600,
                                closes_at=timezone.now() + timedelta(minutes=5))
    before = snapshot(buyer, provider)
    r = client_for(buyer).post(f"/api/v1/auctions/{lot.pk}/bids/",
                               {"price": "1.50", "secrets": {"NVIDIA_X": SECRET}},
                               format="json")
    assert_refused(r, "secrets.NVIDIA_X", contains="reserved")
    assert SECRET not in body_text(r)
    r = client_for(provider).post("/api/v1/orders/", {
        "side": "ask", "node": node.pk, "price": "2.00", "gpus": 1,
        "available_until": (timezone.now() + timedelta(days=1)).isoformat(),
        "secrets": {"HF_TOKEN": SECRET}}, format="json")
    assert_refused(r, "secrets", contains="is for bids")
    # the service refuses the same without the API in front
    with pytest.raises(Exception) as refused:
        auctions.place_sealed_bid(bidder_id=buyer.pk, auction_id=lot.pk, price=1_500_000,
                                  env={"A": "1"}, secrets={"A": SECRET})
    assert getattr(refused.value, "field", None) == "secrets.A"
    assert snapshot(buyer, provider) == before


def _jupyter_lease(buyer):
    placed = bid(buyer, price=2_000_000, ports=[8888], port_roles={"8888": "jupyter"},
                 secrets={"HF_TOKEN": SECRET})
    return placed.leases[0]


def test_a_jupyter_lease_gets_a_token_its_workload_and_only_its_buyer_see():
    provider, _, token, buyer = _market()
    lease = _jupyter_lease(buyer)
    jupyter = sealing.unseal_text(lease.jupyter_token_sealed)
    assert len(jupyter) >= 40 and jupyter not in lease.jupyter_token_sealed
    runner = runner_client(token)
    [listed] = runner.get("/api/v1/runner/leases/").json()["leases"]
    assert listed["secrets"] == {"HF_TOKEN": SECRET, "JUPYTER_TOKEN": jupyter}
    assert listed["port_roles"] == {"8888": "jupyter"}
    r = client_for(buyer).get(f"/api/v1/leases/{lease.pk}/")
    assert r.json()["connect"] == {"ssh": None, "jupyter": None, "http": []}  # no endpoint yet
    assert jupyter not in body_text(r)
    assert r.json()["secret_names"] == ["HF_TOKEN"]  # the marketplace's token is not listed

    runner.post(f"/api/v1/runner/leases/{lease.pk}/events/",
                {"status": "running", "container_id": "c0ffee", "endpoints": [
                    {"container_port": 8888, "host": "gpu1.example.net", "host_port": 40124}]},
                format="json")
    r = client_for(buyer).get(f"/api/v1/leases/{lease.pk}/")
    assert r.json()["connect"]["jupyter"] == \
        f"http://gpu1.example.net:40124/lab?token={jupyter}"
    # the provider's views and another buyer's never show it
    r = client_for(provider).get(f"/api/v1/leases/{lease.pk}/")
    assert r.status_code == 200 and r.json()["connect"] is None
    assert jupyter not in body_text(r)
    assert jupyter not in body_text(client_for(provider).get("/api/v1/leases/"))
    other = funded_buyer(5)
    r = client_for(other).get(f"/api/v1/leases/{lease.pk}/")
    assert r.status_code == 404 and jupyter not in body_text(r)
    # the pages: the buyer's leases page links it; the provider's portal and node page not
    browser = Client()
    login(browser, buyer)
    html = browser.get(reverse("leases-page")).content.decode()
    assert f'href="http://gpu1.example.net:40124/lab?token={jupyter}"' in html
    assert "secrets: HF_TOKEN" in html
    login(browser, provider)
    for url in (reverse("portal"), reverse("node", args=[lease.node_id])):
        page = browser.get(url)
        assert page.status_code == 200 and f"lease-{lease.pk}" in page.content.decode()
        assert jupyter not in page.content.decode()


def test_a_workload_printing_a_secret_posts_it_redacted_even_from_a_careless_runner():
    _, _, token, buyer = _market()
    lease = _jupyter_lease(buyer)
    jupyter = sealing.unseal_text(lease.jupyter_token_sealed)
    r = runner_client(token).post(f"/api/v1/runner/leases/{lease.pk}/logs/",
                                  {"tail": f"token {SECRET}\njupyter at ?token={jupyter}\n"},
                                  format="json")
    assert r.status_code == 200 and SECRET not in body_text(r)
    tail = client_for(buyer).get(f"/api/v1/leases/{lease.pk}/logs/").json()["tail"]
    assert tail == "token [redacted]\njupyter at ?token=[redacted]\n"


def test_secrets_reseal_moves_every_stored_secret_to_the_first_key(settings):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.GPUMARKET_SECRETS_KEYS = [old]
    _, _, _, buyer = _market()
    lease = _jupyter_lease(buyer)
    settings.GPUMARKET_SECRETS_KEYS = [new, old]
    out = io.StringIO()
    call_command("secrets_reseal", stdout=out)
    assert "Lease.jupyter_token_sealed: 1 re-sealed" in out.getvalue()
    assert SECRET not in out.getvalue()
    settings.GPUMARKET_SECRETS_KEYS = [new]  # the old key is gone: all still opens
    lease.refresh_from_db()
    order = Order.objects.get(side="bid")
    assert sealing.unseal(order.secrets_sealed) == {"HF_TOKEN": SECRET}
    assert sealing.unseal(lease.secrets_sealed) == {"HF_TOKEN": SECRET}
    assert sealing.unseal_text(lease.jupyter_token_sealed)
