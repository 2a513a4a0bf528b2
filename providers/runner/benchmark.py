"""Benchmark the host's GPUs with a CUDA Python stack, or say plainly that none ran.

`run_benchmark()` measures, per visible CUDA device:
- matmul throughput: C = A @ B on n × n matrices (BF16 with torch; FP16 with CuPy, which has
  no BF16 type), 2·n³ FLOP per product, timed with CUDA events after a warm-up;
- device memory bandwidth: a device-to-device copy of a large buffer, counted as one read
  plus one write (2 × bytes per copy);
- correctness: the low-precision product against an FP32 product of the same (rounded)
  inputs; relative Frobenius error must be ≤ 1e-2, else `correct` is False and the figures
  must not be trusted.
Without torch-with-CUDA or CuPy, or with no CUDA device, the result says "no GPU: benchmark
not run" and carries no figure at all. This module never invents a number.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

MATMUL_N = 8192
MATMUL_ITERS = 20
COPY_BYTES = 1 << 30  # 1 GiB
COPY_ITERS = 20
MAX_REL_ERROR = 1e-2


@dataclass
class DeviceResult:
    """One CUDA device: index, name; matmul_tflops (dtype as named), memory_gbps (GB/s,
    10^9 bytes), rel_error of the matmul against FP32, correct (rel_error ≤ 1e-2)."""

    index: int
    name: str
    dtype: str
    matmul_tflops: float
    memory_gbps: float
    rel_error: float
    correct: bool


@dataclass
class BenchmarkResult:
    """ran: False when nothing was measured; reason: why not (or the backend used);
    backend: "torch" | "cupy" | None; devices: one DeviceResult per device (empty if not
    ran)."""

    ran: bool
    reason: str
    backend: str | None = None
    devices: list[DeviceResult] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """Human-readable lines, as `gpumarket-runner benchmark` prints them."""
        if not self.ran:
            return [self.reason]
        out = [f"benchmark ({self.backend}): {self.reason}"]
        for d in self.devices:
            verdict = "correct" if d.correct else "WRONG RESULT: figures not trusted"
            out.append(f"  GPU {d.index} {d.name}: {d.dtype} matmul {d.matmul_tflops:.1f} "
                       f"TFLOPS, memory {d.memory_gbps:.0f} GB/s, rel. error "
                       f"{d.rel_error:.1e} ({verdict})")
        return out


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() and torch.cuda.device_count() > 0 else None


def _cupy():
    try:
        import cupy
    except ImportError:
        return None
    try:
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # CUDARuntimeError without a driver
        return None


def _bench_torch(torch, index: int, n: int, iters: int, copy_bytes: int) -> DeviceResult:
    dev = torch.device("cuda", index)
    torch.manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    c = a @ b  # warm-up (cuBLAS handle, kernel selection)
    torch.cuda.synchronize(dev)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        c = a @ b
    stop.record()
    torch.cuda.synchronize(dev)
    seconds = start.elapsed_time(stop) / 1000
    tflops = 2 * n**3 * iters / seconds / 1e12
    ref = a.float() @ b.float()
    rel = (torch.linalg.norm(c.float() - ref) / torch.linalg.norm(ref)).item()
    del a, b, c, ref
    src = torch.empty(copy_bytes // 4, device=dev, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize(dev)
    start.record()
    for _ in range(iters):
        dst.copy_(src)
    stop.record()
    torch.cuda.synchronize(dev)
    gbps = 2 * src.numel() * 4 * iters / (start.elapsed_time(stop) / 1000) / 1e9
    del src, dst
    torch.cuda.empty_cache()
    return DeviceResult(index, torch.cuda.get_device_name(dev), "bf16", round(tflops, 1),
                        round(gbps, 1), rel, rel <= MAX_REL_ERROR)


def _bench_cupy(cp, index: int, n: int, iters: int, copy_bytes: int) -> DeviceResult:
    with cp.cuda.Device(index):
        rng = cp.random.default_rng(0)
        a = rng.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
        b = rng.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
        c = a @ b
        cp.cuda.Device(index).synchronize()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(iters):
            c = a @ b
        stop.record()
        stop.synchronize()
        seconds = cp.cuda.get_elapsed_time(start, stop) / 1000
        tflops = 2 * n**3 * iters / seconds / 1e12
        ref = a.astype(cp.float32) @ b.astype(cp.float32)
        rel = float(cp.linalg.norm(c.astype(cp.float32) - ref) / cp.linalg.norm(ref))
        del a, b, c, ref
        src = cp.empty(copy_bytes // 4, dtype=cp.float32)
        dst = cp.empty_like(src)
        dst[...] = src
        start.record()
        for _ in range(iters):
            dst[...] = src
        stop.record()
        stop.synchronize()
        gbps = 2 * src.nbytes * iters / (cp.cuda.get_elapsed_time(start, stop) / 1000) / 1e9
        name = cp.cuda.runtime.getDeviceProperties(index)["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
    return DeviceResult(index, name, "fp16", round(tflops, 1), round(gbps, 1), rel,
                        rel <= MAX_REL_ERROR)


def run_benchmark(*, n: int = MATMUL_N, iters: int = MATMUL_ITERS,
                  copy_bytes: int = COPY_BYTES) -> BenchmarkResult:
    """Benchmark every CUDA device with torch (preferred) or CuPy; without either, or
    without a device, return ran=False, reason "no GPU: benchmark not run (…)", no figures."""
    torch = _torch()
    if torch is not None:
        devices = [_bench_torch(torch, i, n, iters, copy_bytes)
                   for i in range(torch.cuda.device_count())]
        return BenchmarkResult(True, f"{len(devices)} device(s), n={n}", "torch", devices)
    cp = _cupy()
    if cp is not None:
        count = cp.cuda.runtime.getDeviceCount()
        devices = [_bench_cupy(cp, i, n, iters, copy_bytes) for i in range(count)]
        return BenchmarkResult(True, f"{len(devices)} device(s), n={n}", "cupy", devices)
    return BenchmarkResult(
        False,
        "no GPU: benchmark not run (needs torch with CUDA or CuPy, and a CUDA device; "
        "no figures are reported)",
    )
