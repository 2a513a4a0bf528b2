"""Map an NVIDIA product name (as NVML and `nvidia-smi -q` report it) to a GPU class slug.

The table is exact: a name that is not in it is refused, never guessed from a prefix,
because the GPU class decides the price a buyer pays. Every name here was seen in a public
recording (data/nvidia-smi/, data/SOURCE.md) or in NVIDIA's and vendors' material; how to
add one: docs/CATALOG.md ("one file, one test"). The market side (figures, prices) is
marketplace/catalog.py; tests/marketplace/test_catalog.py checks that the two agree.
MIG profiles: mig_profiles.py (`profile_class`, re-exported here).
"""

from __future__ import annotations

from .mig_profiles import UnknownMigProfile, profile_class  # noqa: F401 (re-exported)

#: Product name, exactly as reported by NVML `nvmlDeviceGetName` / "Product Name" → class slug.
GPU_CLASSES: dict[str, str] = {
    # Hopper
    "NVIDIA H200": "h200-sxm-141gb",
    "NVIDIA H200 NVL": "h200-nvl-141gb",
    "NVIDIA H100 80GB HBM3": "h100-sxm-80gb",
    "NVIDIA H100 PCIe": "h100-pcie-80gb",
    "NVIDIA H100 NVL": "h100-nvl-94gb",
    "NVIDIA GH200 480GB": "gh200-480gb",
    "NVIDIA GH200 144G HBM3e": "gh200-144gb",
    # Blackwell
    "NVIDIA B200": "b200",
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": "rtx-pro-6000-blackwell",
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition": "rtx-pro-6000-blackwell-maxq",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": "rtx-pro-6000-blackwell-server",
    "NVIDIA GeForce RTX 5090": "rtx-5090",
    # Ampere
    "NVIDIA A100-SXM4-40GB": "a100-sxm-40gb",
    "NVIDIA A100-SXM4-80GB": "a100-sxm-80gb",
    "NVIDIA A100-PCIE-40GB": "a100-pcie-40gb",
    "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "NVIDIA A30": "a30",
    "NVIDIA A40": "a40",
    "NVIDIA A10": "a10",
    "NVIDIA A10G": "a10g",
    "NVIDIA RTX A6000": "rtx-a6000",
    "NVIDIA RTX A5000": "rtx-a5000",
    "NVIDIA GeForce RTX 3090": "rtx-3090",
    "NVIDIA GeForce RTX 3080": "rtx-3080",
    # Ada Lovelace
    "NVIDIA L40S": "l40s",
    "NVIDIA L40": "l40",
    "NVIDIA L4": "l4",
    "NVIDIA RTX 6000 Ada Generation": "rtx-6000-ada",
    "NVIDIA RTX 4000 Ada Generation": "rtx-4000-ada",
    "NVIDIA GeForce RTX 4090": "rtx-4090",
    "NVIDIA GeForce RTX 4080": "rtx-4080",
    "NVIDIA GeForce RTX 4080 SUPER": "rtx-4080-super",
    # Turing, Volta, Pascal
    "Tesla T4": "t4",
    "NVIDIA TITAN V": "titan-v",
    "Tesla V100-SXM2-32GB": "v100",  # the slug `v100` is the SXM2 32 GB (docs/CATALOG.md)
    "Tesla V100-SXM2-16GB": "v100-sxm2-16gb",
    "Tesla V100-PCIE-32GB": "v100-pcie-32gb",
    "Tesla V100-PCIE-16GB": "v100-pcie-16gb",
    "GeForce GTX 1070 Ti": "gtx-1070-ti",  # older drivers print no "NVIDIA " prefix
    "NVIDIA GeForce GTX 1070 Ti": "gtx-1070-ti",
}

#: What a driver prints for a board it has no name for (data/SOURCE.md): never a class.
NAMELESS = "Graphics Device"

HOW_TO_ADD = ("to get it added, send one file and one test: the exact name in "
              "providers/runner/catalog.py (GPU_CLASSES), checked by "
              "tests/marketplace/test_catalog.py; docs/CATALOG.md says how")


class UnknownGpuProduct(LookupError):
    """The product name is not in the catalog; `product_name` holds it."""

    def __init__(self, product_name: str) -> None:
        self.product_name = product_name
        if product_name.strip() == NAMELESS:
            why = ("the driver does not know this board's name (it prints "
                   f"{NAMELESS!r}): update the NVIDIA driver, then try again; if it still "
                   f"has no name, {HOW_TO_ADD}")
        else:
            why = f"the marketplace has no GPU class for it; {HOW_TO_ADD}"
        super().__init__(f"unknown GPU product {product_name!r}: {why}")


def gpu_class_for(product_name: str) -> str:
    """Return the GPU class slug for `product_name` (exact match after trimming blanks).

    Raises UnknownGpuProduct when the name is not in GPU_CLASSES.
    """
    try:
        return GPU_CLASSES[product_name.strip()]
    except KeyError:
        raise UnknownGpuProduct(product_name) from None
