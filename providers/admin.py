from django.contrib import admin

from providers.models import Gpu, Node, Provider


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    list_display = ["id", "display_name", "user", "created_at"]


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ["uuid", "product_name", "gpu_class", "memory_mib", "pci_bus_id"]
    readonly_fields = fields


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "provider", "hostname", "driver_version", "runtime",
                    "last_heartbeat_at"]
    exclude = ["token_hash"]
    inlines = [GpuInline]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["uuid", "product_name", "gpu_class", "node", "memory_mib"]
