"""Market API views: thin — parse with a serializer, call one service, serialize."""

from __future__ import annotations

from django.db.models import BooleanField, ExpressionWrapper, OuterRef, Q, Subquery
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, permissions
from rest_framework.response import Response
from rest_framework.views import APIView

from core.pagination import Pagination, paginated
from marketplace import auctions, book, env_templates, lease_control, selectors
from marketplace.api import auction_serializers as sa
from marketplace.api import market_serializers as sm
from marketplace.api import serializers as s
from marketplace.errors import InvalidInput, NotFound
from marketplace.models import Auction, Fill, GpuClass, Lease, Order, OrderEvent
from providers.models import GpuBenchmark, Node


def own_node(request, node_id: int) -> None:
    """404 "no node N of yours" for a node that does not exist or is another provider's:
    the same answer for both, so ids of other providers' nodes are not revealed."""
    if not Node.objects.filter(pk=node_id, provider__user=request.user).exists():
        raise NotFound(f"no node {node_id} of yours", field="node")


class GpuClassList(generics.ListAPIView):
    """GPU classes: one market each, with datasheet figures and a reference price; whole
    GPUs first (by slug), then the MIG slice markets (by slug)."""

    permission_classes = [permissions.AllowAny]
    pagination_class = Pagination
    serializer_class = sm.GpuClassSerializer
    queryset = (GpuClass.objects.select_related("parent").prefetch_related("slices")
                .alias(is_slice=ExpressionWrapper(Q(parent__isnull=False),
                                                  output_field=BooleanField()))
                .order_by("is_slice", "slug"))

    def get_serializer_context(self):
        # 120-odd classes, few benchmarked: the others skip class_summary's query
        return {**super().get_serializer_context(),
                "benchmarked": set(GpuBenchmark.objects.values_list("gpu__gpu_class_id",
                                                                    flat=True).distinct())}


class GpuClassDetail(generics.RetrieveAPIView):
    """One GPU class: datasheet figures with their source, reference price, the measured
    benchmark (median of its healthy GPUs' latest passed results, or null), and its
    standing asks with each node's GPUs and interconnect (`offers`)."""

    permission_classes = [permissions.AllowAny]
    serializer_class = sm.GpuClassDetailSerializer
    queryset = GpuClass.objects.select_related("parent").prefetch_related("slices")
    lookup_field = "slug"


class OrderBookDepth(APIView):
    """Order book depth of one GPU class: GPUs per price level (never who placed them)."""

    permission_classes = [permissions.AllowAny]

    @extend_schema(responses=sm.DepthSerializer)
    def get(self, request, slug: str):
        market = get_object_or_404(GpuClass, slug=slug)
        bids, asks = book.depth(market)
        crossed = bids and asks and bids[0][0] >= asks[0][0]
        data = {"gpu_class": slug,
                "bids": [{"price": p, "gpus": q} for p, q in bids],
                "asks": [{"price": p, "gpus": q} for p, q in asks],
                "note": selectors.crossed_note(market.pk, asks[0][0]) if crossed else ""}
        return Response(sm.DepthSerializer(data).data)


class TemplateList(APIView):
    """The environment templates a bid may name (`template`), from
    marketplace/templates.json: {"results": [{id, title, image, command, ports
    [{port, role}], env, min_cuda, needs_shell_user, cuda_source}]}."""

    permission_classes = [permissions.AllowAny]

    @extend_schema(responses=sm.TemplateListSerializer)
    def get(self, request):
        return Response({"results": [t.as_api() for t in env_templates.templates().values()]})


class RecentFills(generics.ListAPIView):
    """Recent trades of all markets (anonymous)."""

    permission_classes = [permissions.AllowAny]
    pagination_class = Pagination
    serializer_class = s.FillSerializer
    queryset = Fill.objects.select_related("market").order_by("-pk")


