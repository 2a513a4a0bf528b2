"""The wallet page's SSH keys section (add, list with type and fingerprint, delete; PRG;
a refused key shown next to its field, nothing written) and the leases page's ssh
command, shown to the lease's buyer only."""

from __future__ import annotations

import pytest
from django.urls import reverse

from marketplace.models import SshKey
from tests.factories import ask, bid, funded_buyer, registered_node
from tests.frontend.test_pages_buyer import field_error, login
from tests.support.api import runner_client
from tests.support.ssh import key_pair

pytestmark = pytest.mark.django_db


def test_add_list_and_delete_a_key_from_the_wallet_page(client):
    buyer = login(client, funded_buyer(10))
    pair = key_pair()
    r = client.post(reverse("ssh-key-add-page"), {"name": "laptop",
                                                  "public_key": pair.public_line})
    assert r.status_code == 302 and r["Location"] == reverse("wallet-page")
    key = SshKey.objects.get(owner=buyer)
    html = client.get(reverse("wallet-page")).content.decode()
    assert "laptop" in html and "ssh-ed25519" in html and key.fingerprint in html
    assert 'nonce="' in html and "<script>" not in html  # the page's scripts carry a nonce

    r = client.post(reverse("ssh-key-delete-page", args=[key.pk]))
    assert r.status_code == 302
    assert not SshKey.objects.exists()
    assert key.fingerprint not in client.get(reverse("wallet-page")).content.decode()


def test_a_refused_key_is_shown_next_to_the_field_and_nothing_is_written(client):
    login(client, funded_buyer(10))
    r = client.post(reverse("ssh-key-add-page"),
                    {"name": "old", "public_key": key_pair("rsa-1024").public_line})
    assert r.status_code == 400
    assert "1024 bits" in field_error(r.content.decode(), "public_key")
    assert not SshKey.objects.exists()


def test_another_user_s_key_cannot_be_deleted_from_the_page(client):
    owner = funded_buyer(10)
    from marketplace import ssh_keys

    key = ssh_keys.add_key(owner_id=owner.pk, public_key=key_pair().public_line, name="k")
    login(client, funded_buyer(10))
    r = client.post(reverse("ssh-key-delete-page", args=[key.pk]), follow=True)
    assert f"you have no SSH key {key.pk}" in r.content.decode()
    assert SshKey.objects.filter(pk=key.pk).exists()


def test_the_leases_page_shows_the_ssh_command_to_the_buyer_only(client):
    provider, node, token = registered_node()
    ask(provider, node, price=2_000_000)
    buyer = funded_buyer(100, ssh_key=True)
    [lease] = bid(buyer, ssh=True).leases
    runner = runner_client(token)
    url = f"/api/v1/runner/leases/{lease.pk}/events/"
    runner.post(url, {"status": "starting"}, format="json")
    assert runner.post(url, {"status": "running", "container_id": "c0ffee", "endpoints": [
        {"container_port": 22, "host": "gpu-host.example", "host_port": 40123}]},
        format="json").status_code == 200
    login(client, buyer)
    html = client.get(reverse("leases-page")).content.decode()
    assert "ssh -p 40123 root@gpu-host.example" in html
    login(client, provider)
    for page in (reverse("portal"), reverse("node", args=[node.pk])):
        html = client.get(page).content.decode()
        assert f'id="lease-{lease.pk}"' in html and "ssh -p 40123" not in html
