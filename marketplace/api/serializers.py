"""Request and response shapes of the market API. Prices are USD strings per
GPU-hour (UsdField); durations are whole hours in, seconds inside."""

from __future__ import annotations

import threading
from decimal import Decimal

from django.conf import settings
from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.fields import (
    StrictBooleanField,
    StrictCharField,
    StrictInputSerializer,
    StrictIntegerField,
)
from core.image_ref import IMAGE_NAME_MAX, IMAGE_REFERENCE
from marketplace import checkpoint_reports, env_templates, selectors, telemetry
from marketplace.api.checkpoint_field import CheckpointField, CheckpointOutMixin
from marketplace.api.stop_terms import STOP_TERMS, StopTermsFields
from marketplace.book import CLIENT_ORDER_ID, NVLINK_GANG_OF_ONE, BidRequest, Placed
from marketplace.chains import chain_body
from marketplace.checkpoint_reports import SCHEMA as CHECKPOINTS_SCHEMA
from marketplace.connect import connect_info
from marketplace.errors import InvalidInput
from marketplace.lease_notice import runner_notice
from marketplace.models import Fill, Interconnect, Lease, Order
from marketplace.ports import endpoint_text
from marketplace.sealing import sealed_names
from marketplace.workload_env import clean_env_and_secrets, clean_vars
from providers.runner.registry_host import private_registry_problem
from settlement.fields import UsdField

MAX_HOURS = 366 * 24


def resolve_duration(attrs: dict) -> dict:
    """Exactly one of `hours` (whole hours) or `duration_seconds` (per-second billing);
    sets attrs["duration_seconds"]."""
    hours, seconds = attrs.pop("hours", None), attrs.get("duration_seconds")
    if (hours is None) == (seconds is None):
        raise serializers.ValidationError({"hours": "give either hours or duration_seconds"})
    attrs["duration_seconds"] = seconds if seconds is not None else hours * 3600
    return attrs


class ClientOrderIdField(serializers.RegexField):
    """A client order id: a JSON string of 1–64 of A–Z a–z 0–9 . _ : - (a number is
    refused, not turned into a string)."""

    def __init__(self, **kwargs):
        super().__init__(CLIENT_ORDER_ID, max_length=64, error_messages={
            "invalid": "must be 1 to 64 characters of A–Z, a–z, 0–9, '.', '_', ':' or '-'",
        }, **kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)




class DockerImageField(serializers.CharField):
    """A container image reference as Docker parses it — `name[:tag][@digest]`, e.g.
    "gpumarket/busybox:local", "registry.example:5000/team/app:1.2" or
    "pytorch/pytorch@sha256:<64 hex>" — by the grammar of distribution/reference (v0.5.0;
    above): lowercase repository path components, an optional registry host[:port], a tag
    of at most 128 word characters, dots and dashes, a digest of at least 32 hex digits; the
    name at most 255 characters — and here the whole reference too (the column's size). A
    JSON string only; "" means no image given. A registry that is `localhost` or a
    private, loopback, link-local, unspecified or multicast IP literal is refused unless
    settings.GPUMARKET_IMAGE_ALLOW_PRIVATE_REGISTRY (providers/runner/registry_host.py;
    host names are not resolved)."""

    default_error_messages = {
        "not_a_string": "must be a string",
        "reference": "must be a Docker image reference, name[:tag][@digest], such as "
                     "\"gpumarket/busybox:local\" (lowercase repository names)",
        "name_length": f"has a repository name longer than {IMAGE_NAME_MAX} characters",
        "private_registry": "must not name a registry at a private or loopback address "
                            "({reason}): providers' nodes would pull from their own networks",
    }

    def __init__(self, **kwargs):
        kwargs.setdefault("max_length", IMAGE_NAME_MAX)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_a_string")
        value = super().to_internal_value(data)
        if value == "":
            return value
        match = IMAGE_REFERENCE.fullmatch(value)
        if match is None:
            self.fail("reference")
        if len(match.group("name")) > IMAGE_NAME_MAX:
            self.fail("name_length")
        if not settings.GPUMARKET_IMAGE_ALLOW_PRIVATE_REGISTRY:
            private = private_registry_problem(value)
            if private:
                self.fail("private_registry", reason=private)
        return value


