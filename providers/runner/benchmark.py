"""Benchmark the host's GPUs with a CUDA Python stack, or say plainly that none ran.

`run_benchmark()` measures, per visible CUDA device:
- matmul throughput: C = A @ B on n × n matrices, 2·n³ FLOP per product, timed with CUDA
  events after a warm-up; BF16 and FP16 with torch, FP16 only with CuPy (no BF16 type);
- device memory bandwidth: a device-to-device copy of a large buffer, counted as one read
  plus one write (2 × bytes per copy);
- host↔device bandwidth: copies between pinned host memory and the device, each way;
- correctness: each low-precision product against an FP32 product of the same (rounded)
  inputs — the relative Frobenius error must be ≤ 1e-2 — and the host→device→host round
  trip must return the very bytes sent; otherwise `correct` is False and the figures must
  not be trusted (the marketplace stores such a result but never shows it as a score).
Units: TFLOPS = 10^12 FLOP/s; GB/s = 10^9 bytes/s; figures rounded to one decimal place.
Without torch-with-CUDA or CuPy, or with no CUDA device, the result says "no GPU: benchmark
not run" and carries no figure at all. This module never invents a number.

`report_body()` turns a result into the body of POST /api/v1/runner/benchmarks/
(docs/RUNNER_PROTOCOL.md); `BenchmarkSchedule` says when `gpumarket-runner run` benchmarks
again (every `interval` seconds, only while the node has no lease).
"""

from __future__ import annotations

import math
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime

MATMUL_N = 8192
MATMUL_ITERS = 20
COPY_BYTES = 1 << 30  # 1 GiB
HOST_COPY_BYTES = 1 << 28  # 256 MiB
MAX_REL_ERROR = 1e-2
DEFAULT_INTERVAL_S = 24 * 3600


@dataclass
class DeviceResult:
    """One CUDA device.

    index, name; uuid: "GPU-…" as NVML names it (None if the stack does not tell);
    dtype / matmul_tflops: the headline precision and its TFLOPS ("bf16" with torch, "fp16"
    with CuPy); bf16_tflops, fp16_tflops: TFLOPS per precision (None: not measured);
    memory_gbps: device memory GB/s; h2d_gbps, d2h_gbps: host→device and device→host GB/s
    (pinned memory; None: not measured); rel_error: the largest relative error of the
    products against FP32; correct: rel_error ≤ 1e-2 and the round trip returned the bytes.
    """

    index: int
    name: str
    dtype: str
    matmul_tflops: float
    memory_gbps: float
    rel_error: float
    correct: bool
    uuid: str | None = None
    bf16_tflops: float | None = None
    fp16_tflops: float | None = None
    h2d_gbps: float | None = None
    d2h_gbps: float | None = None
    transfer_ok: bool = True


@dataclass
class BenchmarkResult:
    """ran: False when nothing was measured; reason: why not (or what ran); backend:
    "torch" | "cupy" | None; devices: one DeviceResult per device (empty if not ran);
    measured_at: when it finished (None if not ran); n: the matrix size."""

    ran: bool
    reason: str
    backend: str | None = None
    devices: list[DeviceResult] = field(default_factory=list)
    measured_at: datetime | None = None
    n: int | None = None

    def as_dict(self) -> dict:
        out = asdict(self)
        out["measured_at"] = self.measured_at.isoformat() if self.measured_at else None
        return out

    @classmethod
    def from_dict(cls, data: dict) -> BenchmarkResult:
        """The inverse of as_dict (what `gpumarket-runner benchmark --json` prints)."""
        at = data.get("measured_at")
        return cls(bool(data["ran"]), str(data["reason"]), data.get("backend"),
                   [DeviceResult(**d) for d in data.get("devices") or []],
                   datetime.fromisoformat(at) if at else None, data.get("n"))

    def lines(self) -> list[str]:
        """Human-readable lines, as `gpumarket-runner benchmark` prints them."""
        if not self.ran:
            return [self.reason]
        out = [f"benchmark ({self.backend}): {self.reason}"]
        for d in self.devices:
            verdict = ("correct" if d.correct else "WRONG RESULT: figures not trusted"
                       if d.transfer_ok else "WRONG RESULT: the host↔device round trip "
                       "changed bytes; figures not trusted")
            parts = [f"{p} matmul {v:.1f} TFLOPS" for p, v in
                     (("BF16", d.bf16_tflops), ("FP16", d.fp16_tflops)) if v is not None]
            parts.append(f"memory {d.memory_gbps:.0f} GB/s")
            if d.h2d_gbps is not None and d.d2h_gbps is not None:
                parts.append(f"host→device {d.h2d_gbps:.1f} GB/s, device→host "
                             f"{d.d2h_gbps:.1f} GB/s")
            out.append(f"  GPU {d.index} {d.name} {d.uuid or ''}: {', '.join(parts)}, rel. "
                       f"error {d.rel_error:.1e} ({verdict})")
        return out


