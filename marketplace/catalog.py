"""The GPU class catalog: one market per whole-GPU class and per MIG profile of one.

Figures are the vendor's published peak numbers, dense (without structured sparsity); each
class names its source, and says "uncertain" where a figure is derived or not published.
Reference prices are the median of the public per-GPU-hour prices in
data/reference-prices.csv for that class (micro-USD), 0 where the file has none; a starting
point for asks and bids, not a quote (tests/marketplace/test_catalog.py recomputes them).

The runner maps NVML product names to these slugs (providers/runner/catalog.py) and MIG
profiles to slice slugs (providers/runner/mig_profiles.py); a slice market's figures are its
share of the parent's (`slice_spec`; the rule: docs/CATALOG.md).
"""

from __future__ import annotations

from decimal import ROUND_DOWN, Decimal
from typing import NamedTuple

from providers.runner.catalog import GPU_CLASSES
from providers.runner.mig_profiles import GUIDE, MIG_PARENTS, MigParent, MigProfile


class ClassSpec(NamedTuple):
    slug: str
    name: str
    memory_gb: int
    memory_bandwidth_gbps: int
    bf16_dense_tflops: Decimal | None
    datasheet_source: str
    reference_price: int  # micro-USD per GPU-hour


def _c(slug, name, memory_gb, bandwidth, tflops, source, price=0) -> ClassSpec:
    return ClassSpec(slug, name, memory_gb, bandwidth,
                     Decimal(tflops) if tflops is not None else None, source, price)


_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet"
_A100_DS = "NVIDIA A100 Tensor Core GPU datasheet"
_V100_DS = "NVIDIA V100 Tensor Core GPU datasheet"
_ADA_WP = "NVIDIA Ada Lovelace GPU Architecture whitepaper, appendix A"
_GA102_WP = "NVIDIA Ampere GA102 GPU Architecture whitepaper, appendix A"

