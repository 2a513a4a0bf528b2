"""Map an NVIDIA product name (as NVML and `nvidia-smi -q` report it) to a GPU class slug.

The table is exact: a name that is not in it is refused, never guessed from a prefix,
because the GPU class decides the price a buyer pays.
"""

from __future__ import annotations

#: Product name, exactly as reported by NVML `nvmlDeviceGetName` / "Product Name" → class slug.
GPU_CLASSES: dict[str, str] = {
    "NVIDIA H100 80GB HBM3": "h100-sxm-80gb",
    "NVIDIA A100-SXM4-80GB": "a100-sxm-80gb",
    "NVIDIA L40S": "l40s",
    "NVIDIA GeForce RTX 4090": "rtx-4090",
    "NVIDIA A10": "a10",
    "NVIDIA TITAN V": "titan-v",
    "Tesla V100-SXM2-32GB": "v100",
    "Tesla V100-SXM2-16GB": "v100",
}


class UnknownGpuProduct(LookupError):
    """The product name is not in the catalog; `product_name` holds it."""

    def __init__(self, product_name: str) -> None:
        self.product_name = product_name
        super().__init__(
            f"unknown GPU product {product_name!r}: the marketplace has no GPU class for it "
            f"(known: {', '.join(sorted(GPU_CLASSES))})"
        )


def gpu_class_for(product_name: str) -> str:
    """Return the GPU class slug for `product_name` (exact match after trimming blanks).

    Raises UnknownGpuProduct when the name is not in GPU_CLASSES.
    """
    try:
        return GPU_CLASSES[product_name.strip()]
    except KeyError:
        raise UnknownGpuProduct(product_name) from None
