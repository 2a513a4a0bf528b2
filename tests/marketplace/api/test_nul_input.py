"""Issue 10, item 6: a NUL character (and a lone surrogate, which UTF-8 cannot store) in
any string of any JSON body — user API and runner endpoints, a value or a key, at any
depth — is a 400 naming where it is, and nothing is written. Before the fix a NUL in a
benchmark's `raw` (PostgreSQL jsonb) was a 500. JSON fields have size and depth limits, and
a heartbeat lists at most one reading per GPU of its node."""

from __future__ import annotations

import json
import logging
import re
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from marketplace import auctions, book
from marketplace.api.bid_batcher import parse_bid
from marketplace.models import ApiToken, Auction, Lease
from providers.models import Gpu, GpuBenchmark, LeaseLog, Node, Provider
from providers.runner.nvsmi import parse_dump
from settlement.models import ChainAddress
from tests.factories import (
    H100_DUMP,
    RTX4090_DUMP,
    UserFactory,
    funded_buyer,
    in_a_day,
    registered_node,
)
from tests.support.api import assert_refused, client_for, runner_client, snapshot

pytestmark = pytest.mark.django_db
NUL = "a\x00b"
SURROGATE = "a\ud800b"
H100 = "h100-sxm-80gb"


@pytest.fixture
def world(settings):
    settings.GPUMARKET_DEV_CREDIT = True
    provider, node, token = registered_node()
    _, lot_node, _ = registered_node(RTX4090_DUMP, name="node-2", user=provider)
    buyer = funded_buyer(100)
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_000_000, gpus=2, available_until=in_a_day())
    [lease] = book.place_bid(buyer_id=buyer.pk, market_slug=H100, price=2_000_000, gpus=2,
                             duration_seconds=3600).leases
    lot = auctions.open_auction(provider_id=provider.pk, node_id=lot_node.pk, gpus=2,
                                reserve_price=1_000_000, duration_seconds=3600,
                                closes_at=timezone.now() + timedelta(minutes=5))
    newcomer = UserFactory()
    w = SimpleNamespace(provider=provider, node=node, token=token, buyer=buyer,
                        newcomer=newcomer, lease=lease, lot=lot, lot_node=lot_node,
                        gpu=Gpu.objects.filter(node=node).order_by("pk").first())
    # each user's API client (and so its token) made before any snapshot
    w.clients = {who: client_for(user) for who, user in
                 (("buyer", buyer), ("provider", provider), ("newcomer", newcomer))}
    w.clients[None] = client_for()
    return w


def _state(w) -> dict:
    """Everything a refused body must leave as it was."""
    return {
        **snapshot(w.buyer, w.provider),
        "rows": [m.objects.count() for m in (get_user_model(), ApiToken, Provider, Node, Gpu,
                                             GpuBenchmark, LeaseLog, Auction, ChainAddress)],
        "nodes": list(Node.objects.order_by("pk").values_list(
            "name", "hostname", "driver_version", "runtime", "last_heartbeat_at")),
        "gpus": list(Gpu.objects.order_by("pk").values_list("uuid", "last_health",
                                                            "findings", "healthy")),
        "leases": list(Lease.objects.order_by("pk").values_list("status", "container_id")),
    }