class OrderListCreate(APIView):
    """Your orders, newest first; `?status=open,partially_filled` and `?side=bid` filter
    them. POST places a bid or an ask: 201, or 200 with the first order when its
    client_order_id was used before."""

    pagination_class = Pagination
    query_filters = ("status", "side")

    @extend_schema(
        parameters=[
            OpenApiParameter("status", str, description="comma-separated: "
                             + ", ".join(Order.Status.values)),
            OpenApiParameter("side", str, enum=Order.Side.values),
        ],
        responses=s.OrderSerializer(many=True),
    )
    def get(self, request):
        orders = _with_last_cause(Order.objects.filter(owner=request.user)
                                  .select_related("market").order_by("-pk"))
        if "status" in request.query_params:
            wanted = [x for x in request.query_params["status"].split(",") if x]
            unknown = [x for x in wanted if x not in Order.Status.values]
            if unknown or not wanted:
                raise InvalidInput(f"must be one or more of {', '.join(Order.Status.values)}",
                                   field="status")
            orders = orders.filter(status__in=wanted)
        if "side" in request.query_params:
            if request.query_params["side"] not in Order.Side.values:
                raise InvalidInput("must be bid or ask", field="side")
            orders = orders.filter(side=request.query_params["side"])
        return paginated(self, request, orders, s.OrderSerializer)

    @extend_schema(request=s.OrderInSerializer,
                   responses={201: s.OrderPlacedSerializer, 200: s.OrderPlacedSerializer})
    def post(self, request):
        data = s.OrderInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        if v["side"] == Order.Side.BID:
            placed = book.place_bid(data.bid_request(request.user.pk))
        else:
            own_node(request, v["node"])
            placed = book.place_ask(
                provider_id=request.user.pk, node_id=v["node"],
                market_slug=v.get("gpu_class"), price=v["price"], gpus=v["gpus"],
                available_until=v["available_until"],
                client_order_id=v.get("client_order_id"),
            )
        status, body = s.placed_answer(placed)
        return Response(body, status=status)


def _with_last_cause(orders):
    """`orders` with `last_cause`: the cause of each one's last event (OrderSerializer's
    `cause`), in the same query."""
    last = (OrderEvent.objects.filter(order=OuterRef("pk")).order_by("-at", "-pk")
            .values("cause")[:1])
    return orders.annotate(last_cause=Subquery(last))


class OrderDetail(generics.RetrieveAPIView):
    """One of your orders; anyone else's is "no order N of yours", 404, as a missing one
    (the words of cancel)."""

    serializer_class = s.OrderSerializer

    def get_queryset(self):
        return _with_last_cause(Order.objects.filter(owner=self.request.user))

    def get_object(self):
        order = self.get_queryset().filter(pk=self.kwargs["pk"]).first()
        if order is None:
            raise NotFound(f"no order {self.kwargs['pk']} of yours")
        return order


class OrderCancel(APIView):
    @extend_schema(request=None, responses=s.OrderSerializer)
    def post(self, request, pk: int):
        order = book.cancel_order(user_id=request.user.pk, order_id=pk)
        return Response(s.OrderSerializer(order).data)


class AuctionListCreate(APIView):
    """Open and recent auctions (public view); POST opens one of your node's GPUs."""

    pagination_class = Pagination

    def get_permissions(self):
        if self.request.method == "GET":
            return [permissions.AllowAny()]
        return super().get_permissions()

    @extend_schema(responses=sa.AuctionSerializer(many=True))
    def get(self, request):
        qs = Auction.objects.select_related("market").order_by("-pk")
        return paginated(self, request, qs, sa.AuctionSerializer)

    @extend_schema(request=sa.AuctionInSerializer, responses={201: sa.AuctionSerializer})
    def post(self, request):
        data = sa.AuctionInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        own_node(request, v["node"])
        auction = auctions.open_auction(
            provider_id=request.user.pk, node_id=v["node"], gpus=v["gpus"],
            reserve_price=v["reserve_price"], duration_seconds=v["duration_seconds"],
            closes_at=v["closes_at"], opens_at=v.get("opens_at"), rule=v["rule"],
            market_slug=v.get("gpu_class"),
        )
        return Response(sa.AuctionSerializer(auction).data, status=201)


class AuctionDetail(generics.RetrieveAPIView):
    permission_classes = [permissions.AllowAny]
    serializer_class = sa.AuctionSerializer
    queryset = Auction.objects.all()


