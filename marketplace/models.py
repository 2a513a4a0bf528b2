"""The market: GPU classes (one order book each), orders, fills and leases; the
sealed-bid auctions' models live in marketplace/auction_models.py (re-exported here).
Prices are integer micro-USD per GPU-hour; durations whole seconds; times aware UTC."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from marketplace.auction_models import (  # noqa: F401 (re-exported)
    Auction,
    AuctionEvent,
    SealedBid,
    SealedBidAudit,
)
from marketplace.choices import Interconnect
from marketplace.states import StateEvent, StateMachine

#: A whole GPU's slug ("h100-sxm-80gb") or a MIG slice market's ("h100-sxm-80gb.1g.10gb").
GPU_CLASS_SLUG = RegexValidator(r"^[a-z0-9]+(-[a-z0-9]+)*(\.[1-7]g\.[0-9]{1,3}gb)?$",
                                "a GPU class slug: lowercase words joined by '-', and for a "
                                "MIG slice '.<profile>' (e.g. h100-sxm-80gb.1g.10gb)")


class GpuClass(models.Model):
    """A GPU class: one market. Datasheet figures with their source."""

    slug = models.CharField(
        max_length=40, unique=True, validators=[GPU_CLASS_SLUG],
        help_text='"h100-sxm-80gb"; a MIG slice market: "<parent slug>.<profile>"')
    name = models.CharField(max_length=100)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="slices",
        help_text="the whole-GPU class of a MIG slice market; empty: a whole GPU")
    mig_profile = models.CharField(
        max_length=32, blank=True,
        help_text='MIG GPU-instance profile of a slice market, e.g. "1g.10gb"; empty: whole')
    memory_gb = models.PositiveIntegerField(help_text="GB of device memory, datasheet")
    memory_bandwidth_gbps = models.PositiveIntegerField(help_text="GB/s, datasheet")
    bf16_dense_tflops = models.DecimalField(
        max_digits=7, decimal_places=1, null=True, blank=True,
        help_text="dense (no sparsity) BF16 tensor TFLOPS, datasheet; empty: no BF16 "
                  "support or no published figure (datasheet_source says which)")
    datasheet_source = models.CharField(max_length=300)
    reference_price = models.BigIntegerField(
        default=0, help_text="micro-USD per GPU-hour, public reference (data/reference-prices.csv)"
    )
    # The order book's version (docs/MATCHING.md, "The book cache"): bumped by every
    # transaction that takes the market lock. `book_rebuild_version` is the last version
    # written by a lock holder outside book.py's own writers (leases, health, auctions):
    # an in-process book older than that is rebuilt from the database. `book_epoch`
    # tells a re-created row (or a restored database) from the one a cache was built on.
    book_version = models.BigIntegerField(default=0, editable=False)
    book_rebuild_version = models.BigIntegerField(default=0, editable=False)
    book_epoch = models.UUIDField(default=uuid.uuid4, editable=False)
    # the market's bid queue (marketplace/api/bid_queue.py, GPUMARKET_BID_QUEUE=redis):
    # the fencing token of the consumer that last wrote under the lock, the group it
    # placed and the last position of that group committed (a consumer that takes over
    # a dead one's group places only what is not committed; a fenced-off one writes none)
    bid_queue_fence = models.BigIntegerField(default=0, editable=False)
    bid_queue_group = models.CharField(max_length=32, blank=True, default="", editable=False)
    bid_queue_done = models.IntegerField(default=-1, editable=False)

    class Meta:
        ordering = ["slug"]
        verbose_name_plural = "GPU classes"

    def __str__(self) -> str:
        return self.slug


class Order(StateMachine):
    """A bid or an ask in a GPU class's continuous auction."""

    class Side(models.TextChoices):
        BID = "bid"
        ASK = "ask"

    class Status(models.TextChoices):
        OPEN = "open"
        PARTIALLY_FILLED = "partially_filled"
        FILLED = "filled"
        CANCELLED = "cancelled"
        EXPIRED = "expired"

    class TimeInForce(models.TextChoices):
        GTC = "GTC"
        IOC = "IOC"
        FOK = "FOK"

    TRANSITIONS = {
        # open → open: GPUs back on an ask that had been sold out and freed again
        "open": {"open", "partially_filled", "filled", "cancelled", "expired"},
        # an ask all of whose GPUs came back from ended leases is "open" again
        "partially_filled": {"open", "partially_filled", "filled", "cancelled", "expired"},
        # an ask whose GPUs come back from an ended lease stands again; its provider may
        # withdraw it meanwhile (its leases run on; their GPUs then stay off the market)
        "filled": {"open", "partially_filled", "cancelled"},
    }
    ACTIVE = ("open", "partially_filled")

    market = models.ForeignKey(GpuClass, on_delete=models.PROTECT, related_name="orders")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                              related_name="orders")
    side = models.CharField(max_length=3, choices=Side.choices)
    status = models.CharField(max_length=24, choices=Status.choices, default=Status.OPEN)
    price = models.BigIntegerField(help_text="limit, micro-USD per GPU-hour")
    gpus = models.PositiveIntegerField(help_text="GPUs ordered (bid) or offered (ask)")
    remaining_gpus = models.PositiveIntegerField(
        help_text="bid: GPUs still wanted; ask: GPUs of the node still offered")
    # bid only
    duration_seconds = models.PositiveIntegerField(null=True, blank=True)
    gang_size = models.PositiveIntegerField(null=True, blank=True,
                                            help_text="GPUs per node for each gang")
    time_in_force = models.CharField(max_length=3, choices=TimeInForce.choices,
                                     default=TimeInForce.GTC)
    image = models.CharField(max_length=255, blank=True)
    command = models.JSONField(null=True, blank=True)
    hold_id = models.BigIntegerField(null=True, blank=True, help_text="settlement.Hold id")
    expires_at = models.DateTimeField(
        null=True, blank=True, db_index=True,
        help_text="bid: when what is left of it expires (empty: good till cancelled)")
    client_order_id = models.CharField(
        max_length=64, blank=True, default="",
        help_text="the owner's own id for this order, unique per owner (idempotent "
                  "placement); empty: none")
    interruptible = models.BooleanField(
        default=False,
        help_text="bid: its leases may be preempted by a higher bid after a notice period "
                  "(marketplace/book.py, preemption)")
    ports = models.JSONField(
        default=list, blank=True,
        help_text="bid: container ports (TCP, 1–65535, at most 8) its leases expose to the "
                  "buyer; the runner publishes them on the provider's public host")
    # Templates and compatibility (marketplace/env_templates.py; issue 12's contract)
    template = models.CharField(max_length=64, blank=True, default="",
                                help_text="template id; empty: own image")
    min_cuda = models.CharField(max_length=16, blank=True, default="",
                                help_text='lowest node CUDA version, "12.4"; empty: none')
    port_roles = models.JSONField(
        default=dict, blank=True,
        help_text='bid: container port (string key) → role ("ssh", "jupyter", "http"); '
                  "every key is also in ports")
    ssh = models.BooleanField(
        default=False,
        help_text="bid: its leases get the buyer's SSH public keys (port 22, role ssh)")
    env = models.JSONField(default=dict, blank=True,
                           help_text="bid: {NAME: value} for its leases' workloads (plain)")
    notice_signal = models.CharField(
        max_length=8, blank=True, default="",
        help_text='signal its leases\' workloads get with a notice ("SIGUSR1", …; empty: '
                  'none): docs/LEASE_CONTRACT.md')
    stop_grace_seconds = models.PositiveSmallIntegerField(
        default=10, help_text="seconds between SIGTERM and SIGKILL at the stop (0–300)")
    secrets_sealed = models.TextField(
        blank=True, default="",
        help_text="bid: Fernet token of its secrets' JSON (marketplace/sealing.py); never "
                  "shown, only handed to the runner of its leases")
    # Checkpoints (issue 15, marketplace/checkpoints.py, docs/CHECKPOINTS.md)
    checkpoint = models.JSONField(
        default=dict, blank=True,
        help_text="bid: its checkpoint store without credentials: {url, endpoint_url, "
                  "region, path, max_bytes}; {}: none")
    checkpoint_sealed = models.TextField(
        blank=True, default="",
        help_text="bid: Fernet token of the store's credentials (sealing.py); never shown")
    interconnect = models.CharField(
        max_length=8, choices=Interconnect.choices, default=Interconnect.ANY,
        help_text="bid: nvlink — each gang's GPUs all NVLink-connected to each other")
    prefer_cached_image = models.BooleanField(
        default=False,
        help_text="bid: among asks at the same price, nodes holding its image first "
                  "(docs/IMAGES.md); never a worse price")
    # Failover (issue 15, docs/FAULTS.md)
    failover = models.BooleanField(
        default=True,
        help_text="bid: a lease failed by a provider-side cause continues on another node "
                  "(default: true for non-interruptible bids, false for interruptible)")
    min_reliability = models.DecimalField(
        max_digits=4, decimal_places=3, null=True, blank=True,
        help_text="bid: fills only on nodes whose 30-day reliability is at least this "
                  "(0–1, marketplace/reliability.py); empty: any")
    avoid_node_id = models.BigIntegerField(
        null=True, blank=True,
        help_text="bid: never fills on this node (a bid resting for a lease that failed "
                  "there)")
    continues_lease_id = models.BigIntegerField(
        null=True, blank=True,
        help_text="bid: resting for the remaining time of this failed lease (failover); "
                  "its lease joins that lease's chain")
    # ask: its node; bid: the one node it fills on (null: any node); ask only:
    node = models.ForeignKey("providers.Node", null=True, blank=True, on_delete=models.PROTECT,
                             related_name="asks")
    available_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    # the market's book_version of the transaction that last changed this order through
    # marketplace/book.py: another process catches its cached book up by reading the
    # orders changed since its version
    book_version = models.BigIntegerField(default=0, editable=False)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(price__gt=0), name="order_price_positive"),
            models.CheckConstraint(condition=Q(gpus__gt=0), name="order_gpus_positive"),
            models.CheckConstraint(condition=Q(remaining_gpus__lte=models.F("gpus")),
                                   name="order_remaining_within_size"),
            models.UniqueConstraint(fields=["owner", "client_order_id"],
                                    condition=~Q(client_order_id=""),
                                    name="order_client_id_unique_per_owner"),
        ]
        indexes = [models.Index(fields=["market", "side", "status"]),
                   models.Index(fields=["market", "book_version"],
                                name="order_market_book_version"),
                   # the expiry sweep under every bid's lock (book._expire_due): the few
                   # active orders with a deadline, not every resting order
                   models.Index(fields=["market", "expires_at"], name="order_active_expiry",
                                condition=Q(status__in=["open", "partially_filled"],
                                            expires_at__isnull=False)),
                   models.Index(fields=["market", "available_until"],
                                name="order_active_window",
                                condition=Q(status__in=["open", "partially_filled"],
                                            side="ask")),
                   # book.depth: the levels nearest the spread read from the index alone
                   # (docs/MATCHING.md, "Depth")
                   models.Index(fields=["market", "side", "price"], name="order_book_depth",
                                include=["remaining_gpus", "expires_at", "available_until"],
                                condition=Q(status__in=["open", "partially_filled"],
                                            remaining_gpus__gt=0))]

    def __str__(self) -> str:
        return f"{self.side} #{self.pk} {self.market_id} {self.gpus}×{self.price}"