def ports_field() -> serializers.ListField:
    """Container TCP ports a bid's leases expose to the buyer: a list of at most 8 distinct
    integers 1–65535 (e.g. [8888]); the runner publishes each on the provider's public
    host and the lease then lists where to connect (`endpoints`)."""
    return serializers.ListField(
        child=StrictIntegerField(min_value=1, max_value=65535, error_messages={
            "invalid": "is not a TCP port (a whole number from 1 to 65535)"}),
        required=False, max_length=8, default=list)


# OpenAPI 3.0 has no propertyNames: the names' rule is in the description
@extend_schema_field({"type": "object", "maxProperties": 32,
                      "description": "names match ^[A-Z_][A-Z0-9_]*$ (at most 128 "
                                     "characters); values at most 4 KiB, 32 KiB in all",
                      "additionalProperties": {"type": "string", "maxLength": 4096}})
class WorkloadVarsField(serializers.Field):
    """`env` or `secrets` of a bid: {NAME: "value"} (marketplace/workload_env.py: names
    `[A-Z_][A-Z0-9_]*`, at most 32, values ≤ 4 KiB, ≤ 32 KiB in all, no GPUMARKET_ or
    NVIDIA_ names). A refusal names `env.NAME` and never repeats a value. `secrets` is
    write-only: answers carry `secret_names`."""

    def __init__(self, **kwargs):
        kwargs.setdefault("required", False)
        kwargs.setdefault("default", dict)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        try:
            return clean_vars(data, field=self.field_name)
        except InvalidInput as exc:
            inner = exc.field.removeprefix(f"{self.field_name}").removeprefix(".")
            raise serializers.ValidationError({inner: [exc.message]} if inner
                                              else [exc.message]) from None

    def to_representation(self, value):
        return value


def check_env_and_secrets(attrs: dict) -> None:
    """No name in both env and secrets (a 400 naming `secrets.NAME`)."""
    try:
        clean_env_and_secrets(attrs.get("env"), attrs.get("secrets"))
    except InvalidInput as exc:
        name = exc.field.removeprefix("secrets.")
        raise serializers.ValidationError({"secrets": {name: [exc.message]}}) from None


class TemplateFields(StopTermsFields):
    """A bid's workload terms (bids and sealed bids): `template` (an id of GET
    /api/v1/templates/; "" or absent: own image), `min_cuda` ("12.4"), `ssh` (its leases
    get your SSH keys, /api/v1/ssh-keys/, and port 22 published, role ssh; absent: the
    template's), `env` and write-only `secrets` (WorkloadVarsField); the stop terms
    (stop_terms.py). `resolve_template`
    resolves them with image, command and ports (env_templates.resolve: what was given
    overrides the template)."""

    template = StrictCharField(required=False, allow_blank=True, max_length=64)
    min_cuda = StrictCharField(required=False, allow_blank=True, max_length=16)
    ssh = StrictBooleanField(required=False)
    env = WorkloadVarsField()
    secrets = WorkloadVarsField(write_only=True)
    checkpoint = CheckpointField()  # issue 15: write-only credentials, probed at bid time

    def resolve_template(self, attrs: dict) -> dict:
        """attrs with image, command, ports, template, min_cuda, port_roles, ssh, env as
        they will be stored; a refusal is a 400 naming its field."""
        given = self.initial_data
        try:
            terms = env_templates.resolve(
                template=attrs.get("template", ""),
                image=attrs.get("image") if "image" in given else None,
                command=attrs.get("command") if "command" in given else None,
                ports=attrs.get("ports") if "ports" in given else None,
                env=attrs.get("env"), min_cuda=attrs.get("min_cuda"), ssh=attrs.get("ssh"))
        except InvalidInput as exc:
            raise serializers.ValidationError({exc.field: exc.message}) from None
        attrs = {**attrs, **terms}
        check_env_and_secrets(attrs)
        return attrs


class FailoverFields(serializers.Serializer):
    """A bid's failover terms (issue 15, docs/FAULTS.md): `failover` (a lease failed by a
    provider-side cause continues on another node; absent: true unless interruptible),
    `min_reliability` (decimal string "0.95", 0–1: only nodes at least this reliable over
    30 days, marketplace/reliability.py; absent or null: any)."""

    failover = StrictBooleanField(required=False, allow_null=True, default=None)
    min_reliability = serializers.DecimalField(
        max_digits=4, decimal_places=3, min_value=Decimal("0"), max_value=Decimal("1"),
        required=False, allow_null=True, default=None)


