"""The GPU class catalog: one market per class, with datasheet figures.

Figures are the vendor's published peak numbers, dense (without structured
sparsity); each class names its source. Reference prices are the median of the
public per-GPU-hour prices in data/reference-prices.csv for that class (micro-USD),
a starting point for asks and bids, not a quote.

The runner maps NVML product names to these slugs (providers/runner/catalog.py);
the two tables are checked against each other by a test.
"""

from __future__ import annotations

from decimal import Decimal
from typing import NamedTuple


class ClassSpec(NamedTuple):
    slug: str
    name: str
    memory_gb: int
    memory_bandwidth_gbps: int
    bf16_dense_tflops: Decimal | None
    datasheet_source: str
    reference_price: int  # micro-USD per GPU-hour


CATALOG: tuple[ClassSpec, ...] = (
    ClassSpec("h100-sxm-80gb", "NVIDIA H100 SXM 80GB", 80, 3350, Decimal("989.4"),
              "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: 3.35 TB/s, BF16 1,979 "
              "TFLOPS with sparsity = 989.4 dense)", 2_865_000),
    ClassSpec("a100-sxm-80gb", "NVIDIA A100 SXM 80GB", 80, 2039, Decimal("312.0"),
              "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM: 2,039 GB/s, BF16 312 "
              "TFLOPS dense)", 4_120_000),
    ClassSpec("l40s", "NVIDIA L40S", 48, 864, Decimal("362.1"),
              "NVIDIA L40S datasheet (864 GB/s, BF16 733 TFLOPS with sparsity = 362 dense)",
              1_960_000),
    ClassSpec("rtx-4090", "NVIDIA GeForce RTX 4090", 24, 1008, Decimal("165.2"),
              "NVIDIA Ada Lovelace GPU Architecture whitepaper, appendix A (RTX 4090: "
              "1,008 GB/s, BF16 tensor with FP32 accumulate 165.2 TFLOPS dense)", 1_250_000),
    ClassSpec("a10", "NVIDIA A10", 24, 600, Decimal("125.0"),
              "NVIDIA A10 Tensor Core GPU datasheet (600 GB/s, BF16 125 TFLOPS dense)",
              695_000),
    ClassSpec("v100", "NVIDIA V100 SXM2", 32, 900, None,
              "NVIDIA V100 Tensor Core GPU datasheet (SXM2: 900 GB/s; no BF16, FP16 tensor "
              "125 TFLOPS)", 830_000),
    ClassSpec("titan-v", "NVIDIA TITAN V", 12, 653, None,
              "NVIDIA TITAN V specifications (652.8 GB/s HBM2; no BF16, FP16 tensor "
              "110 TFLOPS)", 0),
)


def load_catalog(gpu_class_model) -> int:
    """Create or update every class of CATALOG; returns how many. Takes the model so a
    data migration can pass its historical model."""
    for spec in CATALOG:
        gpu_class_model.objects.update_or_create(slug=spec.slug, defaults=spec._asdict())
    return len(CATALOG)
