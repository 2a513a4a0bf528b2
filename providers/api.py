"""Provider API: onboarding and nodes (runner tokens), plus the runner's own
inventory and heartbeat endpoints (docs/RUNNER_PROTOCOL.md)."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core.fields import (
    JsonObjectField,
    StrictBooleanField,
    StrictCharField,
    StrictInputSerializer,
    StrictIntegerField,
    StrictNumberField,
)
from core.pagination import Pagination
from providers import benchmarks, services
from providers.auth import IsRunner, RunnerTokenAuthentication
from providers.models import Gpu, GpuBenchmark, Node, Provider
from providers.services import MAX_GPUS_PER_NODE


class ProviderSerializer(serializers.ModelSerializer):
    class Meta:
        model = Provider
        fields = ["id", "display_name", "created_at"]


class GpuBenchmarkSerializer(serializers.ModelSerializer):
    """A GPU's latest benchmark. Figures are decimal strings (TFLOPS, GB/s) and are null
    when the result failed its correctness check (`correct: false`): such a result is never
    a score. `score` is the comparison with the class datasheet ("measured 794.1 of 989.4
    TFLOPS (BF16 dense); …"), empty when there is nothing to show."""

    score = serializers.SerializerMethodField()

    class Meta:
        model = GpuBenchmark
        fields = ["measured_at", "correct", "backend", "runner_version", "bf16_tflops",
                  "fp16_tflops", "memory_bandwidth_gbps", "host_to_device_gbps",
                  "device_to_host_gbps", "score"]

    def to_representation(self, instance):
        data = super().to_representation(instance)
        if not instance.correct:
            data.update(dict.fromkeys(benchmarks.FIGURES))
        return data

    def get_score(self, instance) -> str:
        score = benchmarks.gpu_score(instance.gpu, instance)
        return score.as_api()["summary"] if score else ""


class GpuSerializer(serializers.ModelSerializer):
    """`benchmark`: the GPU's latest benchmark (GpuBenchmarkSerializer), or null when it
    has not been benchmarked yet. Pass context["benchmarks"] = {gpu id: result}
    (benchmarks.latest_results) to serialize many GPUs without a query each."""

    gpu_class = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    parent_uuid = serializers.SlugRelatedField(source="parent", slug_field="uuid",
                                               read_only=True,
                                               help_text="a MIG slice's GPU; null: a GPU")
    benchmark = serializers.SerializerMethodField()

    class Meta:
        model = Gpu
        fields = ["uuid", "gpu_class", "product_name", "memory_mib", "pci_bus_id", "mig_mode",
                  "parent_uuid", "mig_profile", "sm_count", "gpu_instance_id",
                  "compute_instance_id", "nvlink_links_active", "nvlink_peers",
                  "pcie_generation", "pcie_width", "last_health", "healthy", "findings",
                  "unhealthy_since", "benchmark"]

    def get_benchmark(self, gpu) -> dict | None:
        known = self.context.get("benchmarks")
        if known is not None:
            result = known.get(gpu.pk)
        else:
            result = benchmarks.latest_results(Gpu.objects.filter(pk=gpu.pk)).get(gpu.pk)
        if result is None:
            return None
        result.gpu = gpu  # its class is loaded already
        return GpuBenchmarkSerializer(result).data


class NodeImageSerializer(serializers.Serializer):
    image = serializers.CharField()
    bytes = serializers.IntegerField()
    reported_at = serializers.DateTimeField()


class NodeSerializer(serializers.ModelSerializer):
    """A node with its GPUs and `images`: what its runner last reported its engine holds
    (docs/IMAGES.md), by image name."""

    gpus = GpuSerializer(many=True, read_only=True)
    images = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = ["id", "uid", "name", "hostname", "driver_version", "cuda_version", "runtime",
                  "inventory_source", "registered_at", "last_heartbeat_at", "token_rotated_at",
                  "reliability", "retired_at", "gpus", "images"]

    @extend_schema_field(NodeImageSerializer(many=True))
    def get_images(self, node) -> list[dict]:
        rows = sorted(node.images.all(), key=lambda row: row.image)
        return NodeImageSerializer(rows, many=True).data


class ProviderIn(StrictInputSerializer):
    display_name = StrictCharField(max_length=100)


class ProviderOnboard(APIView):
    """Become a provider: 201 with the new provider. Idempotent: when you are one already,
    the same display_name answers 200 with the existing provider, unchanged; another
    display_name is a 409 naming it (onboarding never renames). GET shows your provider
    profile."""

    @extend_schema(request=ProviderIn,
                   responses={201: ProviderSerializer, 200: ProviderSerializer})
    def post(self, request):
        data = ProviderIn(data=request.data)
        data.is_valid(raise_exception=True)
        name = data.validated_data["display_name"]
        existing = Provider.objects.filter(user=request.user).first()
        if existing is not None:
            if existing.display_name != name.strip()[:100]:
                raise services.ProviderConflict(
                    f"you are a provider already, as '{existing.display_name}'; onboarding "
                    "again does not rename", field="display_name")
            return Response(ProviderSerializer(existing).data, status=200)
        provider = services.provider_onboard(user_id=request.user.pk, display_name=name)
        return Response(ProviderSerializer(provider).data, status=201)

    @extend_schema(responses=ProviderSerializer)
    def get(self, request):
        provider = Provider.objects.filter(user=request.user).first()
        if provider is None:
            return Response({"detail": "you are not a provider yet: POST display_name here"},
                            status=404)
        return Response(ProviderSerializer(provider).data)


class NodeCreateIn(StrictInputSerializer):
    name = StrictCharField(max_length=100)


class NodeCreatedSerializer(NodeSerializer):
    runner_token = serializers.CharField(help_text="the node's runner token: shown once, "
                                         "only its hash is stored")

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "runner_token"]