def _torch():
    try:
        import torch
    except ImportError:
        return None
    try:
        return torch if torch.cuda.is_available() and torch.cuda.device_count() > 0 else None
    except Exception:  # a broken driver install
        return None


def _cupy():
    try:
        import cupy
    except ImportError:
        return None
    try:
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # CUDARuntimeError without a driver
        return None


def available() -> str | None:
    """The backend a benchmark would use ("torch" or "cupy"), or None when this host has no
    CUDA Python stack with a device. Measures nothing."""
    if _torch() is not None:
        return "torch"
    if _cupy() is not None:
        return "cupy"
    return None


def nvml_uuid(raw) -> str | None:
    """A CUDA device UUID (16 bytes, a uuid.UUID, or text with or without the "GPU-"
    prefix) as NVML spells it: "GPU-xxxxxxxx-xxxx-…"; None if it cannot be read."""
    if raw is None:
        return None
    if isinstance(raw, bytes | bytearray):
        if len(raw) != 16:
            return None
        return f"GPU-{uuidlib.UUID(bytes=bytes(raw))}"
    text = str(raw).strip()
    if text.startswith(("GPU-", "MIG-")):
        return text
    try:
        return f"GPU-{uuidlib.UUID(text)}"
    except ValueError:
        return None


def typed_uuid(uuid: str | None, known: list[str] | None) -> str | None:
    """`uuid` as the inventory names it: CUDA (torch, CuPy) gives a MIG device's UUID
    without its type, so nvml_uuid reads it as "GPU-…"; when the inventory has no such
    GPU but has "MIG-…" with the same digits, that slice is meant."""
    if uuid is None or known is None or uuid in known or not uuid.startswith("GPU-"):
        return uuid
    mig = "MIG-" + uuid[4:]
    return mig if mig in known else uuid


def _round(x: float) -> float:
    return round(float(x), 1)


def matmul_tflops(n: int, iters: int, elapsed_ms: float) -> float:
    """TFLOPS (10^12 FLOP/s) of `iters` n×n products (2·n³ FLOP each) in `elapsed_ms`
    milliseconds (what CUDA events measure)."""
    return 2 * n**3 * iters / (elapsed_ms / 1000) / 1e12


def bandwidth_gbps(nbytes: int, iters: int, elapsed_ms: float) -> float:
    """GB/s (10^9 bytes/s) of `iters` transfers of `nbytes` each in `elapsed_ms`
    milliseconds; a device-to-device copy passes 2 × its size (one read, one write)."""
    return nbytes * iters / (elapsed_ms / 1000) / 1e9


def passed(rel_error: float, transfer_ok: bool) -> bool:
    """The correctness verdict: a finite relative error ≤ MAX_REL_ERROR and a round trip
    that returned the bytes sent. NaN or infinity in a product (a broken GPU's usual
    symptom) fails."""
    return math.isfinite(rel_error) and rel_error <= MAX_REL_ERROR and bool(transfer_ok)


def _json_error(rel_error: float) -> float | str:
    """rel_error for the report body: strict JSON has no NaN or infinity (httpx refuses to
    encode them), so a non-finite error is sent as text ("nan", "inf")."""
    return rel_error if math.isfinite(rel_error) else str(rel_error)