FAILOVER_TERMS = ("failover", "min_reliability")
TEMPLATE_TERMS = ("template", "min_cuda", "port_roles", "ssh", "env", *STOP_TERMS)
COMMAND_HELP = ("argv of the workload; omitted or null: the template's, else the image's own "
                "command, which only a node with Docker runs: a node whose runner uses "
                "--runtime process needs a command (docs/MATCHING.md, \"Runtimes\")")
BID_ONLY = ("hours", "duration_seconds", "gang_size", "time_in_force", "image", "command",
            "ports", "expires_at", "interruptible", "template", "min_cuda", "ssh", "env",
            "secrets", "interconnect", "checkpoint", "prefer_cached_image", *FAILOVER_TERMS,
            *STOP_TERMS)
ASK_ONLY = ("node", "available_until")  # (a bid may name a node: it fills only there)


class OrderInSerializer(FailoverFields, TemplateFields, StrictInputSerializer):
    """A bid (gpu_class, gpus, hours or duration_seconds, price, gang_size, time_in_force,
    expires_at, image, command, ports, interruptible: its leases may be preempted by a
    higher bid after a notice; template, min_cuda, ssh, env, secrets: TemplateFields;
    interconnect: "nvlink" for gangs all NVLink-connected; node: fill only on that node,
    a node id of the offers; prefer_cached_image: among asks at the same price, nodes
    holding the image first, docs/IMAGES.md) or
    an ask (node, gpus, price, available_until, optional gpu_class); either with an
    optional client_order_id (yours, unique per user: placing it again returns the first
    order with 200). A field of the other side is refused, named (BID_ONLY, ASK_ONLY),
    whatever its value: it would do nothing."""

    side = serializers.ChoiceField(choices=Order.Side.choices)
    gpu_class = StrictCharField(required=False, max_length=40)
    price = UsdField()
    gpus = StrictIntegerField(min_value=1, max_value=4096)
    hours = StrictIntegerField(min_value=1, max_value=MAX_HOURS, required=False)
    duration_seconds = StrictIntegerField(min_value=1, max_value=MAX_HOURS * 3600,
                                          required=False)
    gang_size = StrictIntegerField(min_value=1, max_value=4096, required=False)
    time_in_force = serializers.ChoiceField(choices=Order.TimeInForce.choices, default="GTC")
    image = DockerImageField(required=False, allow_blank=True, default="")
    command = serializers.ListField(child=StrictCharField(max_length=1000), required=False,
                                    allow_null=True, max_length=64, default=None,
                                    help_text=COMMAND_HELP)
    node = StrictIntegerField(min_value=1, required=False)
    available_until = serializers.DateTimeField(required=False)
    expires_at = serializers.DateTimeField(required=False)
    client_order_id = ClientOrderIdField(required=False)
    interruptible = StrictBooleanField(required=False, default=False)
    ports = ports_field()
    interconnect = serializers.ChoiceField(choices=Interconnect.choices, default="any")
    prefer_cached_image = StrictBooleanField(
        required=False, default=False,
        help_text="among asks at the same best price, fill first on nodes whose runner "
                  "holds the image (never at a worse price; docs/IMAGES.md)")

    def validate(self, attrs):
        attrs = super().validate(attrs)
        # expires_at in the past is refused by the service (after a client_order_id
        # replay, which must answer with the first order whatever the clock says)
        given = self.initial_data
        if attrs["side"] == Order.Side.BID:
            for name in ASK_ONLY:
                if name in given and name != "node":
                    raise serializers.ValidationError({name: "is for asks, not bids"})
            if "gpu_class" not in attrs:
                raise serializers.ValidationError({"gpu_class": "is required for a bid"})
            resolve_duration(attrs)
            gang = attrs.get("gang_size", attrs["gpus"])
            if attrs["gpus"] % gang:
                raise serializers.ValidationError({"gang_size": "must divide gpus"})
            if attrs["interconnect"] == Interconnect.NVLINK and gang == 1:
                raise serializers.ValidationError({"interconnect": NVLINK_GANG_OF_ONE})
            attrs = self.resolve_template(attrs)
        else:
            for name in BID_ONLY:
                if name in given:
                    says = ("is for bids; an ask ends at available_until"
                            if name == "expires_at" else "is for bids, not asks")
                    raise serializers.ValidationError({name: says})
            for name in ASK_ONLY:
                if name not in attrs:
                    raise serializers.ValidationError({name: "is required for an ask"})
            if attrs["available_until"] <= timezone.now():
                raise serializers.ValidationError({"available_until": "must be in the future"})
        return attrs

    def bid_request(self, buyer_id: int) -> BidRequest:
        """The validated bid (side bid; after is_valid) as book.place_bids takes it:
        price in micro-USD per GPU-hour, duration in seconds. Both ways in use it (the
        DRF view and the bid batcher's fast path)."""
        v = self.validated_data
        return BidRequest(
            buyer_id=buyer_id, market_slug=v["gpu_class"], price=v["price"], gpus=v["gpus"],
            duration_seconds=v["duration_seconds"], gang_size=v.get("gang_size"),
            time_in_force=v["time_in_force"], image=v["image"], command=v["command"],
            expires_at=v.get("expires_at"), client_order_id=v.get("client_order_id"),
            interruptible=v["interruptible"], ports=v["ports"], secrets=v["secrets"],
            interconnect=v["interconnect"], checkpoint=v["checkpoint"],
            failover=v.get("failover"), min_reliability=v.get("min_reliability"),
            node=v.get("node"), prefer_cached_image=v["prefer_cached_image"],
            **{name: v[name] for name in TEMPLATE_TERMS})