CATALOG: tuple[ClassSpec, ...] = (
    # Hopper
    _c("h200-sxm-141gb", "NVIDIA H200 SXM 141GB", 141, 4800, "989.5",
       "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: 141 GB HBM3e, 4.8 TB/s, BF16 1,979 "
       "TFLOPS with sparsity = 989.5 dense)"),
    _c("h200-nvl-141gb", "NVIDIA H200 NVL 141GB", 141, 4800, "835.5",
       "NVIDIA H200 Tensor Core GPU datasheet (H200 NVL: 141 GB HBM3e, 4.8 TB/s, BF16 1,671 "
       "TFLOPS with sparsity = 835.5 dense)"),
    _c("h100-sxm-80gb", "NVIDIA H100 SXM 80GB", 80, 3350, "989.4",
       f"{_H100_DS} (H100 SXM: 3.35 TB/s, BF16 1,979 TFLOPS with sparsity = 989.4 dense)",
       2_865_000),
    _c("h100-pcie-80gb", "NVIDIA H100 PCIe 80GB", 80, 2000, "756.5",
       f"{_H100_DS}, 2022 edition (H100 PCIe: 2 TB/s, BF16 1,513 TFLOPS with sparsity = "
       "756.5 dense)"),
    _c("h100-nvl-94gb", "NVIDIA H100 NVL 94GB", 94, 3900, "835.5",
       f"{_H100_DS} (H100 NVL: 94 GB, 3.9 TB/s, BF16 1,671 TFLOPS with sparsity = 835.5 "
       "dense)"),
    _c("gh200-480gb", "NVIDIA GH200 480GB (96 GB HBM3)", 96, 4000, "989.5",
       "NVIDIA GH200 Grace Hopper Superchip datasheet (96 GB HBM3, 4 TB/s); uncertain: BF16 "
       "taken as the H100 SXM's 1,979 with sparsity = 989.5 dense, the datasheet gives it "
       "per module configuration"),
    _c("gh200-144gb", "NVIDIA GH200 144GB HBM3e", 144, 4900, "989.5",
       "NVIDIA GH200 Grace Hopper Superchip datasheet (144 GB HBM3e, 4.9 TB/s); uncertain: "
       "BF16 taken as the GH200 480GB's 989.5 dense"),
    # Blackwell
    _c("b200", "NVIDIA B200 180GB", 180, 8000, "2250.0",
       "NVIDIA HGX B200 datasheet (per GPU 180 GB HBM3e, 8 TB/s); uncertain: BF16 derived "
       "from the 8-GPU board's 36 PFLOPS with sparsity = 2,250 dense per GPU"),
    _c("rtx-pro-6000-blackwell", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 96,
       1792, "503.8",
       "NVIDIA RTX PRO 6000 Blackwell datasheet (96 GB GDDR7, 1,792 GB/s); uncertain: BF16 "
       "503.8 TFLOPS dense (FP32 accumulate) from the RTX Blackwell whitepaper, not the "
       "datasheet"),
    _c("rtx-pro-6000-blackwell-maxq", "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation "
       "Edition", 96, 1792, None,
       "NVIDIA RTX PRO 6000 Blackwell Max-Q datasheet (96 GB GDDR7, 1,792 GB/s); BF16 "
       "supported but no dense figure published for the 300 W Max-Q: left empty, not guessed"),
    _c("rtx-pro-6000-blackwell-server", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 96,
       1792, None,
       "NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet (96 GB GDDR7, 1,792 GB/s); "
       "BF16 supported but no dense figure published: left empty, not guessed"),
    _c("rtx-5090", "NVIDIA GeForce RTX 5090", 32, 1792, "209.5",
       "NVIDIA RTX Blackwell GPU Architecture whitepaper (RTX 5090: 1,792 GB/s); uncertain: "
       "BF16 tensor with FP32 accumulate 209.5 TFLOPS dense as read from its appendix"),
    # Ampere
    _c("a100-sxm-80gb", "NVIDIA A100 SXM 80GB", 80, 2039, "312.0",
       f"{_A100_DS} (A100 80GB SXM: 2,039 GB/s, BF16 312 TFLOPS dense)", 4_120_000),
    _c("a100-sxm-40gb", "NVIDIA A100 SXM 40GB", 40, 1555, "312.0",
       f"{_A100_DS} (A100 40GB SXM: 1,555 GB/s, BF16 312 TFLOPS dense)"),
    _c("a100-pcie-80gb", "NVIDIA A100 PCIe 80GB", 80, 1935, "312.0",
       f"{_A100_DS} (A100 80GB PCIe: 1,935 GB/s, BF16 312 TFLOPS dense)"),
    _c("a100-pcie-40gb", "NVIDIA A100 PCIe 40GB", 40, 1555, "312.0",
       f"{_A100_DS}, 2020 edition (A100 40GB PCIe: 1,555 GB/s, BF16 312 TFLOPS dense)"),
    _c("a30", "NVIDIA A30", 24, 933, "165.0",
       "NVIDIA A30 Tensor Core GPU datasheet (933 GB/s, BF16 165 TFLOPS dense, 330 with "
       "sparsity)"),
    _c("a40", "NVIDIA A40", 48, 696, "149.7",
       "NVIDIA A40 datasheet (696 GB/s, BF16 149.7 TFLOPS dense, 299.4 with sparsity)"),
    _c("a10", "NVIDIA A10", 24, 600, "125.0",
       "NVIDIA A10 Tensor Core GPU datasheet (600 GB/s, BF16 125 TFLOPS dense)", 695_000),
    _c("a10g", "NVIDIA A10G", 24, 600, "70.0",
       "AWS EC2 G5 (A10G: 24 GB, 600 GB/s); uncertain: NVIDIA publishes no A10G datasheet, "
       "70 TFLOPS BF16 dense is the commonly cited figure"),
    _c("rtx-a6000", "NVIDIA RTX A6000", 48, 768, "154.8",
       f"{_GA102_WP} (RTX A6000: 768 GB/s, BF16 tensor 154.8 TFLOPS dense, 309.7 sparse)"),
    _c("rtx-a5000", "NVIDIA RTX A5000", 24, 768, "111.1",
       "NVIDIA RTX A5000 datasheet (768 GB/s, tensor 222.2 TFLOPS with sparsity = 111.1 "
       "dense); uncertain: the datasheet does not name the precision"),
    _c("rtx-3090", "NVIDIA GeForce RTX 3090", 24, 936, "71.0",
       f"{_GA102_WP} (RTX 3090: 936 GB/s, BF16 tensor with FP32 accumulate 71 TFLOPS dense)"),
    _c("rtx-3080", "NVIDIA GeForce RTX 3080", 10, 760, "59.5",
       f"{_GA102_WP} (RTX 3080 10 GB: 760 GB/s, BF16 tensor with FP32 accumulate 59.5 dense); "
       "the 12 GB board reports the same name: figures of the 10 GB"),
    # Ada Lovelace
    _c("l40s", "NVIDIA L40S", 48, 864, "362.1",
       "NVIDIA L40S datasheet (864 GB/s, BF16 733 TFLOPS with sparsity = 362 dense)",
       1_960_000),
    _c("l40", "NVIDIA L40", 48, 864, "181.0",
       "NVIDIA L40 datasheet (864 GB/s, BF16 362.1 TFLOPS with sparsity = 181 dense)"),
    _c("l4", "NVIDIA L4", 24, 300, "121.0",
       "NVIDIA L4 Tensor Core GPU datasheet (300 GB/s, BF16 242 TFLOPS with sparsity = 121 "
       "dense)"),
    _c("rtx-6000-ada", "NVIDIA RTX 6000 Ada Generation", 48, 960, "364.2",
       f"{_ADA_WP} (RTX 6000 Ada: 960 GB/s, BF16 tensor with FP32 accumulate 364.2 TFLOPS "
       "dense)"),
    _c("rtx-4000-ada", "NVIDIA RTX 4000 Ada Generation", 20, 360, "76.7",
       "NVIDIA RTX 4000 Ada datasheet (20 GB, 360 GB/s); uncertain: BF16 dense derived as a "
       "quarter of its 306.8 tensor TFLOPS (FP8 with sparsity)"),
    _c("rtx-4090", "NVIDIA GeForce RTX 4090", 24, 1008, "165.2",
       f"{_ADA_WP} (RTX 4090: 1,008 GB/s, BF16 tensor with FP32 accumulate 165.2 TFLOPS "
       "dense)", 1_250_000),
    _c("rtx-4080", "NVIDIA GeForce RTX 4080", 16, 716, "97.5",
       f"{_ADA_WP} (RTX 4080: 716.8 GB/s, BF16 tensor with FP32 accumulate 97.5 TFLOPS "
       "dense)"),
    _c("rtx-4080-super", "NVIDIA GeForce RTX 4080 SUPER", 16, 736, "104.4",
       "NVIDIA GeForce RTX 4080 SUPER specifications (16 GB, 736 GB/s); uncertain: BF16 "
       "not published, scaled from the RTX 4080's 97.5 by cores x boost clock"),
    # Turing, Volta, Pascal
    _c("t4", "NVIDIA T4", 16, 320, None,
       "NVIDIA T4 datasheet (320 GB/s; no BF16, FP16 tensor mixed precision 65 TFLOPS)"),
    _c("v100", "NVIDIA V100 SXM2 32GB", 32, 900, None,
       f"{_V100_DS} (SXM2: 900 GB/s; no BF16, FP16 tensor 125 TFLOPS)", 830_000),
    _c("v100-sxm2-16gb", "NVIDIA V100 SXM2 16GB", 16, 900, None,
       f"{_V100_DS} (SXM2: 900 GB/s; no BF16, FP16 tensor 125 TFLOPS)"),
    _c("v100-pcie-32gb", "NVIDIA V100 PCIe 32GB", 32, 900, None,
       f"{_V100_DS} (PCIe: 900 GB/s; no BF16, FP16 tensor 112 TFLOPS)"),
    _c("v100-pcie-16gb", "NVIDIA V100 PCIe 16GB", 16, 900, None,
       f"{_V100_DS} (PCIe: 900 GB/s; no BF16, FP16 tensor 112 TFLOPS)"),
    _c("titan-v", "NVIDIA TITAN V", 12, 653, None,
       "NVIDIA TITAN V specifications (652.8 GB/s HBM2; no BF16, FP16 tensor 110 TFLOPS)"),
    _c("gtx-1070-ti", "NVIDIA GeForce GTX 1070 Ti", 8, 256, None,
       "NVIDIA GeForce GTX 1070 Ti specifications (8 GB GDDR5, 256 GB/s); Pascal: no tensor "
       "cores, no BF16"),
)