class OrderEvent(StateEvent):
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="events")


class Fill(models.Model):
    """A trade in the continuous auction: a bid's gang(s) on one node, at the resting
    order's price."""

    market = models.ForeignKey(GpuClass, on_delete=models.PROTECT, related_name="fills")
    bid = models.ForeignKey(Order, on_delete=models.PROTECT, related_name="bid_fills")
    ask = models.ForeignKey(Order, on_delete=models.PROTECT, related_name="ask_fills")
    gpus = models.PositiveIntegerField()
    price = models.BigIntegerField(help_text="micro-USD per GPU-hour")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return f"fill #{self.pk} {self.gpus}×{self.price}"


class Lease(StateMachine):
    """GPUs of one node leased to a buyer for a duration, run by the node's runner."""

    class Status(models.TextChoices):
        PENDING = "pending"
        STARTING = "starting"
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"
        PREEMPTED = "preempted"
        CANCELLED = "cancelled"

    TRANSITIONS = {
        # an interruptible lease may be preempted before it ever ran (charged 0 s)
        "pending": {"starting", "running", "failed", "cancelled", "preempted"},
        "starting": {"running", "failed", "cancelled", "preempted"},
        # cancelled: stopped by its buyer (marketplace/lease_control.py), charged the
        # seconds it ran
        "running": {"completed", "failed", "preempted", "cancelled"},
    }
    ACTIVE = ("pending", "starting", "running")
    ENDED = ("completed", "failed", "preempted", "cancelled")

    market = models.ForeignKey(GpuClass, on_delete=models.PROTECT, related_name="leases")
    buyer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                              related_name="leases")
    provider = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT,
                                 related_name="provided_leases")
    node = models.ForeignKey("providers.Node", on_delete=models.PROTECT, related_name="leases")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    price = models.BigIntegerField(help_text="micro-USD per GPU-hour")
    gpu_count = models.PositiveIntegerField()
    duration_seconds = models.PositiveIntegerField()
    image = models.CharField(max_length=255)
    command = models.JSONField(null=True, blank=True)
    fill = models.OneToOneField(Fill, null=True, blank=True, on_delete=models.PROTECT,
                                related_name="lease")
    sealed_bid = models.OneToOneField(SealedBid, null=True, blank=True,
                                      on_delete=models.PROTECT, related_name="lease")
    ask = models.ForeignKey(Order, null=True, blank=True, on_delete=models.PROTECT,
                            related_name="ask_leases")
    hold_id = models.BigIntegerField(help_text="settlement.Hold id securing this lease")
    container_id = models.CharField(max_length=100, blank=True)
    ports = models.JSONField(
        default=list, blank=True,
        help_text="container ports (TCP) the buyer asked to expose, from the bid")
    endpoints = models.JSONField(
        default=list, blank=True,
        help_text="where the buyer reaches them, as the runner reported with `running`: "
                  "[{container_port, host, host_port}]; empty: none published")
    # Templates and compatibility (marketplace/env_templates.py; issue 12's contract)
    template = models.CharField(max_length=64, blank=True, default="",
                                help_text="template id; empty: own image")
    min_cuda = models.CharField(max_length=16, blank=True, default="",
                                help_text='lowest node CUDA version, "12.4"; empty: none')
    port_roles = models.JSONField(default=dict, blank=True, help_text="as Order.port_roles")
    ssh = models.BooleanField(default=False, help_text="as Order.ssh")
    ssh_public_keys = models.JSONField(
        default=list, blank=True,
        help_text="the buyer's SSH public keys (OpenSSH one-line form), copied when the "
                  "lease was created; the runner mounts them read-only as authorized_keys")
    env = models.JSONField(default=dict, blank=True, help_text="from the bid")
    notice_signal = models.CharField(
        max_length=8, blank=True, default="",
        help_text="from the bid")
    stop_grace_seconds = models.PositiveSmallIntegerField(
        default=10, help_text="from the bid")
    secrets_sealed = models.TextField(blank=True, default="", help_text="from the bid")
    checkpoint = models.JSONField(default=dict, blank=True,
                                  help_text="from the bid (as Order.checkpoint)")
    checkpoint_sealed = models.TextField(blank=True, default="", help_text="from the bid")
    jupyter_token_sealed = models.TextField(
        blank=True, default="",
        help_text="Fernet token of the lease's Jupyter token (a 'jupyter' port role): the "
                  "workload's JUPYTER_TOKEN, in the buyer's connect.jupyter link only")
    started_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True, db_index=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    cause = models.CharField(max_length=300, blank=True, help_text="why it ended")
    progress = models.CharField(
        max_length=300, blank=True, default="",
        help_text="the runner's latest word while starting, e.g. an image pull's progress "
                  "(docs/IMAGES.md); each change is also a starting → starting event")
    cost = models.BigIntegerField(null=True, blank=True, help_text="micro-USD charged")
    provider_amount = models.BigIntegerField(null=True, blank=True)
    platform_fee = models.BigIntegerField(null=True, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Preemption (docs/MATCHING.md): copied from the bid; an interruptible lease may be
    # scheduled to end at `preempt_at` for the resting bid `preempted_for`.
    interruptible = models.BooleanField(default=False)
    preempt_at = models.DateTimeField(
        null=True, blank=True, db_index=True,
        help_text="when this interruptible lease is preempted (empty: not scheduled)")
    preempted_for = models.ForeignKey(
        Order, null=True, blank=True, on_delete=models.PROTECT, related_name="preempting",
        help_text="the resting bid this lease's GPUs are freed for")
    # Chains (issue 15, docs/LEASE_CONTRACT.md): a lease failed by a provider-side cause
    # may continue as a new lease on another node; every lease of one chain has the
    # chain_id of its first lease (empty on a lease that is its own chain's first).
    chain_id = models.BigIntegerField(
        null=True, blank=True, db_index=True,
        help_text="id of the first lease of this lease's chain; empty: this lease's own id")
    continues = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="continuation",
        help_text="the failed lease this one continues (at most one continuation each)")
    # Faults and failover (marketplace/faults.py, marketplace/failover.py, docs/FAULTS.md)
    failover = models.BooleanField(default=False, help_text="from the bid")
    min_reliability = models.DecimalField(max_digits=4, decimal_places=3, null=True,
                                          blank=True, help_text="from the bid")
    fault = models.CharField(
        max_length=8, blank=True, default="",
        help_text='a failed lease: "provider" or "buyer" (who caused it), "" unknown')
    failure_code = models.CharField(max_length=32, blank=True, default="",
                                    help_text="a failed lease: its faults.FAULT_TABLE code")
    fault_credit = models.BigIntegerField(
        default=0, help_text="micro-USD the provider paid the buyer for its fault")
    failover_state = models.CharField(
        max_length=12, blank=True, default="",
        help_text='"" none; "pending" (a continuation is being placed); "continued", '
                  '"rested" (the remaining time became a resting bid), "released" (hold '
                  'given back)')
    carry_hold_id = models.BigIntegerField(
        null=True, blank=True,
        help_text="settlement.Hold id carrying this failed lease's unused hold to its "
                  "continuation (or resting bid) while failover_state is pending")

    # The notice (docs/LEASE_CONTRACT.md): a deadline the lease did not have (a preemption,
    # a maintenance window), told to its workload by the runner; empty: none.
    notice_reason = models.CharField(max_length=32, blank=True, default="",
                                     help_text='"preemption" | "maintenance"; empty: none')
    notice_deadline = models.DateTimeField(null=True, blank=True, db_index=True)
    notice_since = models.DateTimeField(null=True, blank=True)

    @property
    def chain(self) -> int:
        """The chain's id: the first lease's id (this lease's own when it starts one)."""
        return self.chain_id or self.pk

    def __str__(self) -> str:
        return f"lease #{self.pk} {self.gpu_count}× on {self.node_id} ({self.status})"


