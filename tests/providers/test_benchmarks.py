"""GPU benchmarks on the marketplace side: POST /api/v1/runner/benchmarks/ (runner auth,
strict validation, nothing written on bad input), the service's summaries (latest result
per GPU, median over a class's healthy GPUs, failed correctness never a score), and where
they show: the market page, the provider's node page, the API (gpu-classes detail, node
GPUs) and the admin. The figures here are given by the test, not measured."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from providers import benchmarks
from providers.models import Gpu, GpuBenchmark
from tests.factories import RTX4090_DUMP, UserFactory, registered_node
from tests.frontend.test_pages_buyer import login
from tests.support.api import assert_refused, client_for, runner_client

pytestmark = pytest.mark.django_db
URL = "/api/v1/runner/benchmarks/"
H100 = "h100-sxm-80gb"


def _item(uuid: str, **changes) -> dict:
    item = {"uuid": uuid, "measured_at": timezone.now().isoformat(), "correct": True,
            "bf16_tflops": 794.1, "fp16_tflops": 801.5, "memory_bandwidth_gbps": "3010.2",
            "host_to_device_gbps": 51.3, "device_to_host_gbps": 49.8,
            "raw": {"rel_error": 0.0031, "n": 8192}}
    item.update(changes)
    return item


def _body(*items, **changes) -> dict:
    body = {"runner_version": "0.2.0", "backend": "torch", "results": list(items)}
    body.update(changes)
    return body


@pytest.fixture
def node():
    user, node, token = registered_node()
    return user, node, token, list(node.gpus.order_by("pci_bus_id"))


def test_the_runner_reports_and_the_rows_are_stored(node):
    _, _, token, gpus = node
    r = runner_client(token).post(URL, _body(_item(gpus[0].uuid), _item(gpus[1].uuid,
                                                                          bf16_tflops="700")),
                                  format="json")
    assert r.status_code == 201, r.content
    assert [x["uuid"] for x in r.json()["results"]] == [gpus[0].uuid, gpus[1].uuid]
    first = GpuBenchmark.objects.get(gpu=gpus[0])
    assert first.bf16_tflops == Decimal("794.1") and first.fp16_tflops == Decimal("801.5")
    assert first.memory_bandwidth_gbps == Decimal("3010.2")
    assert first.host_to_device_gbps == Decimal("51.3")
    assert first.device_to_host_gbps == Decimal("49.8")
    assert first.correct and first.runner_version == "0.2.0" and first.backend == "torch"
    assert first.raw == {"rel_error": 0.0031, "n": 8192}
    assert GpuBenchmark.objects.get(gpu=gpus[1]).bf16_tflops == Decimal("700")


def test_runner_auth_is_required(node):
    _, _, _, gpus = node
    body = _body(_item(gpus[0].uuid))
    assert client_for().post(URL, body, format="json").status_code == 401
    assert runner_client("gmr_unknown").post(URL, body, format="json").status_code == 401
    # a user's API token is not a runner token
    assert client_for(UserFactory()).post(URL, body, format="json").status_code in (401, 403)
    assert not GpuBenchmark.objects.exists()


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"bf16_tflops": -1}, "results[0].bf16_tflops", "must not be negative"),
    ({"memory_bandwidth_gbps": "-0.1"}, "results[0].memory_bandwidth_gbps", "negative"),
    # an H100's datasheet says 989.4 BF16 dense TFLOPS: twice that is not a measurement
    ({"bf16_tflops": 1979}, "results[0].bf16_tflops", "datasheet"),
    ({"memory_bandwidth_gbps": 9000}, "results[0].memory_bandwidth_gbps", "datasheet"),
    ({"host_to_device_gbps": 5000}, "results[0].host_to_device_gbps", "plausible"),
    ({"bf16_tflops": 794.123}, "results[0].bf16_tflops", "decimal place"),
    ({"bf16_tflops": "NaN"}, "results[0].bf16_tflops", None),
    ({"bf16_tflops": True}, "results[0].bf16_tflops", None),
    ({"correct": "true"}, "results[0].correct", "true or false"),
    ({"correct": True, "bf16_tflops": None, "fp16_tflops": None,
      "memory_bandwidth_gbps": None, "host_to_device_gbps": None,
      "device_to_host_gbps": None}, "results[0]", "at least one figure"),
    ({"measured_at": (timezone.now() + timedelta(hours=1)).isoformat()},
     "results[0].measured_at", "future"),
    ({"measured_at": (timezone.now() - timedelta(days=30)).isoformat()},
     "results[0].measured_at", "7 days"),
    ({"score": 99}, "results[0].score", "not a known field"),
    ({"uuid": "GPU-00000000-0000-0000-0000-000000000000"}, "results[0].uuid",
     "not a GPU of this node"),
])
def test_bad_results_are_refused_and_nothing_is_written(node, change, field, words):
    _, _, token, gpus = node
    # the first item is good: a bad second item refuses the whole report
    body = _body(_item(gpus[1].uuid), {**_item(gpus[0].uuid), **change})
    r = runner_client(token).post(URL, body, format="json")
    assert_refused(r, field.replace("results[0]", "results[1]"), contains=words)
    assert not GpuBenchmark.objects.exists()


@pytest.mark.parametrize(("body", "field"), [
    ({"runner_version": "x", "backend": "torch", "results": []}, "results"),
    ({"runner_version": "x", "backend": "opencl", "results": []}, "backend"),
    ({"runner_version": "x", "backend": "torch"}, "results"),
])
def test_bad_reports_are_refused(node, body, field):
    _, _, token, _ = node
    assert_refused(runner_client(token).post(URL, body, format="json"), field)
    assert not GpuBenchmark.objects.exists()


def test_unknown_top_level_field_and_duplicate_gpu(node):
    _, _, token, gpus = node
    r = runner_client(token).post(URL, _body(_item(gpus[0].uuid), extra=1), format="json")
    assert_refused(r, "extra")
    r = runner_client(token).post(URL, _body(_item(gpus[0].uuid), _item(gpus[0].uuid)),
                                  format="json")
    assert_refused(r, "results", contains="twice")
    assert not GpuBenchmark.objects.exists()


def test_a_gpu_of_another_node_is_refused_without_saying_whose(node):
    _, _, token, _ = node
    _, other, _ = registered_node(RTX4090_DUMP, name="other")
    theirs = other.gpus.first()
    r = runner_client(token).post(URL, _body(_item(theirs.uuid, bf16_tflops=150,
                                                    memory_bandwidth_gbps=900)),
                                  format="json")
    body = assert_refused(r, "results[0].uuid", contains="not a GPU of this node")
    assert "other" not in body["detail"]
    assert not GpuBenchmark.objects.exists()


def _record(gpu, *, at=None, correct=True, bf16="800.0", bw="3000.0"):
    return benchmarks.benchmark_record(
        node=gpu.node, runner_version="t", backend="torch",
        results=[{"uuid": gpu.uuid, "measured_at": at, "correct": correct,
                  "bf16_tflops": Decimal(bf16) if bf16 else None,
                  "memory_bandwidth_gbps": Decimal(bw) if bw else None}])[0]


def test_class_summary_is_the_median_of_latest_passed_results_of_healthy_gpus(node):
    _, _, _, gpus = node
    from marketplace.models import GpuClass

    h100 = GpuClass.objects.get(slug=H100)
    assert benchmarks.class_summary(h100) is None
    old = timezone.now() - timedelta(hours=2)
    _record(gpus[0], at=old, bf16="100.0")  # superseded by the next one
    _record(gpus[0], bf16="700.0", bw="2900.0")
    _record(gpus[1], bf16="800.0", bw="3000.0")
    _record(gpus[2], bf16="900.0", bw="3100.0")
    _record(gpus[3], bf16="990.0", correct=False)  # failed its check: not counted
    unhealthy = gpus[4]
    _record(unhealthy, bf16="10.0")
    Gpu.objects.filter(pk=unhealthy.pk).update(healthy=False)
    score = benchmarks.class_summary(h100)
    assert (score.gpus, score.bf16_tflops, score.memory_bandwidth_gbps) == \
        (3, Decimal("800.0"), Decimal("3000.0"))
    assert score.tflops_text == "measured 800 of 989.4 TFLOPS (BF16 dense)"
    assert score.bandwidth_text == "measured 3000 of 3350 GB/s memory bandwidth"
    _record(gpus[5], bf16="850.0", bw="3050.0")  # even count: the mean of the middle two
    assert benchmarks.class_summary(h100).bf16_tflops == Decimal("825.0")


def test_gpu_classes_detail_with_and_without_a_benchmark(node):
    _, _, _, gpus = node
    r = client_for().get(f"/api/v1/gpu-classes/{H100}/")
    assert r.status_code == 200, r.content
    assert r.json()["benchmark"] is None and r.json()["bf16_dense_tflops"] == "989.4"
    _record(gpus[0], bf16="794.1", bw="3010.5")
    bench = client_for().get(f"/api/v1/gpu-classes/{H100}/").json()["benchmark"]
    assert bench["gpus"] == 1 and bench["bf16_tflops"] == "794.1"
    assert bench["datasheet_bf16_tflops"] == "989.4"
    assert bench["memory_bandwidth_gbps"] == "3010.5"
    assert bench["summary"] == ("measured 794.1 of 989.4 TFLOPS (BF16 dense); measured "
                                "3010.5 of 3350 GB/s memory bandwidth")
    listed = {c["slug"]: c for c in client_for().get("/api/v1/gpu-classes/").json()["results"]}
    assert listed[H100]["benchmark"]["bf16_tflops"] == "794.1"
    assert listed["a10"]["benchmark"] is None
    assert client_for().get("/api/v1/gpu-classes/nope/").status_code == 404


def test_node_gpus_in_the_api_carry_their_latest_benchmark(node):
    user, _, _, gpus = node
    _record(gpus[0], bf16="794.1")
    _record(gpus[1], bf16="990.0", correct=False)
    [listed] = client_for(user).get("/api/v1/nodes/").json()["results"]
    by_uuid = {g["uuid"]: g["benchmark"] for g in listed["gpus"]}
    assert by_uuid[gpus[0].uuid]["bf16_tflops"] == "794.1"
    assert by_uuid[gpus[0].uuid]["correct"] is True
    assert by_uuid[gpus[0].uuid]["score"].startswith("measured 794.1 of 989.4 TFLOPS")
    failed = by_uuid[gpus[1].uuid]
    assert failed["correct"] is False and failed["score"] == ""
    assert failed["bf16_tflops"] is None and failed["memory_bandwidth_gbps"] is None
    assert by_uuid[gpus[2].uuid] is None  # not benchmarked yet


def test_market_page_without_and_with_benchmarks(client, node):
    _, _, _, gpus = node
    html = client.get(reverse("market", args=[H100])).content.decode()
    # (the offers table's header says "TFLOPS measured / datasheet": look for a figure)
    assert "Not benchmarked yet" in html and "TFLOPS (BF16 dense)" not in html
    _record(gpus[0], bf16="990.0", correct=False)  # a failed check shows nothing either
    html = client.get(reverse("market", args=[H100])).content.decode()
    assert "Not benchmarked yet" in html and "measured 990" not in html
    _record(gpus[1], bf16="794.1", bw="3010.5")
    _record(gpus[2], bf16="796.1", bw="3020.5")
    html = client.get(reverse("market", args=[H100])).content.decode()
    assert "measured 795.1 of 989.4 TFLOPS (BF16 dense)" in html
    assert "measured 3015.5 of 3350 GB/s memory bandwidth" in html
    assert "latest benchmark of 2 healthy GPUs" in html
    assert "Not benchmarked yet" not in html
    other = client.get(reverse("market", args=["a10"])).content.decode()
    assert "Not benchmarked yet" in other


def test_node_page_per_gpu(client, node):
    user, the_node, _, gpus = node
    login(client, user)
    html = client.get(reverse("node", args=[the_node.pk])).content.decode()
    assert html.count("not benchmarked yet") == 8 and "measured" not in html
    _record(gpus[0], bf16="794.1", bw="3010.5")
    _record(gpus[1], bf16="990.0", correct=False)
    html = client.get(reverse("node", args=[the_node.pk])).content.decode()
    assert "measured 794.1 of 989.4 TFLOPS (BF16 dense)" in html
    assert "measured 3010.5 of 3350 GB/s memory bandwidth" in html
    assert "failed its correctness check" in html and "990" not in html
    assert html.count("not benchmarked yet") == 6


def test_admin_shows_benchmarks_read_only(client, node):
    _, _, _, gpus = node
    row = _record(gpus[0])
    operator = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(operator)
    assert client.get(reverse("admin:providers_gpubenchmark_changelist")).status_code == 200
    page = client.get(reverse("admin:providers_gpubenchmark_change", args=[row.pk]))
    assert page.status_code == 200 and b'name="bf16_tflops"' not in page.content
    assert client.get(reverse("admin:providers_gpubenchmark_add")).status_code == 403
    assert client.get(reverse("admin:providers_gpu_change", args=[gpus[0].pk])).status_code \
        == 200
