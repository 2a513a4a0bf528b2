"""Public market reads beyond the book: the offers (one row per standing ask,
marketplace/offers.py) and the price history (OHLC buckets from the fills,
marketplace/price_history.py). Bad query parameters: 400 naming the parameter."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import permissions, serializers
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from core.image_ref import image_reference_problem
from marketplace import offers, price_history
from marketplace.errors import InvalidInput
from marketplace.models import GpuClass
from providers import node_images
from settlement.fields import UsdField


class NodeRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


def _decimal_text(value) -> str | None:
    return None if value is None else f"{value.normalize():f}"


class MaintenanceSerializer(serializers.Serializer):
    """A window the node's provider announced (its asks sell no time in it)."""

    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()


class OfferRowSerializer(serializers.Serializer):
    """One standing ask: `ask` (order id), `node` {id, name} (a bid's `node` to fill only
    there), `provider` (display name), `price` (USD per GPU-hour), `gpus_free`,
    `available_until`, `driver_version`, `cuda_version`, `interconnect` ("NVLink full
    mesh", "PCIe only", "" for a lone GPU), `summary` ("8 × H100 SXM 80GB, NVLink full
    mesh"), `node_gpus`, `measured_tflops` (BF16 dense,
    the node's median of its healthy GPUs' latest passed benchmarks; null: not
    benchmarked), `datasheet_tflops`, `reliability` (the node's 30-day record, "0.975";
    null: none yet, docs/FAULTS.md)."""

    ask = serializers.IntegerField()
    node = NodeRefSerializer()
    provider = serializers.CharField()
    price = UsdField()
    gpus_free = serializers.IntegerField()
    available_until = serializers.DateTimeField()
    driver_version = serializers.CharField()
    cuda_version = serializers.CharField()
    interconnect = serializers.CharField()
    summary = serializers.CharField()
    node_gpus = serializers.IntegerField()
    measured_tflops = serializers.SerializerMethodField()
    datasheet_tflops = serializers.SerializerMethodField()
    reliability = serializers.SerializerMethodField()
    maintenance = MaintenanceSerializer(many=True)
    image_cached = serializers.BooleanField(
        required=False, help_text="with ?image=: whether the node's runner holds it")

    def get_measured_tflops(self, row) -> str | None:
        return _decimal_text(row["measured_tflops"])

    def get_datasheet_tflops(self, row) -> str | None:
        return _decimal_text(row["datasheet_tflops"])

    def get_reliability(self, row) -> str | None:
        value = row["reliability"]
        return None if value is None else str(value)


class OffersSerializer(serializers.Serializer):
    gpu_class = serializers.CharField()
    sort = serializers.CharField()
    results = OfferRowSerializer(many=True)
    image_note = serializers.CharField(
        required=False, help_text='with ?image=: "image cached on 3 of 5 nodes" (the nodes '
                                  "of the rows; docs/IMAGES.md)")


class BucketSerializer(serializers.Serializer):
    """One bucket [start, start + bucket_seconds): OHLC trade prices (USD per GPU-hour;
    null when no trade), `trades`, `gpus` traded, `gpu_seconds` (exact) and
    `gpu_hours` (decimal string, rounded down to 6 places)."""

    start = serializers.DateTimeField()
    open = UsdField(allow_null=True)
    high = UsdField(allow_null=True)
    low = UsdField(allow_null=True)
    close = UsdField(allow_null=True)
    trades = serializers.IntegerField()
    gpus = serializers.IntegerField()
    gpu_seconds = serializers.IntegerField()
    gpu_hours = serializers.SerializerMethodField()

    def get_gpu_hours(self, bucket) -> str:
        return price_history.gpu_hours(bucket["gpu_seconds"])


class HistorySerializer(serializers.Serializer):
    gpu_class = serializers.CharField()
    range = serializers.CharField()
    bucket_seconds = serializers.IntegerField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    buckets = BucketSerializer(many=True)


class MarketOffers(APIView):
    """The standing asks behind one market's book, one row per ask, cheapest first
    unless `sort` says otherwise; filters: `min_gpus`, `max_price` (USD per GPU-hour),
    `min_cuda` ("12.4"), `min_tflops` (measured BF16), `provider` (display name, any
    case). Anything else, or a bad value, is a 400 naming the parameter."""

    permission_classes = [permissions.AllowAny]

    @extend_schema(responses=OffersSerializer, parameters=[
        OpenApiParameter("min_gpus", int, description="at least this many GPUs free"),
        OpenApiParameter("max_price", str, description='USD per GPU-hour, e.g. "2.50"'),
        OpenApiParameter("min_cuda", str, description='node CUDA at least, e.g. "12.4"'),
        OpenApiParameter("min_tflops", str, description="measured BF16 TFLOPS at least"),
        OpenApiParameter("provider", str, description="provider display name"),
        OpenApiParameter("sort", str, enum=[*offers.SORTS, *(f"-{k}" for k in offers.SORTS)],
                         description="default price; a leading - sorts high first"),
        OpenApiParameter("image", str, description="an image: each row says whether its "
                         "node holds it (image_cached), the answer how many do (image_note)"),
    ])
    def get(self, request, slug: str):
        market = _market(slug)
        query = _once(request)
        image = query.pop("image", None)
        if image is not None:
            problem = image_reference_problem(image)
            if problem:
                raise InvalidInput(problem, field="image")
        filters, rows = offers.offers(market, query)
        body = {"gpu_class": slug, "sort": filters.sort, "results": rows}
        if image is not None:
            nodes = {row["node"]["id"] for row in rows}
            holding = node_images.nodes_holding(image, nodes)
            for row in rows:
                row["image_cached"] = row["node"]["id"] in holding
            body["image_note"] = node_images.cached_note(len(holding), len(nodes))
        return Response(OffersSerializer(body).data)


def _market(slug: str) -> GpuClass:
    market = GpuClass.objects.filter(slug=slug).first()
    if market is None:
        raise NotFound(f"no GPU class {slug}")
    return market


def _once(request) -> dict[str, str]:
    """The query parameters, each given once: a repeated one is a 400 naming it."""
    for name in request.query_params:
        if len(request.query_params.getlist(name)) > 1:
            raise InvalidInput("is given more than once", field=name)
    return request.query_params.dict()


class MarketHistory(APIView):
    """Trades over time of one market, from its fills: `range` 1h (1-minute buckets),
    24h (15 minutes, the default) or 7d (2 hours); buckets aligned in UTC, the last one
    holding now; empty buckets included with null prices."""

    permission_classes = [permissions.AllowAny]

    @extend_schema(responses=HistorySerializer, parameters=[
        OpenApiParameter("range", str, enum=list(price_history.RANGES),
                         description="default 24h"),
    ])
    def get(self, request, slug: str):
        market = _market(slug)
        rng = price_history.parse_range(_once(request))
        return Response(HistorySerializer({"gpu_class": slug,
                                           **price_history.history(market, rng)}).data)
