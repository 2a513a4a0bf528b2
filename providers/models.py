"""Providers, their nodes (GPU hosts) and GPUs, as the runner reports them."""

from __future__ import annotations

import hashlib
import secrets
import uuid

from django.conf import settings
from django.db import models

TOKEN_PREFIX = "gmr_"


def hash_token(token: str) -> str:
    """SHA-256 hex of a runner token; only this is stored."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


class Provider(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                related_name="provider")
    display_name = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.display_name


class Node(models.Model):
    """One GPU host, served by one runner authenticated by its token."""

    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="nodes")
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False,
                           help_text="labels the node's containers (unique across databases)")
    name = models.CharField(max_length=100)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_rotated_at = models.DateTimeField(
        null=True, blank=True, editable=False,
        help_text="when the provider last replaced the runner token (empty: never)")
    hostname = models.CharField(max_length=255, blank=True)
    driver_version = models.CharField(max_length=32, blank=True)
    cuda_version = models.CharField(max_length=32, blank=True)
    runner_version = models.CharField(max_length=32, blank=True)
    reliability = models.DecimalField(
        max_digits=4, decimal_places=3, null=True, blank=True,
        help_text="leases completed / (completed + failed by the provider's fault) over 30 "
                  "days (marketplace/reliability.py), refreshed when a lease on the node "
                  "ends; empty: no record yet")
    inventory_source = models.CharField(max_length=120, blank=True,
                                        help_text="'nvml' or 'simulate:<dump file>'")
    runtime = models.CharField(max_length=16, blank=True, help_text="docker | process")
    registered_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    retired_at = models.DateTimeField(
        null=True, blank=True, editable=False,
        help_text="when the provider retired the node (empty: in service); a retired node "
                  "has no asks, no runner token and is listed nowhere, its history stays")
    created_at = models.DateTimeField(auto_now_add=True)
    maintenance_from = models.DateTimeField(
        null=True, blank=True, editable=False,
        help_text="start of the node's next maintenance window not yet over (empty: none); "
                  "its asks sell no time past it (providers/maintenance.py keeps it)")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["provider", "name"], name="node_unique_name"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.provider})"


class ListedGpus(models.Manager):
    """The units the market may offer: whole GPUs and the MIG slices of the current layout
    (`listed`). The parent of slices and the slices of a replaced layout are left out."""

    def get_queryset(self):
        return super().get_queryset().filter(listed=True)


class Gpu(models.Model):
    """One unit of a node, identified by its NVML UUID: a whole GPU ("GPU-…") or a MIG
    slice ("MIG-…", `parent` its GPU, `mig_profile` e.g. "1g.10gb"). A GPU is listed whole
    or as slices, never both (docs/RUNNER_PROTOCOL.md, "MIG slices").

    `Gpu.objects` (and `node.gpus`) hold only listed units: the market never sees the
    parent of slices (kept for its health) nor a slice of a replaced layout (kept while
    leases name it). `Gpu.every` holds them all."""

    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="gpus")
    uuid = models.CharField(max_length=64, unique=True)
    gpu_class = models.ForeignKey("marketplace.GpuClass", on_delete=models.PROTECT,
                                  related_name="gpus")
    product_name = models.CharField(max_length=100)
    memory_mib = models.PositiveIntegerField()
    pci_bus_id = models.CharField(max_length=32)
    mig_mode = models.CharField(max_length=16, blank=True)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT,
                               related_name="slices",
                               help_text="the GPU this MIG slice is part of; empty: a GPU")
    mig_profile = models.CharField(max_length=32, blank=True,
                                   help_text="MIG GPU instance profile, e.g. 1g.10gb")
    sm_count = models.PositiveIntegerField(null=True, blank=True,
                                           help_text="streaming multiprocessors of the slice")
    gpu_instance_id = models.PositiveIntegerField(null=True, blank=True)
    compute_instance_id = models.PositiveIntegerField(null=True, blank=True)
    listed = models.BooleanField(
        default=True, help_text="offered as a unit; false: the parent of MIG slices, or a "
                                "slice of a replaced MIG layout that a lease still names")
    last_health = models.JSONField(default=dict, blank=True)
    healthy = models.BooleanField(
        default=True, help_text="false while the runner reports a fatal finding for it")
    findings = models.JSONField(default=list, blank=True,
                                help_text="the runner's latest non-ok health findings")
    unhealthy_since = models.DateTimeField(null=True, blank=True)
    # Topology, as the runner's inventory reports it (docs/RUNNER_PROTOCOL.md, "Topology")
    nvlink_links_active = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="active NVLinks; null: the GPU reported none")
    nvlink_peers = models.JSONField(
        default=list, blank=True,
        help_text="PCI bus ids of this node's GPUs it reaches over NVLink (sorted)")
    pcie_generation = models.PositiveSmallIntegerField(null=True, blank=True)
    pcie_width = models.PositiveSmallIntegerField(null=True, blank=True,
                                                  help_text="PCIe lanes (max link width)")
    created_at = models.DateTimeField(auto_now_add=True)

    every = models.Manager()
    objects = ListedGpus()

    class Meta:
        ordering = ["node_id", "pci_bus_id", "gpu_instance_id"]
        default_manager_name = "objects"
        base_manager_name = "every"

    def __str__(self) -> str:
        return f"{self.product_name} {self.uuid}"


class LeaseLog(models.Model):
    """The latest tail of a lease container's output, as the node's runner last sent it.

    The lease is a marketplace model and providers import no marketplace code, so the lease
    is named by its id; the runner view checks that the lease runs on `node`."""

    MAX_BYTES = 64 * 1024

    lease_id = models.BigIntegerField(unique=True)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="lease_logs")
    tail = models.TextField(blank=True)
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"log of lease {self.lease_id}"


class GpuBenchmark(models.Model):
    """One benchmark run of one GPU, as its node's runner measured and reported it
    (POST /api/v1/runner/benchmarks/, providers/runner/benchmark.py).

    Units (exact decimals, never float; one decimal place, as the runner rounds them):
    - `bf16_tflops`, `fp16_tflops`: dense matrix-multiply throughput in TFLOPS (10^12
      floating-point operations per second, 2·n³ per n×n product), BF16 resp. FP16 inputs;
      empty when that precision was not measured (e.g. CuPy has no BF16).
    - `memory_bandwidth_gbps`: device memory bandwidth in GB/s (10^9 bytes/s; a
      device-to-device copy counted as one read plus one write).
    - `host_to_device_gbps`, `device_to_host_gbps`: copy bandwidth over the host link
      (PCIe / NVLink-C2C) in GB/s, from pinned host memory.
    `correct` is false when the low-precision product differed from the FP32 reference by
    more than the runner's tolerance (relative error > 1e-2): such a row is kept for the
    record but its figures are never shown as a score. `raw` is the runner's report for this
    GPU as sent (relative error, backend, matrix size, …)."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="benchmarks")
    measured_at = models.DateTimeField(db_index=True, help_text="when the runner measured")
    received_at = models.DateTimeField(auto_now_add=True)
    backend = models.CharField(max_length=16, blank=True, help_text="torch | cupy")
    bf16_tflops = models.DecimalField(max_digits=7, decimal_places=1, null=True, blank=True,
                                      help_text="BF16 dense matmul TFLOPS, measured")
    fp16_tflops = models.DecimalField(max_digits=7, decimal_places=1, null=True, blank=True,
                                      help_text="FP16 dense matmul TFLOPS, measured")
    memory_bandwidth_gbps = models.DecimalField(
        max_digits=7, decimal_places=1, null=True, blank=True,
        help_text="device memory bandwidth GB/s, measured")
    host_to_device_gbps = models.DecimalField(
        max_digits=6, decimal_places=1, null=True, blank=True,
        help_text="host → device copy GB/s, measured")
    device_to_host_gbps = models.DecimalField(
        max_digits=6, decimal_places=1, null=True, blank=True,
        help_text="device → host copy GB/s, measured")
    correct = models.BooleanField(
        help_text="the correctness check passed; false: stored, never shown as a score")
    runner_version = models.CharField(max_length=32, blank=True)
    raw = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-measured_at", "-pk"]
        indexes = [models.Index(fields=["gpu", "-measured_at"], name="gpubench_gpu_latest")]

    def __str__(self) -> str:
        return f"benchmark of {self.gpu_id} at {self.measured_at:%Y-%m-%d %H:%M}"