class LeaseEvent(StateEvent):
    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="events")


class LeaseExtension(models.Model):
    """A buyer's extension of a lease (marketplace/lease_control.py): `seconds` more at the
    lease's price, secured by a hold of its own (`hold_id`, placed for `cost` =
    lease_cost(D + seconds) − lease_cost(D), so the lease's holds together are exactly
    its whole cost). Settlement captures across the lease's hold and these, in order."""

    lease = models.ForeignKey(Lease, on_delete=models.PROTECT, related_name="extensions")
    seconds = models.PositiveIntegerField()
    cost = models.BigIntegerField(help_text="micro-USD held for the extra seconds")
    hold_id = models.BigIntegerField(unique=True, help_text="settlement.Hold id")
    request_id = models.CharField(max_length=64, blank=True, default="",
                                  help_text="the buyer's Idempotency-Key, if any")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(
            fields=["lease", "request_id"], condition=~models.Q(request_id=""),
            name="lease_extension_request_id_unique")]

    def __str__(self) -> str:
        return f"lease #{self.lease_id} + {self.seconds} s"


class RematchDue(models.Model):
    """An ask that took GPUs back from a batch of lease ends and has yet to be re-matched
    with the resting bids (marketplace/fills_many.py): written in the transaction that
    returns the GPUs, deleted by the pass that submits the ask again. One older than
    GPUMARKET_REMATCH_REPAIR_SECONDS is a re-match that a worker's death skipped: the
    beat's repair sweep runs it (docs/MATCHING.md)."""

    ask = models.OneToOneField(Order, on_delete=models.CASCADE, primary_key=True,
                               related_name="+")
    market = models.ForeignKey(GpuClass, on_delete=models.CASCADE, related_name="+")
    since = models.DateTimeField()

    def __str__(self) -> str:
        return f"ask {self.ask_id} to re-match since {self.since:%Y-%m-%d %H:%M:%S}"