class NodeList(APIView):
    """Your nodes in service (a retired node is left out: GET /api/v1/nodes/<id>/ still
    shows it); POST creates one and returns its runner token, once."""

    pagination_class = Pagination

    @extend_schema(responses=NodeSerializer(many=True))
    def get(self, request):
        nodes = (Node.objects.filter(provider__user=request.user, retired_at__isnull=True)
                 .order_by("pk")
                 .prefetch_related("gpus__gpu_class", "images"))
        paginator = Pagination()
        page = paginator.paginate_queryset(nodes, request, view=self)
        latest = benchmarks.latest_results(Gpu.objects.filter(node__in=page))
        return paginator.get_paginated_response(
            NodeSerializer(page, many=True, context={"benchmarks": latest}).data)

    @extend_schema(request=NodeCreateIn, responses={201: NodeCreatedSerializer})
    def post(self, request):
        data = NodeCreateIn(data=request.data)
        data.is_valid(raise_exception=True)
        provider = Provider.objects.filter(user=request.user).first()
        if provider is None:
            raise services.ProviderError("become a provider first (POST /api/v1/providers/)",
                                         field="provider")
        created = services.node_create(provider=provider, name=data.validated_data["name"])
        body = NodeSerializer(created.node).data
        body["runner_token"] = created.runner_token
        return Response(body, status=201, headers={"Cache-Control": "no-store"})


class NodePatchIn(StrictInputSerializer):
    name = StrictCharField(max_length=100)


class NodeDetail(APIView):
    """One of your nodes, retired ones too (`retired_at`); PATCH {"name"} renames it: 200
    with the node; a name empty, over 100 characters or taken by another of your nodes is
    a 400 naming `name`; a retired node is a 409. Not your node: 404."""

    def _node(self, request, pk: int) -> Node:
        node = (Node.objects.filter(pk=pk, provider__user=request.user)
                .prefetch_related("gpus__gpu_class").first())
        if node is None:
            raise services.NodeNotFound(f"no node {pk} of yours", field="node")
        return node

    def _answer(self, node: Node) -> Response:
        latest = benchmarks.latest_results(Gpu.objects.filter(node=node))
        return Response(NodeSerializer(node, context={"benchmarks": latest}).data)

    @extend_schema(responses=NodeSerializer)
    def get(self, request, pk: int):
        return self._answer(self._node(request, pk))

    @extend_schema(request=NodePatchIn, responses=NodeSerializer)
    def patch(self, request, pk: int):
        data = NodePatchIn(data=request.data)
        data.is_valid(raise_exception=True)
        services.node_rename(user_id=request.user.pk, node_id=pk,
                             name=data.validated_data["name"])
        return self._answer(self._node(request, pk))


class NodeRotateToken(APIView):
    """Replace the node's runner token: 200 with the node and its new `runner_token`,
    shown once (only its hash is stored). The old token stops working at once: HTTP calls
    with it get 401, the node's open websocket closes with 4401, so the runner is refused
    until it has the new token (`gpumarket-runner register --token …`, then restart
    `gpumarket-runner run`). Your API token or session only (a runner token cannot rotate
    itself); 404 for a node that is not yours. No body."""

    @extend_schema(request=None, responses={200: NodeCreatedSerializer})
    def post(self, request, pk: int):
        rotated = services.node_rotate_token(user_id=request.user.pk, node_id=pk)
        body = NodeSerializer(rotated.node).data
        body["runner_token"] = rotated.runner_token
        return Response(body, status=200, headers={"Cache-Control": "no-store"})