# (name, who posts, url, a valid body, the paths of its strings)
def _endpoints(w):
    inventory = parse_dump(H100_DUMP)
    return [
        ("bid", "buyer", "/api/v1/orders/",
         {"side": "bid", "gpu_class": H100, "price": "1.00", "gpus": 1, "hours": 1,
          "time_in_force": "GTC", "image": "gpumarket/busybox:local",
          "command": ["echo", "hi"], "client_order_id": "c-1",
          "expires_at": in_a_day().isoformat()},
         ["side", "gpu_class", "price", "time_in_force", "image", "command[1]",
          "client_order_id", "expires_at"]),
        ("ask", "provider", "/api/v1/orders/",
         {"side": "ask", "node": w.node.pk, "gpu_class": H100, "price": "3.00", "gpus": 1,
          "available_until": in_a_day().isoformat()},
         ["gpu_class", "price", "available_until"]),
        ("auction", "provider", "/api/v1/auctions/",
         {"node": w.lot_node.pk, "gpus": 1, "reserve_price": "1.00", "hours": 1,
          "rule": "second_price", "closes_at": in_a_day().isoformat()},
         ["reserve_price", "rule", "closes_at"]),
        ("sealed bid", "buyer", f"/api/v1/auctions/{w.lot.pk}/bids/",
         {"price": "1.50", "image": "gpumarket/busybox:local", "command": ["sleep", "1"]},
         ["price", "image", "command[0]"]),
        ("signup", None, "/api/v1/signup/",
         {"username": "newcomer", "password": "a long passphrase 9", "email": "n@example.com"},
         ["username", "password", "email"]),
        ("token", None, "/api/v1/auth/token/",
         {"username": w.buyer.username, "password": "correct-horse-battery"},
         ["username", "password"]),
        ("provider", "newcomer", "/api/v1/providers/", {"display_name": "Acme 2"},
         ["display_name"]),
        ("node", "provider", "/api/v1/nodes/", {"name": "node-9"}, ["name"]),
        ("dev credit", "buyer", "/api/v1/wallet/dev-credit/", {"amount": "5.00"}, ["amount"]),
        ("chain address", "buyer", "/api/v1/chain/address/",
         {"address": "0x" + "1" * 40}, ["address"]),
        ("inventory", "runner", "/api/v1/runner/inventory/",
         {"hostname": "h", "driver_version": inventory.driver_version, "cuda_version": "12.2",
          "runner_version": "0.2.0", "source": "simulate",
          "gpus": [g.as_protocol() for g in inventory.gpus]},
         ["hostname", "driver_version", "cuda_version", "runner_version", "source",
          "gpus[0].uuid", "gpus[0].product_name", "gpus[0].gpu_class", "gpus[0].pci_bus_id",
          "gpus[3].mig_mode"]),
        ("heartbeat", "runner", "/api/v1/runner/heartbeat/",
         {"runtime": "docker", "gpus": [{"uuid": w.gpu.uuid, "temperature_c": 41}],
          "findings": [{"uuid": w.gpu.uuid, "rule": "temperature", "severity": "warn",
                        "evidence": "warm"}]},
         ["runtime", "gpus[0].uuid", "findings[0].uuid", "findings[0].rule",
          "findings[0].severity", "findings[0].evidence"]),
        ("benchmark", "runner", "/api/v1/runner/benchmarks/",
         {"runner_version": "0.2.0", "backend": "torch", "results": [
             {"uuid": w.gpu.uuid, "measured_at": timezone.now().isoformat(), "correct": True,
              "bf16_tflops": 794.1, "fp16_tflops": 801.5, "memory_bandwidth_gbps": "3010.2",
              "host_to_device_gbps": 51.3, "device_to_host_gbps": 49.8,
              "raw": {"note": "ok", "n": 8192, "runs": [{"device": "cuda:0"}]}}]},
         ["runner_version", "backend", "results[0].uuid", "results[0].measured_at",
          "results[0].memory_bandwidth_gbps", "results[0].raw.note",
          "results[0].raw.runs[0].device"]),
        ("lease event", "runner", f"/api/v1/runner/leases/{w.lease.pk}/events/",
         {"status": "starting", "container_id": "c0ffee", "cause": "pulled"},
         ["status", "container_id", "cause"]),
        ("lease logs", "runner", f"/api/v1/runner/leases/{w.lease.pk}/logs/",
         {"tail": "step 1\n"}, ["tail"]),
    ]


def _client(w, who):
    if who == "runner":
        return runner_client(w.token)
    return w.clients[who if who in w.clients else None]


