"""The node page's Rename and Retire (POST forms with CSRF, PRG), the token page's copy
button and its `--simulate` hint (a recording no node registered yet)."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from marketplace.models import Order
from providers import recordings
from providers.models import Node
from tests.conftest import DATA
from tests.factories import RTX4090_DUMP, ask, bid, funded_buyer, registered_node
from tests.frontend.test_pages_buyer import field_error, login
from tests.support.api import runner_client

pytestmark = pytest.mark.django_db

A10_DUMP = DATA / "nvidia-smi" / "a10-x1.driver-535.129.03.txt"


@pytest.fixture
def provider(client):
    user, node, token = registered_node()
    login(client, user)
    return user, node, token


def test_the_node_page_has_rename_and_retire_forms_and_rotation(client, provider):
    _, node, _ = provider
    html = client.get(reverse("node", args=[node.pk])).content.decode()
    for action in ("node-rename-page", "node-retire-page", "node-rotate-token-page"):
        url = reverse(action, args=[node.pk])
        form = re.search(rf'<form[^>]*method="post" action="{url}"[^>]*>(.*?)</form>', html,
                         re.S)
        assert form and 'name="csrfmiddlewaretoken"' in form.group(1), action
    assert 'value="node-1"' in html  # the rename field starts with the name
    assert "Retire node</button>" in html and "Rotate runner token</button>" in html


def test_rename_redirects_to_the_node_page_with_the_new_name(client, provider):
    _, node, _ = provider
    r = client.post(reverse("node-rename-page", args=[node.pk]), {"name": "rack-7"})
    assert r.status_code == 302 and r["Location"] == reverse("node", args=[node.pk])
    page = client.get(r["Location"]).content.decode()
    assert "Node rack-7" in page and "Node renamed to “rack-7”" in page
    assert Node.objects.get(pk=node.pk).name == "rack-7"


@pytest.mark.parametrize(("name", "says"), [("", "required"), ("y" * 101, "100"),
                                        ("taken", "already have a node named")])
def test_a_bad_name_is_shown_next_to_the_field(client, provider, name, says):
    user, node, _ = provider
    registered_node(RTX4090_DUMP, name="taken", user=user)
    r = client.post(reverse("node-rename-page", args=[node.pk]), {"name": name})
    assert r.status_code == 400
    assert says in field_error(r.content.decode(), "name")
    assert Node.objects.get(pk=node.pk).name == "node-1"


def test_retire_is_refused_with_the_reason_while_a_lease_is_active(client, provider):
    user, node, token = provider
    ask(user, node)
    [lease] = bid(funded_buyer(), gpus=1).leases
    html = client.get(reverse("node", args=[node.pk])).content.decode()
    assert f"Cannot retire it now: node node-1 has 1 active lease (#{lease.pk})" in html

    r = client.post(reverse("node-retire-page", args=[node.pk]), {"confirm": "on"})

    assert r.status_code == 302 and r["Location"] == reverse("node", args=[node.pk])
    assert (f"Node “node-1” was not retired: node node-1 has 1 active lease (#{lease.pk})"
            in client.get(r["Location"]).content.decode())
    assert Node.objects.get(pk=node.pk).retired_at is None
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 200


def test_retire_needs_the_box_then_hides_the_node_and_keeps_its_page(client, provider):
    user, node, token = provider
    standing = ask(user, node).order
    r = client.post(reverse("node-retire-page", args=[node.pk]), {})
    assert r.status_code == 400 and "tick the box" in field_error(r.content.decode(),
                                                                   "confirm")
    assert Node.objects.get(pk=node.pk).retired_at is None

    r = client.post(reverse("node-retire-page", args=[node.pk]), {"confirm": "on"})

    assert r.status_code == 302 and r["Location"] == reverse("portal")
    portal = client.get(r["Location"]).content.decode()
    assert f"Node “node-1” retired; ask #{standing.pk} cancelled." in portal
    assert 'id="retired-nodes"' in portal
    nodes_table = portal[portal.index("<h2>Nodes</h2>"):portal.index('id="retired-nodes"')]
    assert "node-1" not in nodes_table
    assert f'<option value="{node.pk}"' not in portal  # no ask or auction for it
    assert Order.objects.get(pk=standing.pk).status == "cancelled"
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 401
    page = client.get(reverse("node", args=[node.pk])).content.decode()
    assert 'id="retired-note"' in page and "Retire node</button>" not in page
    assert "Rotate runner token</button>" not in page


def test_another_providers_node_is_404(client, provider):
    _, other, token = registered_node(RTX4090_DUMP, name="theirs")
    for action in ("node-rename-page", "node-retire-page"):
        assert client.post(reverse(action, args=[other.pk]),
                           {"name": "x", "confirm": "on"}).status_code == 404
    assert Node.objects.get(pk=other.pk).name == "theirs"
    assert runner_client(token).get("/api/v1/runner/leases/").status_code == 200


def _token_page(client, name: str) -> str:
    r = client.post(reverse("node-add"), {"name": name})
    assert r.status_code == 201
    return r.content.decode()


def test_the_token_page_has_a_copy_button_and_no_inline_script(client, provider):
    html = _token_page(client, "fresh")
    assert re.search(r'<button type="button"[^>]*data-copy="#runner-token"', html)
    assert "frontend/copy.js" in html
    content = html[html.index('id="token-h"'):]
    assert "<script>" not in content and "onclick" not in content


def test_the_simulate_hint_names_a_recording_no_node_registered(client, provider):
    # the H100 recording is registered (as `make demo` registers it): never suggested
    html = _token_page(client, "fresh")
    hint = re.search(r'id="simulate-hint".*?</p>', html, re.S).group(0)
    assert "--simulate data/nvidia-smi/a10-x1.driver-535.129.03.txt" in hint
    user = provider[0]
    registered_node(A10_DUMP, name="a10", user=user)  # now the A10 is taken too
    hint = re.search(r'id="simulate-hint".*?</p>', _token_page(client, "fresher"), re.S)
    assert "--simulate data/nvidia-smi/titan-v-x1.driver-560.35.03.txt" in hint.group(0)


def test_the_suggested_recording_registers_on_a_new_node(provider):
    """What the hint names is accepted by a fresh node: none of its GPUs is registered."""
    user = provider[0]
    for taken in (RTX4090_DUMP, A10_DUMP):
        registered_node(taken, name=taken.stem[:20], user=user)
    suggested = recordings.unregistered_dump()
    assert suggested and "h100" not in suggested and "rtx-4090" not in suggested
    assert "a10-x1" not in suggested
    registered_node(DATA / suggested.removeprefix("data/"), name="new", user=user)
    assert recordings.unregistered_dump() != suggested
