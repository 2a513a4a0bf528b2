"""GPU registration under real concurrency, on PostgreSQL (issue 10, item 8).

Two nodes' runners post an inventory naming the same new GPU UUID at the same moment
(two threads, each with its own database connection, through the HTTP API, starting
together on a barrier). Exactly one of them owns the GPU afterwards and is told so (200);
the other gets the 409 "GPU … is registered to another node", and the GPU stays on the
winner. Before the fix, the "another node" check ran outside the transaction and
`update_or_create` handed the row to the last writer: both runners got 200 and the GPU
moved to the second node.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

import pytest
from django.db import connections

from providers import services as provider_services
from providers.models import Gpu
from tests.factories import UserFactory, ensure_catalog
from tests.support.api import runner_client

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = 20


def _node(name: str):
    """A provider with a node that has no GPUs yet → (node, runner token)."""
    ensure_catalog()
    user = UserFactory()
    provider = provider_services.provider_onboard(user_id=user.pk, display_name=name)
    created = provider_services.node_create(provider=provider, name=name)
    return created.node, created.runner_token


def _inventory(*uuids: str) -> dict:
    return {"hostname": "host", "driver_version": "535.183.01", "cuda_version": "12.2",
            "runner_version": "test", "source": "test",
            "gpus": [{"uuid": u, "product_name": "NVIDIA H100 80GB HBM3",
                      "gpu_class": "h100-sxm-80gb", "memory_mib": 81559,
                      "pci_bus_id": f"00000000:{i + 0x10:02X}:00.0", "mig_mode": ""}
                     for i, u in enumerate(uuids)]}


def _at_once(calls: list[Callable[[], object]]) -> list:
    """Run the calls in one thread each, released together; their results in call order
    (an exception is a result too). Each thread closes its own connections."""
    results: list = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def worker(i: int) -> None:
        try:
            start.wait(timeout=30)
            results[i] = calls[i]()
        except BaseException as exc:  # part of the outcome
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a registration is still running"
    return results


def _register(token: str, *uuids: str) -> Callable[[], object]:
    return lambda: runner_client(token).post("/api/v1/runner/inventory/", _inventory(*uuids),
                                             format="json")


def _new_uuid() -> str:
    return f"GPU-{uuid.uuid4()}"


def test_two_nodes_racing_for_one_new_gpu_exactly_one_wins_every_round():
    nodes = [_node("a"), _node("b")]
    for round_no in range(ROUNDS):
        gpu = _new_uuid()
        answers = _at_once([_register(token, gpu) for _, token in nodes])
        statuses = [getattr(a, "status_code", a) for a in answers]
        assert sorted(statuses) == [200, 409], (round_no, statuses)
        winner = statuses.index(200)
        loser = answers[1 - winner].json()
        assert loser["detail"] == f"gpus: GPU {gpu} is registered to another node", loser
        assert loser["errors"] == {"gpus": [f"GPU {gpu} is registered to another node"]}
        assert gpu in [g["uuid"] for g in answers[winner].json()["node"]["gpus"]]
        assert Gpu.objects.get(uuid=gpu).node_id == nodes[winner][0].pk, round_no
    assert Gpu.objects.count() == ROUNDS


def test_overlapping_lists_in_any_order_never_deadlock_or_split_the_gpus():
    """Each node lists two new UUIDs, in opposite orders: one node gets both, the other a
    409 and none (all or nothing), never a deadlock's 500."""
    nodes = [_node("a"), _node("b")]
    for round_no in range(ROUNDS // 2):
        x, y = _new_uuid(), _new_uuid()
        answers = _at_once([_register(nodes[0][1], x, y), _register(nodes[1][1], y, x)])
        statuses = [getattr(a, "status_code", a) for a in answers]
        assert sorted(statuses) == [200, 409], (round_no, statuses)
        winner = nodes[statuses.index(200)][0]
        assert set(Gpu.objects.filter(uuid__in=[x, y]).values_list("node", flat=True)) == \
            {winner.pk}, round_no


def test_one_node_registering_twice_at_once_gets_200_both_times():
    """A runner started twice (or `register` while `run` re-announces): the same node,
    the same new GPU, at once: no conflict with itself."""
    node, token = _node("a")
    for round_no in range(ROUNDS // 2):
        gpu = _new_uuid()
        answers = _at_once([_register(token, gpu), _register(token, gpu)])
        statuses = [getattr(a, "status_code", a) for a in answers]
        assert statuses == [200, 200], (round_no, statuses, [
            getattr(a, "content", b"")[:200] for a in answers])
        assert Gpu.objects.get(uuid=gpu).node_id == node.pk