def _torch_matmul(torch, dev, dtype, n: int, iters: int) -> tuple[float, float]:
    """(TFLOPS, relative error against FP32) of n×n products in `dtype`."""
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=torch.float32, generator=gen).to(dtype)
    b = torch.randn(n, n, device=dev, dtype=torch.float32, generator=gen).to(dtype)
    c = a @ b  # warm-up (cuBLAS handle, kernel selection)
    torch.cuda.synchronize(dev)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        c = a @ b
    stop.record()
    torch.cuda.synchronize(dev)
    elapsed_ms = start.elapsed_time(stop)
    ref = a.float() @ b.float()
    rel = (torch.linalg.norm(c.float() - ref) / torch.linalg.norm(ref)).item()
    del a, b, c, ref
    return matmul_tflops(n, iters, elapsed_ms), rel


def _bench_torch(torch, index: int, n: int, iters: int, copy_bytes: int,
                 host_bytes: int) -> DeviceResult:
    dev = torch.device("cuda", index)
    with torch.cuda.device(dev):
        bf16, rel_bf16 = _torch_matmul(torch, dev, torch.bfloat16, n, iters)
        fp16, rel_fp16 = _torch_matmul(torch, dev, torch.float16, n, iters)
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        src = torch.empty(copy_bytes // 4, device=dev, dtype=torch.float32)
        dst = torch.empty_like(src)
        dst.copy_(src)
        torch.cuda.synchronize(dev)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        stop.record()
        torch.cuda.synchronize(dev)
        gbps = bandwidth_gbps(2 * src.numel() * src.element_size(), iters,
                              start.elapsed_time(stop))
        del src, dst
        # host ↔ device, pinned memory; the round trip must return the bytes sent
        count = host_bytes // 4
        host = torch.arange(count, dtype=torch.int32).pin_memory()
        back = torch.zeros(count, dtype=torch.int32).pin_memory()
        on_dev = torch.empty(count, dtype=torch.int32, device=dev)
        on_dev.copy_(host, non_blocking=True)
        nbytes = host.numel() * host.element_size()
        torch.cuda.synchronize(dev)
        start.record()
        for _ in range(iters):
            on_dev.copy_(host, non_blocking=True)
        stop.record()
        torch.cuda.synchronize(dev)
        h2d = bandwidth_gbps(nbytes, iters, start.elapsed_time(stop))
        start.record()
        for _ in range(iters):
            back.copy_(on_dev, non_blocking=True)
        stop.record()
        torch.cuda.synchronize(dev)
        d2h = bandwidth_gbps(nbytes, iters, start.elapsed_time(stop))
        transfer_ok = bool(torch.equal(host, back))
        del host, back, on_dev
        torch.cuda.empty_cache()
        props = torch.cuda.get_device_properties(dev)
    rel = max(rel_bf16, rel_fp16)
    return DeviceResult(
        index, torch.cuda.get_device_name(dev), "bf16", _round(bf16), _round(gbps), rel,
        passed(rel, transfer_ok), uuid=nvml_uuid(getattr(props, "uuid", None)),
        bf16_tflops=_round(bf16), fp16_tflops=_round(fp16), h2d_gbps=_round(h2d),
        d2h_gbps=_round(d2h), transfer_ok=transfer_ok)


def _bench_cupy(cp, index: int, n: int, iters: int, copy_bytes: int,
                host_bytes: int) -> DeviceResult:
    import numpy as np

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
        tflops = matmul_tflops(n, iters, cp.cuda.get_elapsed_time(start, stop))
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
        gbps = bandwidth_gbps(2 * src.nbytes, iters, cp.cuda.get_elapsed_time(start, stop))
        del src, dst
        count = host_bytes // 4
        pinned = cp.cuda.alloc_pinned_memory(host_bytes)
        host = np.frombuffer(pinned, dtype=np.int32, count=count)
        host[...] = np.arange(count, dtype=np.int32)
        pinned_back = cp.cuda.alloc_pinned_memory(host_bytes)
        back = np.frombuffer(pinned_back, dtype=np.int32, count=count)
        on_dev = cp.empty(count, dtype=cp.int32)
        on_dev.set(host)
        cp.cuda.Device(index).synchronize()
        start.record()
        for _ in range(iters):
            on_dev.set(host)
        stop.record()
        stop.synchronize()
        h2d = bandwidth_gbps(host.nbytes, iters, cp.cuda.get_elapsed_time(start, stop))
        start.record()
        for _ in range(iters):
            on_dev.get(out=back)
        stop.record()
        stop.synchronize()
        d2h = bandwidth_gbps(host.nbytes, iters, cp.cuda.get_elapsed_time(start, stop))
        transfer_ok = bool(np.array_equal(host, back))
        del on_dev
        props = cp.cuda.runtime.getDeviceProperties(index)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
    return DeviceResult(index, name, "fp16", _round(tflops), _round(gbps), rel,
                        passed(rel, transfer_ok), uuid=nvml_uuid(props.get("uuid")),
                        fp16_tflops=_round(tflops), h2d_gbps=_round(h2d), d2h_gbps=_round(d2h),
                        transfer_ok=transfer_ok)


def run_benchmark(*, n: int = MATMUL_N, iters: int = MATMUL_ITERS,
                  copy_bytes: int = COPY_BYTES, host_bytes: int = HOST_COPY_BYTES
                  ) -> BenchmarkResult:
    """Benchmark every CUDA device with torch (preferred) or CuPy; without either, or
    without a device, return ran=False, reason "no GPU: benchmark not run (…)", no figures."""
    torch = _torch()
    if torch is not None:
        devices = [_bench_torch(torch, i, n, iters, copy_bytes, host_bytes)
                   for i in range(torch.cuda.device_count())]
        return BenchmarkResult(True, f"{len(devices)} device(s), n={n}", "torch", devices,
                               datetime.now(UTC), n)
    cp = _cupy()
    if cp is not None:
        count = cp.cuda.runtime.getDeviceCount()
        devices = [_bench_cupy(cp, i, n, iters, copy_bytes, host_bytes) for i in range(count)]
        return BenchmarkResult(True, f"{len(devices)} device(s), n={n}", "cupy", devices,
                               datetime.now(UTC), n)
    return BenchmarkResult(
        False,
        "no GPU: benchmark not run (needs torch with CUDA or CuPy, and a CUDA device; "
        "no figures are reported)",
    )


def report_body(result: BenchmarkResult, runner_version: str,
                known_uuids: list[str] | None = None) -> tuple[dict | None, list[str]]:
    """(body of POST /api/v1/runner/benchmarks/, notes) for a result that ran.

    One item per device whose NVML UUID is known (in `known_uuids` when given: the node's
    inventory); a device without one is left out and named in `notes`. Figures are sent as
    JSON numbers with one decimal place (a failed result's only in raw["figures"], its
    figures null); `raw` carries the rest (name, index, dtype,
    rel_error — "nan" or "inf" as text when not finite, which strict JSON cannot carry —,
    transfer_ok, n). body is None when nothing can be reported (not ran, or no device with a
    known UUID): nothing is ever reported without a measurement."""
    notes: list[str] = []
    if not result.ran or result.backend is None:
        return None, [result.reason]
    measured = (result.measured_at or datetime.now(UTC)).isoformat()
    items = []
    for d in result.devices:
        d = replace(d, uuid=typed_uuid(d.uuid, known_uuids))
        if d.uuid is None or (known_uuids is not None and d.uuid not in known_uuids):
            notes.append(f"GPU {d.index} {d.name}: UUID {d.uuid or 'unknown'} is not in this "
                         "node's inventory; its result is not reported")
            continue
        figures = {"bf16_tflops": d.bf16_tflops, "fp16_tflops": d.fp16_tflops,
                   "memory_bandwidth_gbps": d.memory_gbps, "host_to_device_gbps": d.h2d_gbps,
                   "device_to_host_gbps": d.d2h_gbps}
        raw = {"index": d.index, "name": d.name, "dtype": d.dtype,
               "rel_error": _json_error(d.rel_error), "transfer_ok": d.transfer_ok,
               "n": result.n, "backend": result.backend}
        if not d.correct:
            # a failed result is never a score: its figures (possibly absurd, from a broken
            # GPU) travel in raw only, so they cannot get the whole report refused as
            # implausible and the failure is still stored
            raw["figures"] = {k: _json_error(v) for k, v in figures.items() if v is not None}
            figures = dict.fromkeys(figures)
        items.append({"uuid": d.uuid, "measured_at": measured, "correct": bool(d.correct),
                      **figures, "raw": raw})
    if not items:
        return None, notes
    return {"runner_version": runner_version, "backend": result.backend,
            "results": items}, notes


def run_in_subprocess(timeout: float = 1800.0, visible: str | None = None) -> BenchmarkResult:
    """Run the benchmark in a child process (`python -m providers.runner benchmark --json
    --no-post`), so the long-lived `run` never imports torch or CuPy (hundreds of MB
    resident) and a crash in a CUDA library cannot take the agent down. A child that fails
    or times out gives ran=False with the reason: never a figure. `visible`: the child's
    CUDA_VISIBLE_DEVICES (a MIG slice's "MIG-…" UUID: run_slices)."""
    import json
    import os
    import subprocess
    import sys

    command = [sys.executable, "-m", "providers.runner", "benchmark", "--json", "--no-post"]
    env = None if visible is None else {**os.environ, "CUDA_VISIBLE_DEVICES": visible}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              check=False, env=env)
    except subprocess.TimeoutExpired:
        return BenchmarkResult(False, f"benchmark failed: timed out after {timeout:g} s")
    try:
        return BenchmarkResult.from_dict(json.loads(done.stdout))
    except (ValueError, KeyError, TypeError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return BenchmarkResult(False, f"benchmark failed (exit status {done.returncode}): "
                                      f"{tail[0][:300]}")


def run_slices(uuids: list[str], run: Callable[..., BenchmarkResult] = run_in_subprocess
               ) -> BenchmarkResult:
    """Benchmark each unit of `uuids` in a child of its own that sees only it (CUDA lets
    a process use one MIG device: with CUDA_VISIBLE_DEVICES unset it sees the first), and
    merge the results, devices numbered in `uuids` order. Not ran when none ran."""
    results = [run(visible=uuid) for uuid in uuids]
    ran = [r for r in results if r.ran]
    if not ran:
        return results[0] if results else BenchmarkResult(False, "no GPU: benchmark not run")
    devices = [replace(d, index=i) for i, d in enumerate(d for r in ran for d in r.devices)]
    return BenchmarkResult(True, ran[0].reason, ran[0].backend, devices,
                           ran[-1].measured_at, ran[0].n)


class BenchmarkSchedule:
    """When `run` benchmarks again: every `interval` seconds (0 or less: never), counted
    from the last run (the first is due `interval` after start, since `register` ran one),
    and only while the node is idle (no lease at all: a benchmark would compete with a
    buyer's workload and measure less). clock: a monotonic clock in seconds (tests)."""

    def __init__(self, interval: float = DEFAULT_INTERVAL_S, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self.last = clock()

    def due(self, *, busy: bool) -> bool:
        """True when a benchmark should run now (interval passed and not busy)."""
        if self.interval <= 0 or busy:
            return False
        return self.clock() - self.last >= self.interval

    def done(self) -> None:
        """A benchmark ran (or was tried): the next is due `interval` from now."""
        self.last = self.clock()


def post_result(client, result: BenchmarkResult, runner_version: str,
                known_uuids: list[str] | None, log: Callable[[str], None]) -> int:
    """Report `result` through `client` (client.MarketplaceClient.post_benchmarks); log
    what was left out and what was sent. Returns how many GPU results were reported (0 when
    there was nothing to report: no GPU stack, or no device with a known UUID). Marketplace
    errors propagate (client.MarketplaceError)."""
    body, notes = report_body(result, runner_version, known_uuids)
    for note in notes:
        log(note)
    if body is None:
        return 0
    client.post_benchmarks(body)
    passed = sum(1 for item in body["results"] if item["correct"])
    log(f"benchmark reported for {len(body['results'])} GPU(s) ({passed} passed the "
        "correctness check)")
    return len(body["results"])