_BY_SLUG = {spec.slug: spec for spec in CATALOG}
_TENTH = Decimal("0.1")


def fraction(parent: MigParent, profile: MigProfile) -> str:
    """"1/7": the profile's compute slices of the parent's (the MIG guide's notation)."""
    return f"{profile.compute_slices}/{parent.slices_of}"


def slice_spec(parent_spec: ClassSpec, parent: MigParent, profile: MigProfile) -> ClassSpec:
    """The market of one MIG profile: memory from the profile, bandwidth and TFLOPS the
    parent's times compute slices / slices per GPU, rounded down; no reference price."""
    share = Decimal(profile.compute_slices) / Decimal(parent.slices_of)
    tflops = parent_spec.bf16_dense_tflops
    return ClassSpec(
        slug=f"{parent_spec.slug}.{profile.name}",
        name=f"{parent_spec.name} MIG {profile.name}",
        memory_gb=profile.memory_gb,
        memory_bandwidth_gbps=int(parent_spec.memory_bandwidth_gbps * share),
        bf16_dense_tflops=(tflops * share).quantize(_TENTH, ROUND_DOWN) if tflops else None,
        datasheet_source=(f"{fraction(parent, profile)} of {parent_spec.slug} by compute "
                          f"slices, memory from the profile ({GUIDE}; rule: docs/CATALOG.md)"),
        reference_price=0)