class LeaseGpu(models.Model):
    """Which GPUs a lease holds. `active` is true until the lease ends; a partial unique
    index makes it impossible for one GPU to be in two active leases at once."""

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="lease_gpus")
    gpu = models.ForeignKey("providers.Gpu", on_delete=models.PROTECT, related_name="lease_gpus")
    active = models.BooleanField(default=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["gpu"], condition=Q(active=True),
                                    name="gpu_in_one_active_lease"),
        ]

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} in lease {self.lease_id}"


class ApiToken(models.Model):
    """A user's API token (`gmu_…`, marketplace/api_tokens.py). Only its SHA-256 is stored
    (as for runner tokens); `prefix` (the first characters) lets its owner tell tokens
    apart. Valid until `expires_at`; deleting the row revokes it at once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, editable=False)
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'API token'})"


class WsTicket(models.Model):
    """A single-use, short-lived websocket ticket (POST /api/v1/ws-tickets/): only its
    SHA-256 is stored; redeemed (deleted) by the first websocket that shows it. Revoking
    the API token that asked for it deletes it too."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="+")
    api_token = models.ForeignKey(ApiToken, null=True, blank=True, on_delete=models.CASCADE,
                                  related_name="+")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    expires_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"websocket ticket of user {self.user_id}"


class SshKey(models.Model):
    """A buyer's SSH public key (marketplace/ssh_keys.py parses and checks it): the
    OpenSSH one-line form `<type> <base64>` (the comment dropped: `name` says which key
    it is), its type and fingerprint ("SHA256:" + unpadded base64 of the SHA-256 of the
    key blob, as `ssh-keygen -l` prints it). One per owner and fingerprint."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                              related_name="ssh_keys")
    name = models.CharField(max_length=100)
    public_key = models.TextField()
    key_type = models.CharField(max_length=40)
    fingerprint = models.CharField(max_length=60)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "fingerprint"],
                                    name="ssh_key_unique_per_owner"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.key_type} {self.fingerprint})"


class LeaseSample(models.Model):
    """One GPU of a running lease over one bucket of time (marketplace/telemetry.py):
    `resolution` 10 s buckets for the last hour, 60 s for the last day, older ones deleted
    as new ones are written, so a lease keeps at most 360 + 1440 rows per GPU. Each value
    is the mean of the bucket's readings (None: the runner could not read it);
    `throttle_reasons` the OR of their bits (telemetry.THROTTLE_REASONS)."""

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="samples")
    gpu_uuid = models.CharField(max_length=64)
    resolution = models.PositiveSmallIntegerField(help_text="bucket length, seconds")
    bucket_at = models.DateTimeField(help_text="start of the bucket (UTC)")
    samples = models.PositiveIntegerField(default=1, help_text="readings averaged")
    utilization_pct = models.FloatField(null=True)
    fb_used_mib = models.FloatField(null=True)
    power_w = models.FloatField(null=True)
    temperature_c = models.FloatField(null=True)
    sm_clock_mhz = models.FloatField(null=True)
    mem_clock_mhz = models.FloatField(null=True)
    throttle_reasons = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["lease", "resolution", "bucket_at", "gpu_uuid"],
                                    name="lease_sample_bucket"),
        ]

    def __str__(self) -> str:
        return f"lease {self.lease_id} {self.gpu_uuid} @{self.bucket_at} /{self.resolution}s"