_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _put(body, path: str, value):
    """`body` with the string at `path` (`a.b[0].c`) replaced by `value` (a deep copy)."""
    body = json.loads(json.dumps(body))
    keys = [name if name is not None and name != "" else int(i)
            for name, i in _TOKEN.findall(path)]
    at = body
    for key in keys[:-1]:
        at = at[key]
    at[keys[-1]] = value
    return body


def _post(client, url, body):
    # sent as most clients do (ensure_ascii: NUL and surrogates as \u escapes)
    return client.post(url, json.dumps(body), content_type="application/json")


ENDPOINT_NAMES = ["bid", "ask", "auction", "sealed bid", "signup", "token", "provider", "node",
                  "dev credit", "chain address", "inventory", "heartbeat", "benchmark",
                  "lease event", "lease logs"]


@pytest.mark.parametrize("name", ENDPOINT_NAMES)
def test_a_nul_in_any_string_of_any_endpoint_is_a_400_naming_it(world, name):
    [(_, who, url, body, paths)] = [e for e in _endpoints(world) if e[0] == name]
    for path in paths:
        for bad in (NUL, SURROGATE, "\x00"):
            before = _state(world)
            r = _post(_client(world, who), url, _put(body, path, bad))
            assert_refused(r, path, contains="must not contain")
            assert _state(world) == before, (name, path)


@pytest.mark.parametrize("name", ENDPOINT_NAMES)
def test_the_valid_bodies_above_are_accepted(world, name):
    """The sanity check of the test above: each body it spoils is accepted as it is."""
    [(_, who, url, body, _)] = [e for e in _endpoints(world) if e[0] == name]
    r = _post(_client(world, who), url, body)
    assert r.status_code in (200, 201), r.content


@pytest.mark.parametrize(("name", "body_of", "field"), [
    ("bid key", lambda b: {**b, "pri\x00ce": "1.00"}, "pri\\u0000ce"),
    ("raw key", lambda b: _put(b, "results[0].raw", {"no\x00te": 1}),
     "results[0].raw.no\\u0000te"),
    ("nested raw key", lambda b: _put(b, "results[0].raw", {"a": [{"b\ud800": 1}]}),
     "results[0].raw.a[0].b\\ud800"),
    ("heartbeat key", lambda b: _put(b, "gpus[0]", {"uuid": "GPU-x", "\x00": 1}),
     "gpus[0].\\u0000"),
])
def test_a_nul_in_a_key_is_refused_naming_the_key_escaped(world, name, body_of, field):
    endpoints = {e[0]: e for e in _endpoints(world)}
    source = "bid" if name == "bid key" else "heartbeat" if "heartbeat" in name \
        else "benchmark"
    _, who, url, body, _ = endpoints[source]
    before = _state(world)
    assert_refused(_post(_client(world, who), url, body_of(body)), field,
                   contains="must not contain")
    assert _state(world) == before


def test_the_bid_fast_path_hands_a_nul_to_the_drf_view():
    body = {"side": "bid", "gpu_class": H100, "price": "1.00", "gpus": 1, "hours": 1}
    assert parse_bid(json.dumps(body).encode()) is not None
    assert parse_bid(json.dumps({**body, "image": NUL}).encode()) is None


def test_an_escaped_backslash_before_u0000_is_no_nul(world):
    """`"\\\\u0000"` in JSON is the six characters \\u0000, not a NUL: accepted."""
    _, who, url, _, _ = {e[0]: e for e in _endpoints(world)}["lease logs"]
    r = _post(_client(world, who), url, {"tail": "printf '\\u0000'\n"})
    assert r.status_code == 200, r.content
    assert LeaseLog.objects.get().tail == "printf '\\u0000'\n"


# --- JSON limits ------------------------------------------------------------------------

def _benchmark(world, raw):
    _, who, url, body, _ = {e[0]: e for e in _endpoints(world)}["benchmark"]
    return _post(_client(world, who), url, _put(body, "results[0].raw", raw))


