from django.contrib import admin

from core.admin import ReadOnlyAdmin, StrictAdmin
from providers.models import Gpu, GpuBenchmark, MaintenanceWindow, Node, Provider


@admin.register(Provider)
class ProviderAdmin(StrictAdmin):
    list_display = ["id", "display_name", "user", "created_at"]


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ["uuid", "product_name", "gpu_class", "memory_mib", "pci_bus_id", "parent",
              "listed"]
    readonly_fields = fields

    def get_queryset(self, request):  # every unit: parents of MIG slices and retired ones too
        return Gpu.every.get_queryset()


@admin.register(Node)
class NodeAdmin(StrictAdmin):
    list_display = ["id", "name", "provider", "hostname", "driver_version", "runtime",
                    "last_heartbeat_at", "token_rotated_at", "retired_at"]
    exclude = ["token_hash"]  # the runner token itself is never stored
    readonly_fields = ["token_rotated_at", "retired_at"]
    inlines = [GpuInline]


class GpuBenchmarkInline(admin.TabularInline):
    """The GPU's benchmarks, newest first, read-only (they are the runner's measurements)."""

    model = GpuBenchmark
    extra = 0
    can_delete = False
    fields = ["measured_at", "correct", "bf16_tflops", "fp16_tflops", "memory_bandwidth_gbps",
              "host_to_device_gbps", "device_to_host_gbps", "backend", "runner_version"]
    readonly_fields = fields
    ordering = ["-measured_at"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Gpu)
class GpuAdmin(StrictAdmin):
    """Every unit: whole GPUs, MIG slices (`parent`), and the unlisted ones (the parent of
    slices, a slice of a replaced layout) that the market never sees."""

    list_display = ["uuid", "product_name", "gpu_class", "node", "memory_mib", "listed"]
    list_filter = ["listed"]
    inlines = [GpuBenchmarkInline]

    def get_queryset(self, request):
        return Gpu.every.get_queryset().select_related("gpu_class", "node")


@admin.register(GpuBenchmark)
class GpuBenchmarkAdmin(ReadOnlyAdmin):
    """Benchmarks as the runners reported them: read-only. Units: TFLOPS and GB/s; a row
    with `correct` unticked failed its correctness check and is never shown as a score."""

    list_display = ["gpu", "measured_at", "correct", "bf16_tflops", "fp16_tflops",
                    "memory_bandwidth_gbps", "host_to_device_gbps", "device_to_host_gbps",
                    "runner_version"]
    list_filter = ["correct", "gpu__gpu_class"]
    search_fields = ["gpu__uuid", "gpu__node__name"]
    list_select_related = ["gpu"]


@admin.register(MaintenanceWindow)
class MaintenanceWindowAdmin(ReadOnlyAdmin):
    """Announced through the API or the portal (marketplace/maintenance.py: the asks' cut
    and the notices follow from it), so read-only here."""

    list_display = ["id", "node", "starts_at", "ends_at", "reason", "created_at"]