# The runner's bodies take JSON types strictly, as the user API does: an integer is a JSON
# number without a fraction ("10", 10.0 and true are refused), a string a JSON string.
BUS_ID = r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$"


class NvLinkIn(serializers.Serializer):
    """A GPU's NVLink: active links and the bus ids of the node's GPUs it reaches
    (docs/RUNNER_PROTOCOL.md, "Topology"); unknown keys refused, named."""

    links_active = StrictIntegerField(min_value=0, max_value=64)
    peers = serializers.ListField(
        child=serializers.RegexField(BUS_ID, max_length=16, error_messages={
            "invalid": "is not a PCI bus id like 00000000:53:00.0"}),
        max_length=MAX_GPUS_PER_NODE)

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(dict.fromkeys(unknown, "is not a known field"))
        return super().to_internal_value(data)


class RunnerGpuIn(serializers.Serializer):
    uuid = serializers.RegexField(r"^(GPU|MIG)-[0-9a-fA-F-]{8,60}$", max_length=64)
    product_name = StrictCharField(max_length=100)
    gpu_class = StrictCharField(max_length=40)
    memory_mib = StrictIntegerField(min_value=1, max_value=10_000_000)
    pci_bus_id = StrictCharField(max_length=32)
    mig_mode = StrictCharField(max_length=16, required=False, allow_blank=True, default="")
    # a MIG slice (docs/RUNNER_PROTOCOL.md, "MIG slices"); providers/mig.py checks them
    parent_uuid = serializers.RegexField(r"^GPU-[0-9a-fA-F-]{8,60}$", max_length=64,
                                         required=False)
    mig_profile = serializers.RegexField(r"^[0-9]+g\.[0-9]+gb(\+[a-z0-9]+)*$", max_length=32,
                                         required=False)
    sm_count = StrictIntegerField(min_value=1, max_value=1024, required=False, allow_null=True)
    gpu_instance_id = StrictIntegerField(min_value=0, max_value=1024, required=False)
    compute_instance_id = StrictIntegerField(min_value=0, max_value=1024, required=False)
    listed = StrictBooleanField(required=False, default=True)
    nvlink = NvLinkIn(required=False)
    pcie_generation = StrictIntegerField(min_value=1, max_value=9, required=False,
                                         allow_null=True)
    pcie_width = StrictIntegerField(min_value=1, max_value=64, required=False, allow_null=True)


class InventoryIn(serializers.Serializer):
    hostname = StrictCharField(max_length=255, allow_blank=True, default="")
    driver_version = StrictCharField(max_length=32)
    cuda_version = StrictCharField(max_length=32, allow_blank=True, default="")
    runner_version = StrictCharField(max_length=32, allow_blank=True, default="")
    source = StrictCharField(max_length=120, allow_blank=True, default="")
    gpus = RunnerGpuIn(many=True)


class InventoryOut(serializers.Serializer):
    node = NodeSerializer()
    warnings = serializers.ListField(child=serializers.CharField(), help_text=(
        "what was ignored, e.g. an NVLink peer that is no GPU of this node"))


class RunnerView(APIView):
    authentication_classes = [RunnerTokenAuthentication]
    permission_classes = [IsRunner]


class RunnerInventory(RunnerView):
    @extend_schema(request=InventoryIn, responses=InventoryOut)
    def post(self, request):
        data = InventoryIn(data=request.data)
        data.is_valid(raise_exception=True)
        warnings: list[str] = []
        node = services.inventory_record(node=request.auth, warnings=warnings,
                                         **data.validated_data)
        return Response({"node": NodeSerializer(node).data, "warnings": warnings})


# bounds of a GPU reading: past any real GPU's, so a bad value is a 400, never stored
READING_BOUNDS = {"temperature_c": (-100, 250), "power_w": (0, 10_000),
                  "utilization_pct": (0, 100), "ecc_uncorrectable": (0, 10**12)}
RUNTIMES = ("docker", "process")


class HealthIn(serializers.Serializer):
    uuid = StrictCharField(max_length=64)
    temperature_c = StrictIntegerField(required=False, allow_null=True,
                                       min_value=-100, max_value=250)
    power_w = StrictNumberField(required=False, allow_null=True, min_value=0,
                                max_value=10_000)
    utilization_pct = StrictIntegerField(required=False, allow_null=True, min_value=0,
                                         max_value=100)
    ecc_uncorrectable = StrictIntegerField(required=False, allow_null=True, min_value=0,
                                           max_value=10**12)