class MaintenanceWindow(models.Model):
    """A provider's announced maintenance of a node, [starts_at, ends_at): its asks sell
    no time that overlaps it, its running leases that would overlap get their notice at
    starts_at minus the notice period and end at starts_at (docs/LEASE_CONTRACT.md)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE,
                             related_name="maintenance_windows")
    starts_at = models.DateTimeField(db_index=True)
    ends_at = models.DateTimeField()
    reason = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["starts_at", "pk"]
        constraints = [
            models.CheckConstraint(condition=models.Q(ends_at__gt=models.F("starts_at")),
                                   name="maintenance_ends_after_start"),
        ]

    def __str__(self) -> str:
        return f"maintenance of node {self.node_id} {self.starts_at} – {self.ends_at}"


class NodeImage(models.Model):
    """An image the node's engine holds, as its runner last reported it (heartbeat
    `images`, docs/IMAGES.md): `image` in the runner's normal form (pull.normalize: a tag
    always, no docker.io/library/), `bytes` its size on the engine. Rewritten only when
    the report changes (providers/node_images.py)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="images")
    image = models.CharField(max_length=255)
    bytes = models.BigIntegerField(default=0)
    reported_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "image"],
                                               name="node_image_unique")]
        indexes = [models.Index(fields=["image"], name="node_image_by_image")]

    def __str__(self) -> str:
        return f"{self.image} on node {self.node_id}"