class SealedBidCreate(APIView):
    """Place or replace your sealed bid on an auction (`replaced`: the earlier bid's id)."""

    @extend_schema(request=sa.SealedBidInSerializer, responses={201: sa.SealedBidSerializer})
    def post(self, request, pk: int):
        data = sa.SealedBidInSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        bid = auctions.place_sealed_bid(
            bidder_id=request.user.pk, auction_id=pk, price=v["price"], gpus=v.get("gpus"),
            min_gpus=v.get("min_gpus"), image=v["image"], command=v["command"],
            ports=v["ports"], secrets=v["secrets"], interconnect=v["interconnect"],
            checkpoint=v["checkpoint"],
            failover=v.get("failover") is not False, min_reliability=v.get("min_reliability"),
            **{name: v[name] for name in s.TEMPLATE_TERMS},
        )
        return Response(sa.SealedBidSerializer(bid).data, status=201)


class MySealedBids(generics.ListAPIView):
    """Your own sealed bids (nobody else's, ever)."""

    pagination_class = Pagination
    serializer_class = sa.SealedBidSerializer

    def get_queryset(self):
        return selectors.own_bids(self.request.user.pk).select_related("lease").order_by("-pk")


class SealedBidWithdraw(APIView):
    @extend_schema(request=None, responses=sa.SealedBidSerializer)
    def post(self, request, pk: int):
        bid = auctions.withdraw_sealed_bid(bidder_id=request.user.pk, bid_id=pk)
        return Response(sa.SealedBidSerializer(bid).data)


def _my_leases(user):
    return (selectors.user_leases(user.pk)
            .select_related("market").prefetch_related("events", "lease_gpus__gpu")
            .order_by("-pk"))


class LeaseList(generics.ListAPIView):
    """Leases where you are the buyer or the provider; `?status=running,pending` filters
    (anything but lease states is a 400 naming `status`)."""

    pagination_class = Pagination
    serializer_class = s.LeaseSerializer
    query_filters = ("status",)

    @extend_schema(parameters=[OpenApiParameter(
        "status", str, description="comma-separated: " + ", ".join(Lease.Status.values))])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        leases = _my_leases(self.request.user)
        if "status" in self.request.query_params:
            wanted = [x for x in self.request.query_params["status"].split(",") if x]
            if not wanted or any(x not in Lease.Status.values for x in wanted):
                raise InvalidInput(f"must be one or more of {', '.join(Lease.Status.values)}",
                                   field="status")
            leases = leases.filter(status__in=wanted)
        return leases


class LeaseDetail(generics.RetrieveAPIView):
    """One of your leases (as buyer or provider); anyone else's is "no lease N of yours",
    404, as a missing one (the same words as stop, extend and logs)."""

    serializer_class = s.LeaseSerializer

    def get_queryset(self):
        return _my_leases(self.request.user)

    def get_object(self):
        lease = self.get_queryset().filter(pk=self.kwargs["pk"]).first()
        if lease is None:
            raise NotFound(f"no lease {self.kwargs['pk']} of yours")
        return lease


class LeaseStop(APIView):
    """Stop your lease now (pending, starting or running): it ends `cancelled`, "stopped
    by the buyer", and you pay the seconds it ran. Idempotent: an ended lease is answered
    200 as it is. Another buyer's lease is a 404, as a missing one."""

    @extend_schema(request=None, responses=s.LeaseSerializer)
    def post(self, request, pk: int):
        lease = lease_control.stop_lease(buyer_id=request.user.pk, lease_id=pk)
        return Response(s.LeaseSerializer(_my_leases(request.user).get(pk=lease.pk),
                                          context={"request": request}).data)


class LeaseExtend(APIView):
    """Extend your lease by `hours` or `seconds` at its price, on a new hold of the extra
    cost; 409 naming why when the window, the node or your wallet does not allow it.
    An `Idempotency-Key` header (or `request_id` field) makes a retry answer the lease
    without extending it again."""

    @extend_schema(request=s.LeaseExtendInSerializer, responses=s.LeaseSerializer,
                   parameters=[OpenApiParameter(
                       "Idempotency-Key", str, OpenApiParameter.HEADER, required=False,
                       description="1-64 of A-Z a-z 0-9 . _ : -; the same as request_id")])
    def post(self, request, pk: int):
        data = s.LeaseExtendInSerializer(data=request.data,
                                         context={"header_key": request.headers.get(
                                             "Idempotency-Key")})
        data.is_valid(raise_exception=True)
        v = data.validated_data
        lease = lease_control.extend_lease(buyer_id=request.user.pk, lease_id=pk,
                                           seconds=v["seconds"], field=v["field"],
                                           request_id=v["request_id"])
        return Response(s.LeaseSerializer(_my_leases(request.user).get(pk=lease.pk)).data)
