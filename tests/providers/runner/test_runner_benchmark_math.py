"""The arithmetic and the verdict of providers/runner/benchmark.py, without torch or CuPy.

This machine has no GPU: the elapsed times below are chosen by the test, they are not
measurements. What is checked: the FLOP count (2·n³ per n×n product) and the units
(TFLOPS = 10^12 FLOP/s from milliseconds; GB/s = 10^9 bytes/s), the correctness verdict
(NaN and infinity fail), and that a failed result whose products held NaN is still
reported as failed: strict JSON (httpx refuses NaN) through the real marketplace API."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import httpx
import pytest
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections

from providers.models import GpuBenchmark
from providers.runner import benchmark as bench
from providers.runner.client import MarketplaceClient
from tests.factories import registered_node


def test_matmul_tflops_counts_two_n_cubed_flop_per_product_from_milliseconds():
    # 20 products of 8192 × 8192 in 31 ms: 2 · 8192³ · 20 FLOP / 0.031 s
    assert bench.matmul_tflops(8192, 20, 31.0) == pytest.approx(709.3623, rel=1e-6)
    assert bench.matmul_tflops(1000, 1, 2.0) == pytest.approx(1.0)  # 2e9 FLOP in 2 ms
    # twice the size: eight times the work
    assert bench.matmul_tflops(2000, 1, 2.0) == pytest.approx(8.0)


def test_bandwidth_is_gigabytes_per_second_from_milliseconds():
    assert bench.bandwidth_gbps(10**9, 1, 1000.0) == pytest.approx(1.0)
    # 256 MiB host→device, 20 times in 100 ms
    assert bench.bandwidth_gbps(1 << 28, 20, 100.0) == pytest.approx(53.687091)
    # a 1 GiB device-to-device copy passes 2 GiB (read + write): the caller says so
    assert bench.bandwidth_gbps(2 * (1 << 30), 20, 10.0) == pytest.approx(4294.967296)


@pytest.mark.parametrize(("rel", "transfer_ok", "expected"), [
    (0.0, True, True), (0.0017, True, True), (bench.MAX_REL_ERROR, True, True),
    (0.0101, True, False), (1.414, True, False),
    (math.nan, True, False), (math.inf, True, False), (-math.inf, True, False),
    (0.0017, False, False),
])
def test_the_verdict(rel, transfer_ok, expected):
    assert bench.passed(rel, transfer_ok) is expected


def _failed_with(rel_error: float, uuid: str) -> bench.BenchmarkResult:
    """A result the test wrote (not a measurement): a product came back with NaN/inf."""
    device = bench.DeviceResult(
        index=0, name="NVIDIA H100 80GB HBM3", dtype="bf16", matmul_tflops=701.3,
        memory_gbps=3010.5, rel_error=rel_error, correct=bench.passed(rel_error, True),
        uuid=uuid, bf16_tflops=701.3, fp16_tflops=702.0, h2d_gbps=51.3, d2h_gbps=49.8)
    return bench.BenchmarkResult(True, "1 device(s), n=8192", "torch", [device],
                                 datetime.now(UTC), 8192)


@pytest.mark.parametrize(("rel", "text"), [(math.nan, "nan"), (math.inf, "inf")])
def test_a_non_finite_error_is_reported_as_failed_in_strict_json(rel, text):
    uuid = "GPU-566e6f65-c38e-b12f-4824-6944218668b9"
    result = _failed_with(rel, uuid)
    # what `run` gets back from its child (`benchmark --json`): Python reads NaN back
    result = bench.BenchmarkResult.from_dict(json.loads(json.dumps(result.as_dict())))
    body, notes = bench.report_body(result, "0.2.0", [uuid])
    assert notes == [] and body["results"][0]["correct"] is False
    assert body["results"][0]["raw"]["rel_error"] == text
    json.dumps(body, allow_nan=False)  # strict JSON
    httpx.Request("POST", "http://testserver/api/v1/runner/benchmarks/", json=body)
    assert "WRONG RESULT" in result.lines()[1]


def test_a_finite_error_is_sent_as_a_number():
    body, _ = bench.report_body(_failed_with(0.0031, "GPU-566e6f65-c38e-b12f-4824-"
                                             "6944218668b9"), "0.2.0", None)
    assert body["results"][0]["raw"]["rel_error"] == 0.0031
    assert body["results"][0]["correct"] is True


@pytest.fixture
def _keep_the_test_connection():
    """The WSGI handler closes the database connection after each request (which would
    end the test's transaction); Django's test client switches that off the same way."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.mark.django_db
@pytest.mark.usefixtures("_keep_the_test_connection")
def test_a_nan_result_is_stored_as_failed_through_the_real_api():
    _, node, token = registered_node()
    uuid = node.gpus.order_by("pci_bus_id").values_list("uuid", flat=True)[0]
    client = MarketplaceClient("http://testserver", token,
                               transport=httpx.WSGITransport(app=get_wsgi_application()))
    logged = []
    try:
        sent = bench.post_result(client, _failed_with(math.nan, uuid), "0.2.0", [uuid],
                                 logged.append)
    finally:
        client.close()
    assert sent == 1
    assert logged[-1] == "benchmark reported for 1 GPU(s) (0 passed the correctness check)"
    stored = GpuBenchmark.objects.get(gpu__uuid=uuid)
    assert not stored.correct and stored.raw["rel_error"] == "nan"


@pytest.mark.django_db
@pytest.mark.usefixtures("_keep_the_test_connection")
def test_a_failed_gpus_absurd_figures_do_not_get_the_report_refused():
    """A broken GPU may time absurdly (here 1e9 TFLOPS, far past any datasheet): its failed
    result carries its figures in raw only, so the server's plausibility check cannot
    refuse the whole report, and the good GPU's result beside it is stored too."""
    _, node, token = registered_node()
    good_uuid, bad_uuid = node.gpus.order_by("pci_bus_id").values_list("uuid", flat=True)[:2]
    good = _failed_with(0.0031, good_uuid).devices[0]
    bad = bench.DeviceResult(
        index=1, name="NVIDIA H100 80GB HBM3", dtype="bf16", matmul_tflops=1e9,
        memory_gbps=9e9, rel_error=0.7, correct=bench.passed(0.7, True), uuid=bad_uuid,
        bf16_tflops=1e9, fp16_tflops=None, h2d_gbps=51.3, d2h_gbps=49.8)
    result = bench.BenchmarkResult(True, "2 device(s), n=8192", "torch", [good, bad],
                                   datetime.now(UTC), 8192)
    body, _ = bench.report_body(result, "0.2.0", [good_uuid, bad_uuid])
    failed = body["results"][1]
    assert failed["correct"] is False and failed["bf16_tflops"] is None
    assert failed["raw"]["figures"]["bf16_tflops"] == 1e9
    client = MarketplaceClient("http://testserver", token,
                               transport=httpx.WSGITransport(app=get_wsgi_application()))
    try:
        assert bench.post_result(client, result, "0.2.0", [good_uuid, bad_uuid],
                                 lambda _m: None) == 2
    finally:
        client.close()
    assert GpuBenchmark.objects.get(gpu__uuid=good_uuid).correct
    stored_bad = GpuBenchmark.objects.get(gpu__uuid=bad_uuid)
    assert not stored_bad.correct and stored_bad.bf16_tflops is None