def secret_names_field() -> serializers.SerializerMethodField:
    """`secret_names`: the sorted names of the secrets sealed with a bid or lease (never
    their values)."""
    return serializers.SerializerMethodField(method_name="get_secret_names")


class SecretNamesMixin:
    def get_secret_names(self, obj) -> list[str]:
        return sealed_names(obj.secrets_sealed)


class OrderSerializer(SecretNamesMixin, CheckpointOutMixin, serializers.ModelSerializer):
    gpu_class = serializers.SlugRelatedField(source="market", slug_field="slug", read_only=True)
    price = UsdField()
    hours = serializers.SerializerMethodField()
    secret_names = secret_names_field()
    checkpoint = serializers.SerializerMethodField()

    class Meta:
        model = Order
        fields = ["id", "side", "status", "gpu_class", "price", "gpus", "remaining_gpus",
                  "hours", "duration_seconds", "gang_size", "time_in_force", "expires_at",
                  "client_order_id", "interruptible", "ports", "interconnect", "node",
                  "available_until", "created_at", "image", "command", *TEMPLATE_TERMS,
                  *FAILOVER_TERMS, "secret_names", "checkpoint", "match_note", "cause",
                  "prefer_cached_image"]

    match_note = serializers.SerializerMethodField()
    cause = serializers.SerializerMethodField()

    def get_cause(self, order) -> str | None:
        """Why a cancelled or expired order ended ("self-trade prevention against order
        11", "IOC: …", "cancelled by its owner"): its last event's cause; null for any
        other status. A list annotates it (`last_cause`: one query)."""
        if order.status not in ("cancelled", "expired"):
            return None
        if hasattr(order, "last_cause"):
            return order.last_cause
        return (order.events.order_by("-at", "-pk").values_list("cause", flat=True)
                .first())

    def get_match_note(self, order) -> str | None:
        """Why a resting bid with a min_cuda may not fill ("needs CUDA 12.4: 0 of 3 nodes
        with asks qualify"); null for any other order. A list reads each market's
        nodes once (the one child serializer keeps them)."""
        return selectors.cuda_match_note(order, self.__dict__.setdefault("_node_cudas", {}))

    def get_hours(self, order) -> int | None:
        """Whole hours, or null when the bid was given in seconds that are not."""
        d = order.duration_seconds
        return d // 3600 if d and d % 3600 == 0 else None


class OrderPlacedSerializer(OrderSerializer):
    """The answer to placing an order: the order and the leases its fills created."""

    leases = serializers.ListField(child=serializers.IntegerField(), read_only=True,
                                   help_text="ids of the leases created by this order's fills")
    # a plain string in the schema: the same enum in two components would get a hashed name
    status = serializers.CharField(read_only=True, help_text="as Order.status")

    class Meta(OrderSerializer.Meta):
        fields = [*OrderSerializer.Meta.fields, "leases"]