def slice_specs() -> list[tuple[str, str, ClassSpec]]:
    """(parent slug, profile, spec) of every MIG profile market."""
    return [(slug, p.name, slice_spec(_BY_SLUG[slug], parent, p))
            for slug, parent in MIG_PARENTS.items() for p in parent.profiles]


def load_catalog(gpu_class_model) -> int:
    """Create or update every class of CATALOG and, where the model has `parent`, every MIG
    profile market; returns how many. Takes the model so a data migration can pass its
    historical one (0003's has no `parent`); re-runnable (update_or_create)."""
    fields = {f.name for f in gpu_class_model._meta.get_fields()}
    rows = {}
    for spec in CATALOG:
        defaults = {k: v for k, v in spec._asdict().items() if k in fields}
        rows[spec.slug], _ = gpu_class_model.objects.update_or_create(slug=spec.slug,
                                                                       defaults=defaults)
    if "parent" not in fields:
        return len(rows)
    slices = slice_specs()
    for parent_slug, profile, spec in slices:
        gpu_class_model.objects.update_or_create(
            slug=spec.slug, defaults={**spec._asdict(), "parent": rows[parent_slug],
                                      "mig_profile": profile})
    return len(rows) + len(slices)


def reclassify_gpus(gpu_model, order_model, lease_gpu_model, gpu_class_model) -> tuple[int,
                                                                                      list[str]]:
    """Move each whole GPU whose product name now maps to another class (GPU_CLASSES) to that
    class: (how many moved, UUIDs kept because an active ask of their node in the old class
    or an active lease holds them — run again once those end). Re-runnable."""
    classes = {c.slug: c for c in gpu_class_model.objects.filter(parent__isnull=True)}
    asking = set(order_model.objects.filter(side="ask", status__in=("open", "partially_filled"))
                 .values_list("node_id", "market_id"))
    leased = set(lease_gpu_model.objects.filter(
        lease__status__in=("pending", "starting", "running")).values_list("gpu_id", flat=True))
    moved, kept = 0, []
    for gpu in gpu_model.objects.select_related("gpu_class").filter(
            gpu_class__parent__isnull=True):
        target = classes.get(GPU_CLASSES.get(gpu.product_name.strip(), ""))
        if target is None or target.pk == gpu.gpu_class_id:
            continue
        if gpu.pk in leased or (gpu.node_id, gpu.gpu_class_id) in asking:
            kept.append(gpu.uuid)
            continue
        gpu.gpu_class = target
        gpu.save(update_fields=["gpu_class"])
        moved += 1
    return moved, kept


def _article(short: str) -> str:
    # "an H100", "an A30", "an RTX PRO 6000", but "a GH200", "a B200"
    return "an" if short[:1] in "AEFHILMNORSX" else "a"


def slice_of(gpu_class) -> dict | None:
    """What a slice market is: {"of": parent name, "fraction": "1/7", "memory_gb": 10,
    "sm_count": 16 or None}; None for a whole-GPU class (or a profile the table lost)."""
    if gpu_class.parent_id is None:
        return None
    parent = MIG_PARENTS.get(gpu_class.parent.slug)
    profile = parent.profile(gpu_class.mig_profile) if parent else None
    if profile is None:
        return None
    return {"of": gpu_class.parent.name, "fraction": fraction(parent, profile),
            "memory_gb": profile.memory_gb, "sm_count": profile.sm_count}


def slice_label(gpu_class) -> str:
    """"1/7 of an H100: 10 GB, 16 SMs" for a slice market, "" for a whole GPU."""
    info = slice_of(gpu_class)
    if info is None:
        return ""
    short = MIG_PARENTS[gpu_class.parent.slug].short
    sms = f", {info['sm_count']} SMs" if info["sm_count"] else ""
    return f"{info['fraction']} of {_article(short)} {short}: {info['memory_gb']} GB{sms}"
