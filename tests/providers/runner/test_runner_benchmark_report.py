"""The runner's side of benchmarks, against the real marketplace API: the runner's own
MarketplaceClient speaks HTTP to Django's WSGI application (httpx.WSGITransport), in the
test's database transaction.

This machine has no GPU, so the measurement itself (providers/runner/benchmark.py:
torch/CuPy matmul, copies) cannot run here. What is tested: its no-GPU behaviour (it says
so, reports nothing, invents no number) and the reporting of a *given* result — the
DeviceResult figures below are written by the test, not measured — plus the schedule of
`run` (only when due, only while the node is idle)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal

import httpx
import pytest
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections

from providers.models import GpuBenchmark
from providers.runner import benchmark as bench
from providers.runner.agent import Agent
from providers.runner.client import MarketplaceClient
from providers.runner.nvml import DumpGpus
from tests.factories import H100_DUMP, registered_node

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _keep_the_test_connection():
    """The WSGI handler closes the database connection after each request (which would
    end the test's transaction); Django's test client switches that off the same way."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def _client(token: str) -> MarketplaceClient:
    transport = httpx.WSGITransport(app=get_wsgi_application())
    return MarketplaceClient("http://testserver", token, transport=transport)


def _given(uuid: str | None, *, index=0, correct=True, bf16=794.1) -> bench.DeviceResult:
    """A device result with figures the test chose (not a measurement)."""
    return bench.DeviceResult(index=index, name="NVIDIA H100 80GB HBM3", dtype="bf16",
                              matmul_tflops=bf16, memory_gbps=3010.5, rel_error=0.0031,
                              correct=correct, uuid=uuid, bf16_tflops=bf16, fp16_tflops=800.2,
                              h2d_gbps=51.3, d2h_gbps=49.8)


def _result(*devices) -> bench.BenchmarkResult:
    return bench.BenchmarkResult(True, f"{len(devices)} device(s), n=8192", "torch",
                                 list(devices), datetime.now(UTC), 8192)


def test_without_a_gpu_nothing_is_measured_or_reported(tmp_path):
    result = bench.run_benchmark()
    assert not result.ran and result.devices == [] and bench.available() is None
    body, notes = bench.report_body(result, "0.2.0")
    assert body is None and notes == [result.reason]

    class NoCalls:
        def post_benchmarks(self, body):
            raise AssertionError("nothing may be reported without a measurement")

    assert bench.post_result(NoCalls(), result, "0.2.0", None, lambda m: None) == 0
    # the CLI with a marketplace configured: says so, exit 2, contacts nobody (the URL
    # answers nothing; a report attempt would fail with exit status 1)
    done = subprocess.run(
        [sys.executable, "-m", "providers.runner", "benchmark", "--url", "http://127.0.0.1:9",
         "--token", "gmr_x", "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stdout.startswith("no GPU: benchmark not run") and done.stderr == ""
    # `run`'s child process gives the same, as a result without figures
    child = bench.run_in_subprocess()
    assert not child.ran and child.reason.startswith("no GPU: benchmark not run")


def test_a_given_result_is_reported_through_the_real_api():
    _, node, token = registered_node()
    uuids = list(node.gpus.order_by("pci_bus_id").values_list("uuid", flat=True))
    result = _result(_given(uuids[0]), _given(uuids[1], index=1, correct=False, bf16=12.0),
                     _given("GPU-ffffffff-0000-0000-0000-000000000000", index=2))
    logged = []
    client = _client(token)
    try:
        sent = bench.post_result(client, result, "0.2.0", uuids, logged.append)
    finally:
        client.close()
    assert sent == 2
    assert any("GPU-ffffffff" in m and "not in this node's inventory" in m for m in logged)
    assert logged[-1] == "benchmark reported for 2 GPU(s) (1 passed the correctness check)"
    good = GpuBenchmark.objects.get(gpu__uuid=uuids[0])
    assert (good.bf16_tflops, good.fp16_tflops, good.memory_bandwidth_gbps) == \
        (Decimal("794.1"), Decimal("800.2"), Decimal("3010.5"))
    assert (good.host_to_device_gbps, good.device_to_host_gbps) == (Decimal("51.3"),
                                                                      Decimal("49.8"))
    assert good.correct and good.runner_version == "0.2.0" and good.raw["n"] == 8192
    assert good.measured_at == result.measured_at
    assert not GpuBenchmark.objects.get(gpu__uuid=uuids[1]).correct


def test_the_round_trip_through_json_keeps_the_result():
    result = _result(_given("GPU-566e6f65-c38e-b12f-4824-6944218668b9"))
    again = bench.BenchmarkResult.from_dict(json.loads(json.dumps(result.as_dict())))
    assert again == result


@pytest.mark.parametrize(("raw", "expected"), [
    (bytes(range(16)), "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"),
    ("00010203-0405-0607-0809-0a0b0c0d0e0f", "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"),
    ("GPU-abc", "GPU-abc"), ("MIG-abc", "MIG-abc"), ("nonsense", None), (None, None),
    (b"short", None),
])
def test_cuda_uuids_are_spelt_as_nvml_does(raw, expected):
    assert bench.nvml_uuid(raw) == expected


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class _NoWorkloads:
    name = "process"
    node = ""

    def __init__(self):
        self.handles = {}

    def list_leases(self):
        return dict(self.handles)


def test_run_benchmarks_on_schedule_only_while_idle():
    _, node, token = registered_node()
    uuids = list(node.gpus.order_by("pci_bus_id").values_list("uuid", flat=True))
    clock, runtime, runs, logged = _Clock(), _NoWorkloads(), [], []
    client = _client(token)
    agent = Agent(client, DumpGpus(str(H100_DUMP)), runtime, log=logged.append)
    agent.benchmark_schedule = bench.BenchmarkSchedule(3600, clock=clock)
    agent.benchmark_run = lambda: runs.append(1) or _result(_given(uuids[0]))
    try:
        assert not agent.maybe_benchmark([])  # not due yet: `register` benchmarked
        clock.now += 3600
        assert not agent.maybe_benchmark([{"id": 1, "status": "running"}])  # a lease: busy
        runtime.handles = {7: "pid-1"}
        assert not agent.maybe_benchmark([])  # a workload still there: busy
        runtime.handles = {}
        assert agent.maybe_benchmark([]) and runs == [1]
        assert GpuBenchmark.objects.filter(gpu__uuid=uuids[0]).count() == 1
        assert not agent.maybe_benchmark([])  # the next one is 3600 s away
        clock.now += 3600
        agent.benchmark_run = lambda: bench.run_benchmark()  # this host: no GPU
        assert agent.maybe_benchmark([])
        assert agent.benchmark_schedule is None  # stops trying, said why once
        assert logged[-1].startswith("no GPU: benchmark not run")
        assert logged[-1].endswith("; no further benchmarks")
    finally:
        client.close()
    assert GpuBenchmark.objects.count() == 1


def test_interval_zero_never_benchmarks():
    schedule = bench.BenchmarkSchedule(0, clock=_Clock())
    schedule.clock.now += 10**9
    assert not schedule.due(busy=False)