def placed_answer(placed: Placed) -> tuple[int, dict]:
    """(HTTP status, body) of POST /api/v1/orders/ for a placed order: 201, or 200 for a
    client_order_id replay; the body is OrderPlacedSerializer's (the order and its
    leases' ids). The one answer of the DRF view and the bid batcher."""
    # placed.order is current: the service saved every change on this instance (a
    # replayed order was read from the database)
    body = reusing_fields(OrderSerializer, placed.order).data
    body["leases"] = [lease.pk for lease in placed.leases]
    return (201 if placed.created else 200), body


class FillSerializer(serializers.ModelSerializer):
    gpu_class = serializers.SlugRelatedField(source="market", slug_field="slug", read_only=True)
    price = UsdField()

    class Meta:
        model = Fill
        fields = ["id", "gpu_class", "gpus", "price", "created_at"]


class LeaseEventSerializer(serializers.Serializer):
    from_status = serializers.CharField()
    to_status = serializers.CharField()
    at = serializers.DateTimeField()
    cause = serializers.CharField()


class LeaseSerializer(SecretNamesMixin, CheckpointOutMixin, serializers.ModelSerializer):
    """A lease as its buyer or provider sees it; `connect` (how to reach the workload,
    with the Jupyter token) for its buyer only, null for anyone else; `notice`: the
    deadline its workload was told of, {reason, deadline, since} or null
    (docs/LEASE_CONTRACT.md)."""

    gpu_class = serializers.SlugRelatedField(source="market", slug_field="slug", read_only=True)
    secret_names = secret_names_field()
    connect = serializers.SerializerMethodField()
    price = UsdField()
    cost = UsdField(positive=False)
    provider_amount = UsdField(positive=False)
    platform_fee = UsdField(positive=False)
    gpu_uuids = serializers.SerializerMethodField()
    events = LeaseEventSerializer(many=True, read_only=True)
    endpoints = serializers.SerializerMethodField()
    connect = serializers.SerializerMethodField()
    checkpoint = serializers.SerializerMethodField()
    checkpoints = serializers.SerializerMethodField()
    idle = serializers.SerializerMethodField()
    fault_credit = UsdField(positive=False, read_only=True)
    chain = serializers.SerializerMethodField()
    notice = serializers.SerializerMethodField()

    class Meta:
        model = Lease
        fields = ["id", "status", "gpu_class", "node", "gpu_count", "gpu_uuids", "price",
                  "duration_seconds", "image", "command", "ports", "endpoints",
                  *TEMPLATE_TERMS, "secret_names", "connect", "container_id", "started_at",
                  "ends_at", "ended_at", "cause", "progress", "cost", "provider_amount",
                  "platform_fee",
                  "buyer", "provider", "interruptible", "preempt_at", "notice", *FAILOVER_TERMS,
                  "fault", "failure_code", "fault_credit", "failover_state", "chain_id",
                  "continues", "chain", "events", "created_at", "checkpoint", "checkpoints",
                  "idle"]

    @extend_schema_field({"type": "object", "nullable": True, "properties": {
        "reason": {"type": "string"}, "deadline": {"type": "string", "format": "date-time"},
        "since": {"type": "string", "format": "date-time"}}})
    def get_notice(self, lease) -> dict | None:
        return runner_notice(lease)

    @extend_schema_field({"type": "object", "nullable": True, "properties": {
        "id": {"type": "integer"},
        "leases": {"type": "array", "items": {"type": "object"}},
        "story": {"type": "array", "items": {"type": "string"}}}})
    def get_chain(self, lease) -> dict | None:
        """The lease's chain (chains.chain_body), for its buyer only (a provider never
        reads another provider's node names): null for a lease alone that did not fail,
        or for anyone else; else {"id", "leases": [{id, node, status, fault,
        failure_code}], "story": ["lease 41 failed on node A (GPU 3: XID 79, …) at
        12:03:10; continued as lease 42 on node B at 12:03:14"]}."""
        request = self.context.get("request")
        if getattr(getattr(request, "user", None), "pk", None) != lease.buyer_id:
            return None
        return chain_body(lease)

    def get_gpu_uuids(self, lease) -> list[str]:
        return [lg.gpu.uuid for lg in lease.lease_gpus.all()]

    @extend_schema_field(CHECKPOINTS_SCHEMA)
    def get_checkpoints(self, lease) -> list[dict]:
        """The runner's checkpoint reports, oldest first (marketplace/checkpoint_reports.py)."""
        return checkpoint_reports.listed(lease)

    def get_endpoints(self, lease) -> list[dict]:
        """Where the buyer reaches the exposed ports: [{container_port, host, host_port,
        address: "host:port"}] as the runner published them (empty until `running`, or
        when the provider publishes no ports)."""
        return [{**e, "address": endpoint_text(e)} for e in lease.endpoints or []]

    @extend_schema_field({"type": "object", "nullable": True, "properties": {
        "ssh": {"type": "string", "nullable": True},
        "jupyter": {"type": "string", "nullable": True},
        "http": {"type": "array", "items": {"type": "string"}}}})
    def get_idle(self, lease) -> dict | None:
        """For the buyer of a running lease with GPU readings: telemetry.idle_states'
        {"idle", "idle_seconds", "since", "threshold_pct", "paying_usd_per_hour", "text"};
        null otherwise (and for anyone but the buyer)."""
        request = self.context.get("request")
        if getattr(getattr(request, "user", None), "pk", None) != lease.buyer_id:
            return None
        return telemetry.idle_states([lease]).get(lease.pk)

    def get_connect(self, lease) -> dict | None:
        """How the buyer connects (connect.connect_info): {"ssh": "ssh -p N root@host" |
        null, "jupyter": "http://host:port/lab?token=…" | null, "http": [links]}; null for
        anyone but the buyer."""
        request = self.context.get("request")
        user_id = getattr(getattr(request, "user", None), "pk", None)
        if user_id is None or user_id != lease.buyer_id:
            return None
        return connect_info(lease)