def test_benchmark_raw_is_at_most_8_levels_deep(world):
    deep = {"x": 1}
    for _ in range(7):
        deep = {"x": deep}  # 8 levels
    assert _benchmark(world, deep).status_code == 201
    before = _state(world)
    assert_refused(_benchmark(world, {"x": deep}), "results[0].raw", contains="8 levels")
    assert_refused(_benchmark(world, {"x": [[[[[[[[1]]]]]]]]}), "results[0].raw",
                   contains="8 levels")
    assert _state(world) == before


def test_benchmark_raw_is_at_most_16_kib_and_an_object(world):
    assert _benchmark(world, {"note": "x" * (16 * 1024 - 20)}).status_code == 201
    before = _state(world)
    assert_refused(_benchmark(world, {"note": "x" * (16 * 1024)}), "results[0].raw",
                   contains="16 KiB")
    assert_refused(_benchmark(world, {"note": "é" * (8 * 1024)}), "results[0].raw",
                   contains="16 KiB")  # 16 KiB of UTF-8, 8 K characters
    assert_refused(_benchmark(world, ["not", "an", "object"]), "results[0].raw",
                   contains="JSON object")
    assert _state(world) == before


def test_a_body_over_the_request_limit_is_refused(world, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024
    _, who, url, _, _ = {e[0]: e for e in _endpoints(world)}["lease logs"]
    before = _state(world)
    r = _post(_client(world, who), url, {"tail": "x" * (64 * 1024)})
    assert r.status_code == 413 and "too large" in r.json()["detail"]
    assert _state(world) == before


def test_the_request_limit_is_set_explicitly():
    from django.conf import settings

    assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE == 2 * 1024 * 1024


# --- heartbeats: bounded by the node's GPUs -------------------------------------------------

def test_a_heartbeat_with_more_readings_than_gpus_is_refused_naming_gpus(world, caplog):
    gpus = list(Gpu.objects.filter(node=world.node).values_list("uuid", flat=True))
    readings = [{"uuid": f"GPU-{i:08x}-0000-0000-0000-000000000000"} for i in range(40_000)]
    before = _state(world)
    with caplog.at_level(logging.WARNING):
        # the attack's 1.8 MB heartbeat: 40,000 readings of GPUs not of this node
        r = _post(runner_client(world.token), "/api/v1/runner/heartbeat/",
                  {"gpus": readings[:30_000]})
        assert_refused(r, "gpus", contains="no more than 64")
        r = _post(runner_client(world.token), "/api/v1/runner/heartbeat/",
                  {"gpus": readings[:len(gpus) + 1]})
        assert_refused(r, "gpus", contains=f"the node has {len(gpus)} GPUs")
        # one more reading than the node has GPUs (the same GPU twice)
        r = _post(runner_client(world.token), "/api/v1/runner/heartbeat/",
                  {"gpus": [{"uuid": u} for u in [*gpus, gpus[0]]]})
        assert_refused(r, "gpus", contains=f"the node has {len(gpus)} GPUs")
    assert _state(world) == before
    assert not [r for r in caplog.records if "heartbeat of node" in r.getMessage()]


def test_heartbeat_warnings_are_capped_in_the_answer_and_the_log(world, caplog):
    stranger = [{"uuid": f"GPU-{i:08x}-0000-0000-0000-000000000000", "rule": "xid",
                 "severity": "warn", "evidence": "x"} for i in range(300)]
    with caplog.at_level(logging.WARNING, logger="providers.services"):
        r = _post(runner_client(world.token), "/api/v1/runner/heartbeat/",
                  {"gpus": [], "findings": stranger})
    assert r.status_code == 200, r.content
    warnings = r.json()["warnings"]
    assert len(warnings) == 21 and warnings[-1] == "and 280 more items ignored"
    assert warnings[0].startswith("findings[0].uuid: GPU-00000000")
    lines = [x for x in caplog.records if "heartbeat of node" in x.getMessage()]
    assert len(lines) == 1 and "and 280 more items ignored" in lines[0].getMessage()
