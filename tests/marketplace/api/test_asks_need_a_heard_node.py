"""An ask is refused on a node whose runner was never heard (or is silent now), and on a
MIG-enabled GPU that has no slices, naming why (409 `node`); the portal never calls such
a node healthy."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace.models import Order
from providers import services as provider_services
from providers.models import Node
from providers.runner import mig as runner_mig
from tests.factories import UserFactory, ask_body, ensure_catalog, registered_node
from tests.support.api import assert_refused, client_for
from tests.support.mig_host import A100_MIG

pytestmark = pytest.mark.django_db


def _never_heard():
    user, node, _ = registered_node()
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=None)
    return user, node


def test_an_ask_on_a_node_never_heard_is_refused_naming_run():
    user, node = _never_heard()
    r = client_for(user).post("/api/v1/orders/", ask_body(node), format="json")
    body = assert_refused(r, "node", status=409, contains=f"node {node.name} has never sent "
                          "a heartbeat: start its runner (gpumarket-runner run)")
    assert "gpumarket-runner run" in body["detail"]
    assert not Order.objects.exists()


def test_an_ask_on_a_silent_node_is_refused_then_accepted_once_it_heartbeats(settings):
    user, node, _ = registered_node()
    old = timezone.now() - timedelta(seconds=settings.GPUMARKET_HEARTBEAT_TIMEOUT_SECONDS + 5)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=old)
    r = client_for(user).post("/api/v1/orders/", ask_body(node), format="json")
    assert_refused(r, "node", status=409, contains=f"node {node.name} is silent")
    provider_services.heartbeat_record(node=Node.objects.get(pk=node.pk), runtime="docker",
                                       gpus=[])
    r = client_for(user).post("/api/v1/orders/", ask_body(node), format="json")
    assert r.status_code == 201, r.content


def test_an_ask_on_a_mig_enabled_gpu_without_slices_is_refused_naming_mig():
    ensure_catalog()
    user = UserFactory()
    provider = provider_services.provider_onboard(user_id=user.pk, display_name="Acme")
    node = provider_services.node_create(provider=provider, name="a100").node
    gpu = replace(A100_MIG.gpus[0], mig_devices=())  # MIG on, no MIG device
    provider_services.inventory_record(
        node=node, hostname="a100", driver_version=A100_MIG.driver_version,
        cuda_version=A100_MIG.cuda_version, runner_version="t", source="simulate",
        gpus=runner_mig.inventory_items(replace(A100_MIG, gpus=[gpu])))
    provider_services.heartbeat_record(node=node, runtime="docker", gpus=[])
    for changes in ({}, {"gpu_class": "a100-sxm-80gb"}):
        r = client_for(user).post("/api/v1/orders/", ask_body(node, **changes), format="json")
        assert_refused(r, "node", status=409, contains=f"GPU {gpu.uuid} is MIG-enabled with "
                       "no MIG devices, and a MIG-enabled GPU is never leased whole")
    assert not Order.objects.exists()


def test_the_portal_calls_a_node_never_heard_not_healthy(client):
    user, node = _never_heard()
    client.force_login(user)
    page = client.get("/provider/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "runner never heard from" in text
    row = text[text.index(node.name):]
    assert ">healthy<" not in row[:row.index("</tr>")]
    page = client.get(f"/provider/nodes/{node.pk}/")
    assert page.status_code == 200 and "Runner never heard from" in page.content.decode()