class LeaseExtendInSerializer(StrictInputSerializer):
    """POST /api/v1/leases/<id>/extend/: exactly one of `hours` or `seconds` (whole,
    positive, at most a year); `seconds` of the result is the extension in seconds.
    `request_id` (optional, 1-64 of `A-Za-z0-9._:-`), or the `Idempotency-Key` header in
    context["header_key"] (both given: they must agree): "" when neither."""

    hours = StrictIntegerField(min_value=1, max_value=MAX_HOURS, required=False)
    seconds = StrictIntegerField(min_value=1, max_value=MAX_HOURS * 3600, required=False)
    request_id = ClientOrderIdField(required=False)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        attrs["request_id"] = self._request_id(attrs.get("request_id"))
        given = [name for name in ("hours", "seconds") if name in attrs]
        if len(given) != 1:
            name = given[1] if given else "hours"
            raise serializers.ValidationError({name: "give either hours or seconds, not "
                                               + ("both" if given else "neither")})
        attrs["field"] = given[0]
        attrs["seconds"] = attrs["seconds"] if given[0] == "seconds" else attrs["hours"] * 3600
        return attrs

    def _request_id(self, body: str | None) -> str:
        header = self.context.get("header_key")
        if header is not None and not CLIENT_ORDER_ID.fullmatch(header):
            raise serializers.ValidationError({"Idempotency-Key": "must be 1 to 64 characters "
                                               "of A–Z, a–z, 0–9, '.', '_', ':' or '-'"})
        if body is not None and header is not None and body != header:
            raise serializers.ValidationError(
                {"request_id": "differs from the Idempotency-Key header; give one, or the "
                               "same in both"})
        return body or header or ""


_templates = threading.local()


def reusing_fields(serializer_class, *args, **kwargs):
    """`serializer_class(*args, **kwargs)` with the bound fields of one template instance
    per thread and class, instead of a deep copy of every declared field per instance
    (DRF's Serializer.fields, which was a third of this path's CPU). Safe because a
    serializer here is used by one thread from start to end, synchronously, and these
    serializers keep no per-request state in their fields (no context-dependent
    defaults or validators)."""
    serializer = serializer_class(*args, **kwargs)
    cache = _templates.__dict__.setdefault("by_class", {})
    template = cache.get(serializer_class)
    if template is None:
        template = cache[serializer_class] = serializer_class()
    serializer.__dict__["fields"] = template.fields
    return serializer
