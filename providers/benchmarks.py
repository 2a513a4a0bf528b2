"""GPU benchmarks: store what a node's runner measured, and summarise it against the GPU
class's datasheet for the pages and the API.

Recording (`benchmark_record`, called by POST /api/v1/runner/benchmarks/): every result
must name a GPU of the reporting node; every figure must be a non-negative decimal with at
most one decimal place and plausible (below an absolute ceiling and, where the class has a
datasheet figure, at most PLAUSIBLE_FACTOR × that figure: a datasheet figure is the peak, so
a measurement far above it is a broken or forged report). Anything wrong refuses the whole
report (ProviderError naming `results[i].<field>`) and writes nothing.

Showing (`gpu_score`, `class_summary`): only results whose correctness check passed count.
A GPU's score is its latest result; a class's is the median of the latest results of its
healthy GPUs (a GPU whose latest result failed the check counts as not benchmarked), with
the number of GPUs behind it. No result → None, which the pages show as "not benchmarked
yet": never a number.

Units: TFLOPS (10^12 FLOP/s, dense matmul) and GB/s (10^9 bytes/s), decimals with one place.
Datasheet figures come from marketplace/catalog.py (each class names its source).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from providers.models import Gpu, GpuBenchmark, Node
from providers.services import ProviderError

MAX_RESULTS = 64  # one per GPU of a node (services.MAX_GPUS_PER_NODE)
# A measurement may exceed the datasheet's peak only by this factor (clock boosts, a
# datasheet rounded down); beyond it the report is refused as implausible.
PLAUSIBLE_FACTOR = Decimal("1.25")
# FP16 with FP16 accumulation runs at twice the BF16 (FP32 accumulate) rate on some parts
# (GeForce Ada: 330.3 vs 165.2 TFLOPS dense, Ada whitepaper appendix A), so FP16 is checked
# against 2 × the BF16 datasheet figure.
FP16_OVER_BF16 = Decimal(2)
# Absolute ceilings for one GPU, whatever its class: far above any GPU sold today (B200:
# 2.25 PFLOPS dense BF16, 8 TB/s HBM3e; GH200 NVLink-C2C: 450 GB/s each way).
CEILING = {
    "bf16_tflops": Decimal(10_000),
    "fp16_tflops": Decimal(20_000),
    "memory_bandwidth_gbps": Decimal(50_000),
    "host_to_device_gbps": Decimal(2_000),
    "device_to_host_gbps": Decimal(2_000),
}
FIGURES = tuple(CEILING)
MAX_FUTURE_SKEW = timedelta(minutes=5)
MAX_AGE = timedelta(days=7)


def _datasheet_limit(gpu: Gpu, figure: str) -> Decimal | None:
    """The most a plausible measurement of `figure` may be for this GPU's class, or None
    when the class has no datasheet figure to compare with."""
    cls = gpu.gpu_class
    if figure == "bf16_tflops" and cls.bf16_dense_tflops is not None:
        return cls.bf16_dense_tflops * PLAUSIBLE_FACTOR
    if figure == "fp16_tflops" and cls.bf16_dense_tflops is not None:
        return cls.bf16_dense_tflops * FP16_OVER_BF16 * PLAUSIBLE_FACTOR
    if figure == "memory_bandwidth_gbps" and cls.memory_bandwidth_gbps:
        return Decimal(cls.memory_bandwidth_gbps) * PLAUSIBLE_FACTOR
    return None


def _check_figure(gpu: Gpu, figure: str, value: Decimal | None, where: str) -> None:
    if value is None:
        return
    if value < 0:
        raise ProviderError("must not be negative", field=where)
    if value > CEILING[figure]:
        raise ProviderError(f"{value} is not a plausible measurement for one GPU (at most "
                            f"{CEILING[figure]})", field=where)
    limit = _datasheet_limit(gpu, figure)
    if limit is not None and value > limit:
        raise ProviderError(
            f"{value} is more than {PLAUSIBLE_FACTOR} × the {gpu.gpu_class.slug} datasheet "
            f"figure allows ({limit.normalize():f}): not a plausible measurement", field=where)


@transaction.atomic
def benchmark_record(*, node: Node, runner_version: str, backend: str,
                     results: list[dict[str, Any]], now: datetime | None = None
                     ) -> list[GpuBenchmark]:
    """Store one benchmark report of `node`'s runner: one GpuBenchmark per result.

    `results`: dicts with uuid (a GPU of `node`), measured_at (aware datetime, or None for
    now; at most 5 minutes ahead and 7 days old), correct (bool), the figures of FIGURES
    (Decimal or None; at least one when correct) and raw (dict). Raises ProviderError
    naming `results`, `results[i].uuid` (not a GPU of this node — whether another node has it
    is not told), `results[i].<figure>` (negative or implausible) or
    `results[i].measured_at`; then nothing is written.
    """
    now = now or timezone.now()
    if not results or len(results) > MAX_RESULTS:
        raise ProviderError(f"must list 1 to {MAX_RESULTS} results, one per GPU",
                            field="results")
    uuids = [r["uuid"] for r in results]
    if len(set(uuids)) != len(uuids):
        raise ProviderError("the same GPU UUID is listed twice", field="results")
    gpus = {g.uuid: g for g in Gpu.objects.filter(node=node, uuid__in=uuids)
            .select_related("gpu_class")}
    rows = []
    for i, r in enumerate(results):
        gpu = gpus.get(r["uuid"])
        if gpu is None:
            raise ProviderError(f"GPU {r['uuid']} is not a GPU of this node (send the "
                                "inventory first)", field=f"results[{i}].uuid")
        for figure in FIGURES:
            _check_figure(gpu, figure, r.get(figure), f"results[{i}].{figure}")
        if r["correct"] and all(r.get(f) is None for f in FIGURES):
            raise ProviderError("a passed result must carry at least one figure",
                                field=f"results[{i}]")
        measured_at = r.get("measured_at") or now
        if measured_at > now + MAX_FUTURE_SKEW:
            raise ProviderError("is in the future (check the host's clock)",
                                field=f"results[{i}].measured_at")
        if measured_at < now - MAX_AGE:
            raise ProviderError("is more than 7 days old", field=f"results[{i}].measured_at")
        rows.append(GpuBenchmark(
            gpu=gpu, measured_at=measured_at, backend=backend[:16], correct=r["correct"],
            runner_version=runner_version[:32], raw=r.get("raw") or {},
            **{f: r.get(f) for f in FIGURES}))
    return GpuBenchmark.objects.bulk_create(rows)


# ------------------------------------------------------------------ showing

@dataclass(frozen=True)
class Score:
    """What the pages and the API show for one GPU or one class.

    bf16_tflops / memory_bandwidth_gbps: measured (one GPU's latest passed result, or the
    class median); datasheet_*: the class's datasheet figures (None when it has none);
    gpus: how many GPUs the figure stands for; measured_at: the newest result behind it."""

    bf16_tflops: Decimal | None
    memory_bandwidth_gbps: Decimal | None
    datasheet_bf16_tflops: Decimal | None
    datasheet_memory_bandwidth_gbps: int | None
    gpus: int
    measured_at: datetime | None

    @property
    def tflops_text(self) -> str:
        """"measured 794.1 of 989.4 TFLOPS (BF16 dense)"; "" without a BF16 figure."""
        if self.bf16_tflops is None:
            return ""
        of = (f" of {_fmt(self.datasheet_bf16_tflops)}"
              if self.datasheet_bf16_tflops is not None else "")
        return f"measured {_fmt(self.bf16_tflops)}{of} TFLOPS (BF16 dense)"

    @property
    def bandwidth_text(self) -> str:
        """"measured 3010.5 of 3350 GB/s memory bandwidth"; "" without that figure."""
        if self.memory_bandwidth_gbps is None:
            return ""
        of = (f" of {self.datasheet_memory_bandwidth_gbps}"
              if self.datasheet_memory_bandwidth_gbps else "")
        return f"measured {_fmt(self.memory_bandwidth_gbps)}{of} GB/s memory bandwidth"

    def as_api(self) -> dict:
        """Decimal strings (one place, or two for an even median), as the API sends them."""
        def s(v):
            return None if v is None else _fmt(v)

        return {"gpus": self.gpus, "bf16_tflops": s(self.bf16_tflops),
                "datasheet_bf16_tflops": s(self.datasheet_bf16_tflops),
                "memory_bandwidth_gbps": s(self.memory_bandwidth_gbps),
                "datasheet_memory_bandwidth_gbps": self.datasheet_memory_bandwidth_gbps,
                "measured_at": self.measured_at.isoformat() if self.measured_at else None,
                "summary": "; ".join(t for t in (self.tflops_text, self.bandwidth_text) if t)}


def _fmt(value: Decimal) -> str:
    """A decimal without trailing zeros beyond one place: 794.10 → "794.1", 3350 → "3350"."""
    return f"{value.normalize():f}"


def latest_results(gpus) -> dict[int, GpuBenchmark]:
    """{gpu id: its latest GpuBenchmark} for the GPUs of queryset `gpus` that have one
    (passed or not). Two queries, whatever the number of GPUs."""
    latest = (GpuBenchmark.objects.filter(gpu=OuterRef("pk"))
              .order_by("-measured_at", "-pk").values("pk")[:1])
    ids = [pk for pk in gpus.annotate(latest=Subquery(latest)).values_list("latest", flat=True)
           if pk is not None]
    return {b.gpu_id: b for b in GpuBenchmark.objects.filter(pk__in=ids)}


def gpu_score(gpu: Gpu, result: GpuBenchmark | None) -> Score | None:
    """The score of one GPU from its latest result; None when it has none or that result
    failed its correctness check."""
    if result is None or not result.correct:
        return None
    if result.bf16_tflops is None and result.memory_bandwidth_gbps is None:
        return None
    cls = gpu.gpu_class
    return Score(result.bf16_tflops, result.memory_bandwidth_gbps, cls.bf16_dense_tflops,
                 cls.memory_bandwidth_gbps, 1, result.measured_at)


def class_summary(gpu_class) -> Score | None:
    """The class's score: the median of the latest passed results of its healthy GPUs
    (medians of BF16 TFLOPS and of memory bandwidth are taken separately, each over the GPUs
    that measured it; `gpus` counts the GPUs with a passed latest result). None when no
    healthy GPU of the class has one."""
    results = [b for b in latest_results(Gpu.objects.filter(gpu_class=gpu_class,
                                                              healthy=True)).values()
               if b.correct]
    tflops = [b.bf16_tflops for b in results if b.bf16_tflops is not None]
    bandwidth = [b.memory_bandwidth_gbps for b in results
                 if b.memory_bandwidth_gbps is not None]
    if not tflops and not bandwidth:
        return None
    counted = [b for b in results
               if b.bf16_tflops is not None or b.memory_bandwidth_gbps is not None]
    return Score(statistics.median(tflops) if tflops else None,
                 statistics.median(bandwidth) if bandwidth else None,
                 gpu_class.bf16_dense_tflops, gpu_class.memory_bandwidth_gbps, len(counted),
                 max(b.measured_at for b in counted))