class FindingIn(serializers.Serializer):
    uuid = StrictCharField(max_length=64)
    rule = StrictCharField(max_length=40)
    severity = serializers.ChoiceField(choices=["warn", "fatal"])
    evidence = StrictCharField(max_length=1000, allow_blank=True, default="")


class HeartbeatIn(serializers.Serializer):
    """Readings (`gpus`: at most one per GPU of the node) and `findings` of this node's
    GPUs. An item naming another node's GPU, or none registered, changes nothing and comes
    back in the answer's `warnings` (services.heartbeat_record)."""

    runtime = serializers.ChoiceField(choices=RUNTIMES, allow_blank=True, default="",
                                      help_text="the runner's runtime; \"\": not told")
    gpus = HealthIn(many=True, required=False, default=list,
                    max_length=services.MAX_GPUS_PER_NODE)
    findings = FindingIn(many=True, required=False, default=list, max_length=512)


class HeartbeatOut(serializers.Serializer):
    server_time = serializers.DateTimeField(help_text="the marketplace's clock (UTC)")
    warnings = serializers.ListField(
        child=serializers.CharField(), required=False,
        help_text="present when items were ignored: each names the item and why")


class RunnerHeartbeat(RunnerView):
    @extend_schema(request=HeartbeatIn, responses=HeartbeatOut)
    def post(self, request):
        data = HeartbeatIn(data=request.data)
        data.is_valid(raise_exception=True)
        warnings = services.heartbeat_record(node=request.auth, **data.validated_data)
        body = {"server_time": timezone.now().isoformat()}
        if warnings:
            body["warnings"] = warnings
        return Response(body)


class _Figure(serializers.DecimalField):
    """A measured figure: a JSON number or decimal string, at most one decimal place
    (the runner rounds), or null. NaN, infinities and booleans are refused; the sign and
    plausibility are checked by providers.benchmarks."""

    def __init__(self, **kwargs):
        super().__init__(max_digits=7, decimal_places=1, required=False, allow_null=True,
                         default=None, **kwargs)

    def to_internal_value(self, data):
        if isinstance(data, bool):
            self.fail("invalid")
        return super().to_internal_value(data)


def _refuse_unknown(serializer, data) -> None:
    if isinstance(data, dict):
        unknown = sorted(set(data) - set(serializer.fields))
        if unknown:
            raise serializers.ValidationError(dict.fromkeys(unknown, "is not a known field"))


MAX_RAW_BYTES = 16 * 1024  # a result's `raw`, in compact UTF-8 JSON
MAX_RAW_DEPTH = 8


class BenchmarkResultIn(serializers.Serializer):
    uuid = serializers.RegexField(r"^(GPU|MIG)-[0-9a-fA-F-]{8,60}$", max_length=64)
    measured_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    correct = StrictBooleanField()
    bf16_tflops = _Figure()
    fp16_tflops = _Figure()
    memory_bandwidth_gbps = _Figure()
    host_to_device_gbps = _Figure()
    device_to_host_gbps = _Figure()
    # what the benchmark timed, free-form (stored as jsonb)
    raw = JsonObjectField(max_bytes=MAX_RAW_BYTES, max_depth=MAX_RAW_DEPTH, required=False,
                          default=dict)

    def to_internal_value(self, data):
        _refuse_unknown(self, data)
        return super().to_internal_value(data)


class BenchmarksIn(serializers.Serializer):
    runner_version = StrictCharField(max_length=32, allow_blank=True, default="")
    backend = serializers.ChoiceField(choices=["torch", "cupy"])
    results = BenchmarkResultIn(many=True, max_length=benchmarks.MAX_RESULTS)

    def to_internal_value(self, data):
        _refuse_unknown(self, data)
        return super().to_internal_value(data)


class BenchmarkStoredOut(serializers.Serializer):
    id = serializers.IntegerField()
    uuid = serializers.CharField()
    measured_at = serializers.DateTimeField()
    correct = serializers.BooleanField()


class BenchmarksOut(serializers.Serializer):
    results = BenchmarkStoredOut(many=True)


class RunnerBenchmarks(RunnerView):
    """The runner reports what it measured on its GPUs (docs/RUNNER_PROTOCOL.md)."""

    @extend_schema(request=BenchmarksIn, responses={201: BenchmarksOut})
    def post(self, request):
        data = BenchmarksIn(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        rows = benchmarks.benchmark_record(node=request.auth, runner_version=v["runner_version"],
                                           backend=v["backend"], results=v["results"])
        return Response({"results": [
            {"id": b.pk, "uuid": b.gpu.uuid, "measured_at": b.measured_at.isoformat(),
             "correct": b.correct} for b in rows]}, status=201)
