"""Request and response shapes of sealed-bid auctions: an auction (the provider's lot)
and a sealed bid (a buyer's, with the container terms a bid has). Prices are USD strings
per GPU-hour (UsdField); durations whole hours in, seconds inside."""

from __future__ import annotations

from django.core.exceptions import ObjectDoesNotExist
from django.utils import timezone
from rest_framework import serializers

from core.fields import StrictCharField, StrictInputSerializer, StrictIntegerField
from marketplace import selectors
from marketplace.api.checkpoint_field import CheckpointOutMixin
from marketplace.api.serializers import (
    COMMAND_HELP,
    FAILOVER_TERMS,
    MAX_HOURS,
    TEMPLATE_TERMS,
    DockerImageField,
    FailoverFields,
    SecretNamesMixin,
    TemplateFields,
    ports_field,
    resolve_duration,
    secret_names_field,
)
from marketplace.models import Auction, Interconnect, SealedBid
from settlement.fields import UsdField


class AuctionInSerializer(StrictInputSerializer):
    node = StrictIntegerField(min_value=1)
    gpu_class = StrictCharField(required=False, max_length=40)
    gpus = StrictIntegerField(min_value=1, max_value=4096)
    reserve_price = UsdField()
    hours = StrictIntegerField(min_value=1, max_value=MAX_HOURS, required=False)
    duration_seconds = StrictIntegerField(min_value=1, max_value=MAX_HOURS * 3600,
                                          required=False)
    rule = serializers.ChoiceField(choices=Auction.Rule.choices, default="second_price")
    opens_at = serializers.DateTimeField(required=False)
    closes_at = serializers.DateTimeField()

    def validate(self, attrs):
        return resolve_duration(super().validate(attrs))


class AuctionSerializer(serializers.ModelSerializer):
    """The public view: bid count and time left before close; anonymous awards after
    close. Never a sealed bid's price or quantity before close, nor a bidder, ever."""

    gpu_class = serializers.SlugRelatedField(source="market", slug_field="slug", read_only=True)
    reserve_price = UsdField()
    clearing_price = UsdField(positive=False, allow_null=True)  # null until it closes
    bid_count = serializers.SerializerMethodField()
    seconds_left = serializers.SerializerMethodField()
    awards = serializers.SerializerMethodField()

    class Meta:
        model = Auction
        fields = ["id", "status", "gpu_class", "node", "gpus", "reserve_price", "rule",
                  "duration_seconds", "opens_at", "closes_at", "bid_count", "seconds_left",
                  "clearing_price", "awards", "closed_at"]

    def get_bid_count(self, auction) -> int:
        return selectors.bid_count(auction)

    def get_seconds_left(self, auction) -> int:
        if auction.status != Auction.Status.OPEN:
            return 0
        return max(0, int((auction.closes_at - timezone.now()).total_seconds()))

    def get_awards(self, auction) -> list[dict]:
        """[{gpus, price}] after close, anonymous (no bid, no bidder; as the feed and the
        pages): a winner sees its own award at /sealed-bids/."""
        if auction.status != Auction.Status.CLOSED:
            return []
        return [
            {"gpus": gpus, "price": UsdField().to_representation(price)}
            for gpus, price in selectors.awards(auction)
            .order_by("-paid_price", "pk").values_list("awarded_gpus", "paid_price")
        ]


class SealedBidInSerializer(FailoverFields, TemplateFields, StrictInputSerializer):
    """A sealed bid: price, gpus, min_gpus; the container as for a bid (image, command,
    ports, and TemplateFields)."""

    price = UsdField()
    gpus = StrictIntegerField(min_value=1, max_value=4096, required=False)
    min_gpus = StrictIntegerField(min_value=1, max_value=4096, required=False)
    image = DockerImageField(required=False, allow_blank=True, default="")
    command = serializers.ListField(child=StrictCharField(max_length=1000), required=False,
                                    allow_null=True, max_length=64, default=None,
                                    help_text=COMMAND_HELP)
    ports = ports_field()
    interconnect = serializers.ChoiceField(choices=Interconnect.choices, default="any")

    def validate(self, attrs):
        return self.resolve_template(super().validate(attrs))


class SealedBidSerializer(SecretNamesMixin, CheckpointOutMixin, serializers.ModelSerializer):
    """A bidder's own view of its sealed bid (its secrets by name only). `lease`: the id of
    the lease it won, null before or without one; `replaced`: in the answer to placing it,
    the id of your earlier bid on this auction that it replaced (withdrawn, its hold
    released); null otherwise."""

    price = UsdField()
    paid_price = UsdField(positive=False)
    secret_names = secret_names_field()
    replaced = serializers.SerializerMethodField()
    lease = serializers.SerializerMethodField()
    checkpoint = serializers.SerializerMethodField()

    def get_replaced(self, obj) -> int | None:
        return getattr(obj, "replaced_bid_id", None)

    def get_lease(self, bid) -> int | None:
        try:
            return bid.lease.pk
        except ObjectDoesNotExist:
            return None

    class Meta:
        model = SealedBid
        fields = ["id", "auction", "status", "price", "gpus", "min_gpus", "awarded_gpus",
                  "paid_price", "lease", "image", "command", "ports", *TEMPLATE_TERMS,
                  "secret_names", "checkpoint", "interconnect", *FAILOVER_TERMS, "created_at",
                  "replaced"]
