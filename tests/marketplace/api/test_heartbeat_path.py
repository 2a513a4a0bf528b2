"""The heartbeat's fast path under ASGI (marketplace/api/heartbeat_path.py): the lean
check never takes a body the DRF serializer refuses and gives what it gives; a valid
heartbeat is answered by the heartbeat batcher (heartbeat_batch.py) as the DRF view answers
it, alone or in a group; everything else reaches Django unchanged (its errors, its 401).
Real PostgreSQL (the batcher's thread has its own connection, so the tests commit), the
real ASGI application."""

from __future__ import annotations

import asyncio
import copy
import json
import random

import httpx
import pytest

from marketplace.api import heartbeat_batch, heartbeat_path
from marketplace.api.telemetry import HeartbeatIn
from marketplace.asgi import application
from providers.auth import INVALID_TOKEN
from providers.models import Gpu
from tests.factories import ensure_catalog, registered_node
from tests.support.api import runner_client

GOOD = {"uuid": "GPU-566e6f65-c38e-b12f-4824-6944218668b9", "temperature_c": 36,
        "power_w": 71.97, "utilization_pct": 0, "ecc_uncorrectable": 0}
FINDING = {"uuid": GOOD["uuid"], "rule": "hw_power_brake", "severity": "warn",
           "evidence": "HW power brake active: the host's power supply slows the GPU"}
ODD = [None, True, False, 0, -3, 2**70, 1.5, 1e308, "", " ", " x ", "x", "5", "GPU-1",
       "x" * 65, "x" * 1001, [], {}, ["a"], {"a": 1}, "warn", "fatal", "ok"]


def plain(value):
    return json.loads(json.dumps(value))


def odd(rng: random.Random):
    return copy.deepcopy(rng.choice(ODD))


def mutated(rng: random.Random) -> dict:
    """A runner-like heartbeat with one to three values replaced by odd ones."""
    body = {"runtime": "docker", "gpus": [dict(GOOD), {**GOOD, "uuid": "GPU-2"}],
            "findings": [dict(FINDING)], "telemetry": [{"lease": 1, "gpus": []}]}
    for _ in range(rng.randint(1, 3)):
        where = rng.choice(["top", "gpu", "finding", "drop", "extra"])
        if where == "top":
            body[rng.choice(["runtime", "gpus", "findings", "telemetry"])] = odd(rng)
        elif where == "gpu" and isinstance(body.get("gpus"), list) and body["gpus"]:
            item = body["gpus"][0]
            if isinstance(item, dict):
                item[rng.choice(list(GOOD))] = odd(rng)
        elif where == "finding" and isinstance(body.get("findings"), list) and body["findings"]:
            item = body["findings"][0]
            if isinstance(item, dict):
                item[rng.choice(list(FINDING))] = odd(rng)
        elif where == "drop":
            body.pop(rng.choice(["runtime", "gpus", "findings", "telemetry"]), None)
        else:
            body.setdefault("telemetry", [])
            if isinstance(body["telemetry"], list):
                body["telemetry"].append(odd(rng))
    return plain(body)


def test_the_lean_check_never_takes_what_the_serializer_refuses():
    rng = random.Random(17)
    taken = refused = 0
    for _ in range(3000):
        body = mutated(rng)
        lean = heartbeat_path.lean_heartbeat(body)
        drf = HeartbeatIn(data=body)
        if lean is None:
            refused += 1
            continue
        assert drf.is_valid(), (body, drf.errors)
        assert plain(dict(drf.validated_data)) == plain(lean), body
        assert lean["gpus"] == [dict(g) for g in drf.validated_data["gpus"]]  # types too
        taken += 1
    assert taken > 300 and refused > 300  # both kinds were tried
    runner = plain({"runtime": "docker", "gpus": [GOOD] * 8, "findings": [FINDING]})
    assert heartbeat_path.lean_heartbeat(runner) is not None  # what the runner sends


