"""Response shapes of the market data API: GPU classes (with their benchmark and slices),
environment templates, the offers behind a class and the book's depth. Prices are USD
strings per GPU-hour (UsdField)."""

from __future__ import annotations

from rest_framework import serializers

from marketplace import env_templates, interconnect
from marketplace.catalog import slice_of
from marketplace.models import GpuClass
from providers.benchmarks import class_summary
from settlement.fields import UsdField


class GpuClassSerializer(serializers.ModelSerializer):
    """A GPU class with its datasheet figures (and their source) and `benchmark`: what the
    runners measured, the median of the latest passed results of the class's healthy GPUs
    ({gpus, bf16_tflops, datasheet_bf16_tflops, memory_bandwidth_gbps,
    datasheet_memory_bandwidth_gbps, measured_at, summary}; TFLOPS and GB/s as decimal
    strings), or null when no GPU of the class has been benchmarked yet
    (providers/benchmarks.py). A MIG slice market has `parent` (the whole GPU's slug),
    `mig_profile` ("1g.10gb") and `slice` ({of, fraction "1/7", memory_gb, sm_count or
    null}); a whole GPU has them null/""/null and lists its slice markets in `slices`
    (docs/CATALOG.md)."""

    reference_price = UsdField()
    benchmark = serializers.SerializerMethodField()
    parent = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    slice = serializers.SerializerMethodField()
    slices = serializers.SerializerMethodField()

    class Meta:
        model = GpuClass
        fields = ["slug", "name", "memory_gb", "memory_bandwidth_gbps", "bf16_dense_tflops",
                  "datasheet_source", "reference_price", "benchmark", "parent", "mig_profile",
                  "slice", "slices"]

    def get_slice(self, gpu_class) -> dict | None:
        return slice_of(gpu_class)

    def get_slices(self, gpu_class) -> list[str]:
        return sorted(c.slug for c in gpu_class.slices.all())

    def get_benchmark(self, gpu_class) -> dict | None:
        benchmarked = self.context.get("benchmarked")  # the list's: 1 query, not 1 per class
        if benchmarked is not None and gpu_class.pk not in benchmarked:
            return None
        score = class_summary(gpu_class)
        return score.as_api() if score else None


class TemplatePortSerializer(serializers.Serializer):
    port = serializers.IntegerField()
    role = serializers.ChoiceField(choices=env_templates.ROLES)


class TemplateSerializer(serializers.Serializer):
    """One environment template (env_templates.Template.as_api)."""

    id = serializers.CharField()
    title = serializers.CharField()
    image = serializers.CharField(help_text='"" for custom: your own image')
    command = serializers.ListField(child=serializers.CharField(), allow_null=True)
    ports = TemplatePortSerializer(many=True)
    env = serializers.DictField(child=serializers.CharField())
    min_cuda = serializers.CharField(help_text='"12.4"; "" when none')
    needs_shell_user = serializers.BooleanField()
    cuda_source = serializers.CharField(help_text="where min_cuda comes from")


class TemplateListSerializer(serializers.Serializer):
    results = TemplateSerializer(many=True)


class MaintenanceSpanSerializer(serializers.Serializer):
    """A maintenance window of an offer's node: it sells no time past starts_at."""

    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()


class OfferSerializer(serializers.Serializer):
    """A standing ask of the market, anonymous: price, GPUs offered, the node's GPUs of the
    class and their interconnect ("NVLink full mesh", "NVLink pairs", "NVLink, partly
    connected", "PCIe only", "NVLink, peers unknown"; empty for a lone GPU),
    `summary` ("8 × H100 SXM 80GB, NVLink full mesh") and `maintenance`: the node's
    announced windows not yet over."""

    price = UsdField()
    gpus = serializers.IntegerField()
    node_gpus = serializers.IntegerField()
    interconnect = serializers.CharField()
    summary = serializers.CharField()
    maintenance = MaintenanceSpanSerializer(many=True)
    reliability = serializers.CharField(
        allow_null=True, help_text='the node\'s 30-day reliability, "0.950" (docs/FAULTS.md); '
                                   "null: no record yet")


class GpuClassDetailSerializer(GpuClassSerializer):
    """GpuClassSerializer with `offers`: the market's standing asks, cheapest first, each
    with its node's GPUs and interconnect (OfferSerializer; marketplace/interconnect.py)."""

    offers = serializers.SerializerMethodField()

    class Meta(GpuClassSerializer.Meta):
        fields = [*GpuClassSerializer.Meta.fields, "offers"]

    def get_offers(self, gpu_class) -> list[dict]:
        return OfferSerializer(interconnect.offers(gpu_class), many=True).data


class LevelSerializer(serializers.Serializer):
    price = UsdField()
    gpus = serializers.IntegerField()


class DepthSerializer(serializers.Serializer):
    gpu_class = serializers.CharField()
    bids = LevelSerializer(many=True)
    asks = LevelSerializer(many=True)
    note = serializers.CharField(help_text="why bids at or above the best ask rest "
                                 "(selectors.crossed_note), \"\" when none does")