def test_the_lean_check_takes_the_serializer_limits():
    many = {"gpus": [{"uuid": f"GPU-{i}"} for i in range(65)]}
    assert heartbeat_path.lean_heartbeat(many) is None and not HeartbeatIn(data=many).is_valid()
    items = {"telemetry": [{}] * 65}
    assert heartbeat_path.lean_heartbeat(items) is None
    assert not HeartbeatIn(data=items).is_valid()
    odd = {"runtime": " docker "}  # a runtime is one of providers.api.RUNTIMES, exactly
    assert heartbeat_path.lean_heartbeat(odd) is None and not HeartbeatIn(data=odd).is_valid()
    trimmed = heartbeat_path.lean_heartbeat({"runtime": "docker", "gpus": [{"uuid": " G "}]})
    assert trimmed == {"runtime": "docker", "gpus": [{"uuid": "G"}], "findings": [],
                       "telemetry": [], "images": None}
    # a body with an `images` report (docs/IMAGES.md) goes to the serializer, whole
    assert heartbeat_path.lean_heartbeat({"gpus": [], "images": []}) is None
    assert heartbeat_path.lean_heartbeat({"gpus": [{"uuid": "G", "power_w": 72}]})[
        "gpus"][0]["power_w"] == 72.0


@pytest.fixture
def fresh_threads():
    ensure_catalog()
    heartbeat_batch._batcher = None
    yield
    if heartbeat_batch._batcher is not None:
        heartbeat_batch._batcher.stop()
    heartbeat_batch._batcher = None


def asgi_post(token: str | None, body=None, raw: bytes | None = None) -> httpx.Response:
    async def run():
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            if raw is not None:
                return await c.post(heartbeat_path.PATH, content=raw, headers={
                    **headers, "Content-Type": "application/json"})
            return await c.post(heartbeat_path.PATH, json=body, headers=headers)
    return asyncio.run(run())


def served() -> int:
    return heartbeat_batch._batcher.served if heartbeat_batch._batcher else 0


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_on_the_fast_path_answers_and_records_as_the_view(fresh_threads):
    _user, node, token = registered_node()
    uuids = list(Gpu.objects.filter(node=node).order_by("pk").values_list("uuid", flat=True))
    body = {"runtime": "docker",
            "gpus": [{**GOOD, "uuid": u} for u in uuids[:2]] + [{**GOOD, "uuid": "GPU-99"}],
            "findings": [{**FINDING, "uuid": uuids[0]}],
            "telemetry": [{"lease": 12345, "gpus": []}]}
    fast = asgi_post(token, body)
    assert served() == 1
    slow = runner_client(token).post(heartbeat_path.PATH, body, format="json")
    assert fast.status_code == slow.status_code == 200
    f, s = fast.json(), slow.json()
    assert f.keys() == s.keys() == {"server_time", "warnings", "telemetry_errors"}
    assert f["warnings"] == s["warnings"] and f["telemetry_errors"] == s["telemetry_errors"]
    assert fast.headers["content-type"] == "application/json"
    assert fast.headers["x-frame-options"] == slow.headers["X-Frame-Options"]
    assert fast.headers["x-request-id"]
    gpu = Gpu.objects.get(uuid=uuids[0])
    assert gpu.findings == [{**FINDING, "uuid": uuids[0]}]
    assert gpu.last_health["power_w"] == GOOD["power_w"] and gpu.last_health["at"]


@pytest.mark.django_db(transaction=True)
def test_what_the_fast_path_does_not_take_gets_the_views_answer(fresh_threads):
    _user, node, token = registered_node()
    uuid = Gpu.objects.filter(node=node).values_list("uuid", flat=True).first()
    bad = {"gpus": [{"uuid": uuid, "power_w": "hot"}]}
    fast = asgi_post(token, bad)
    slow = runner_client(token).post(heartbeat_path.PATH, bad, format="json")
    assert fast.status_code == slow.status_code == 400 and fast.json() == slow.json()
    unknown = asgi_post("gmr_not-a-token", {"gpus": []})
    assert unknown.status_code == 401 and unknown.json()["detail"] == INVALID_TOKEN
    too_many = {"gpus": [{"uuid": f"GPU-{i:08d}"} for i in range(9)]}
    fast = asgi_post(token, too_many)  # taken by the lean check, refused by the service
    slow = runner_client(token).post(heartbeat_path.PATH, too_many, format="json")
    assert fast.status_code == slow.status_code == 400 and fast.json() == slow.json()
    broken = asgi_post(token, raw=b'{"gpus": [')
    assert broken.status_code == 400
    assert served() == 1  # only the one with too many readings reached a heartbeat thread
    assert Gpu.objects.get(uuid=uuid).last_health == {}
