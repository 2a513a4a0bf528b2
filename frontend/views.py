"""Server-rendered pages: the home page, sign up / log in, the buyer's bidding UI
(wallet, sealed auctions, orders, leases) and the helpers the other page
modules share (the market page: frontend/market_views.py; the provider portal:
frontend/portal_views.py; Stripe: stripe_views.py).

Views stay thin: a form parses the input, one service does the work, and a refusal of
the service (MarketError, ProviderError, SettlementError) is shown next to the field
it names. Sealed bids: a page shows a user only their own bid; everybody else sees
the count before close and the anonymous awards after."""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.core.handlers.asgi import ASGIRequest
from django.db.models import F
from django.db.models.functions import Coalesce
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from frontend import forms as f
from frontend.forms_terms import checkpoint_input
from frontend.login import signup_limited
from frontend.templatetags import gpumarket as money
from marketplace import auctions as auction_services
from marketplace import (
    book,
    chains,
    checkpoint_reports,
    env_templates,
    runtimes,
    selectors,
    telemetry,
)
from marketplace.auth_backends import release_connection
from marketplace.catalog import slice_label
from marketplace.errors import MarketError
from marketplace.jupyter import jupyter_link
from marketplace.lease_notice import DEFAULT_STOP_GRACE_SECONDS
from marketplace.models import Auction, Fill, GpuClass, Lease, Order, SshKey
from marketplace.ports import endpoint_text, ssh_command
from marketplace.sealing import sealed_names
from providers.models import LeaseLog, Provider
from settlement import services as ledger
from settlement.models import Hold
from settlement.money import format_usd, lease_cost

LOGIN = "login"
member = login_required(login_url=LOGIN)


# ---------------------------------------------------------------- helpers

def usd(micros: int | None) -> str:
    """Micro-USD as USD with 2 to 6 decimals: 2_490_000 → '2.49', 1 → '0.000001'."""
    if micros is None:
        return "—"
    text = format_usd(micros)
    whole, frac = text.split(".")
    return f"{whole}.{frac.rstrip('0').ljust(2, '0')}"


#: the GET URL of a page that POST-only form paths render again with the form's errors
_PAGE_URLS = {"frontend/portal.html": "portal", "frontend/wallet.html": "wallet-page"}


def _page(request, template: str, context: dict, status: int = 200):
    """Render with what every page needs: whether this server speaks websockets (only
    the ASGI application routes /ws/), so the page's script knows to use the live feed
    or to refresh through the REST API; after a POST, `page_url`, the page's own GET URL
    (live.js puts it in the address bar: the form's values and errors stay, and a reload
    or a live refresh asks that URL, not the POST-only path)."""
    context.setdefault("live_ws", isinstance(request, ASGIRequest))
    if request.method == "POST" and template in _PAGE_URLS:
        context.setdefault("page_url", reverse(_PAGE_URLS[template]))
    return render(request, template, context, status=status)


def _service_error(form, exc: Exception) -> None:
    """Attach a service's refusal to the field it names (else to the form)."""
    message = getattr(exc, "message", None) or str(exc)
    field = getattr(exc, "field", None)
    if field == "hours" and "hours" not in form.fields:
        field = None
    if field and field.split(".", 1)[0] == "checkpoint":  # "checkpoint.url": its input
        field = checkpoint_input(field.removeprefix("checkpoint").removeprefix("."))
    if field and field.split(".", 1)[0] in ("env", "secrets"):  # "secrets.HF_TOKEN"
        field, message = field.split(".", 1)[0], f"{field}: {message}"
    form.add_error(field if field in form.fields else None, message)


def _provider(user) -> Provider | None:
    return Provider.objects.filter(user=user).first()


def _rows_json(rows) -> str:
    return json.dumps(rows, separators=(",", ":"))


# ---------------------------------------------------------------- home, accounts

def home(request):
    now = timezone.now()
    markets = []
    # 120-odd markets (whole GPUs and MIG slices): the book is read only where an order rests
    trading = set(Order.objects.filter(status__in=Order.ACTIVE, remaining_gpus__gt=0)
                  .values_list("market_id", flat=True).distinct())
    for market in GpuClass.objects.select_related("parent").order_by(
            Coalesce("parent__slug", "slug"), F("parent").asc(nulls_first=True),
            "memory_gb", "slug"):  # each whole GPU, then its slices
        bids, asks = book.depth(market, levels=1) if market.pk in trading else ([], [])
        markets.append({
            "slug": market.slug, "name": market.name, "memory_gb": market.memory_gb,
            "slice": slice_label(market),
            "tflops": market.bf16_dense_tflops, "reference": _usd(market.reference_price or None),
            "best_bid": _usd(bids[0][0]) if bids else "—",
            "best_ask": _usd(asks[0][0]) if asks else "—",
            "gpus_offered": sum(q for _, q in asks),
        })
    open_auctions = [
        {"id": a.pk, "market": a.market.slug, "gpus": a.gpus, "rule": a.rule,
         "reserve": _usd(a.reserve_price), "bids": selectors.bid_count(a),
         "seconds_left": max(0, int((a.closes_at - now).total_seconds()))}
        for a in Auction.objects.filter(status="open").select_related("market")
        .order_by("closes_at")
    ]
    fills = [
        {"id": x.pk, "market": x.market.slug, "gpus": x.gpus, "price": _usd(x.price),
         "at": x.created_at}
        for x in Fill.objects.select_related("market").order_by("-pk")[:20]
    ]
    leases = [
        {"id": lease.pk, "market": lease.market.slug, "gpus": lease.gpu_count,
         "node": lease.node.name, "status": lease.status, "price": _usd(lease.price),
         "cost": _usd(lease.cost)}
        for lease in Lease.objects.select_related("market", "node").order_by("-pk")[:20]
    ]
    return _page(request, "frontend/home.html", {
        "markets": markets, "auctions": open_auctions, "fills": fills, "leases": leases,
    })


def _redirect_next(request, nxt: str, default: str) -> HttpResponseRedirect:
    """To `nxt` when it is a path of this site (never a URL name, another host or a
    scheme of its own), else to the page named `default`."""
    if (nxt.startswith("/") and "\x00" not in nxt
            and url_has_allowed_host_and_scheme(nxt, allowed_hosts={request.get_host()},
                                                require_https=request.is_secure())):
        return HttpResponseRedirect(nxt)
    return redirect(default)


def _usd(micros: int | None) -> str:
    # all 6 places, "$2.490000": the template's `price` filter shows it ("$2.49 /GPU-h")
    return "—" if micros is None else f"${format_usd(micros)}"


@signup_limited(f.SignupForm, "frontend/signup.html")
def signup(request):
    if request.user.is_authenticated:
        return redirect("wallet-page")
    form = f.SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        release_connection()  # the password is hashed in save(): with no connection held
        user = form.save()
        login(request, user, backend="marketplace.auth_backends.ModelBackend")
        messages.success(request, f"Welcome, {user.username}.")
        return _redirect_next(request, request.GET.get("next", ""), "wallet-page")
    return _page(request, "frontend/signup.html", {"form": form},
                 status=400 if form.errors else 200)


# ---------------------------------------------------------------- wallet

def _wallet_context(request, *, credit_form=None, topup_form=None, client_secret=None,
                    ssh_key_form=None):
    w = ledger.wallet(user_id=request.user.pk)
    holds = Hold.objects.filter(buyer=request.user, status=Hold.Status.ACTIVE).order_by("pk")
    return {
        "available": usd(w.available), "held": usd(w.held), "earned": usd(w.earned),
        "holds": [{"id": h.pk, "reference": h.reference, "amount": usd(h.amount),
                   "original": usd(h.original), "created_at": h.created_at} for h in holds],
        "stripe": bool(settings.STRIPE_SECRET_KEY),
        "dev_credit": bool(settings.GPUMARKET_DEV_CREDIT),
        "credit_form": credit_form or f.DevCreditForm(),
        "topup_form": topup_form or f.TopUpForm(),
        "client_secret": client_secret,
        "ssh_keys": SshKey.objects.filter(owner=request.user),
        "ssh_key_form": ssh_key_form or f.SshKeyForm(),
    }


@member
def wallet(request):
    return _page(request, "frontend/wallet.html", _wallet_context(request))


@member
@require_POST
def wallet_dev_credit(request):
    if not settings.GPUMARKET_DEV_CREDIT:
        raise Http404("development credit is disabled on this server")
    form = f.DevCreditForm(request.POST)
    if form.is_valid():
        ledger.dev_credit(user_id=request.user.pk, amount=form.cleaned_data["amount"])
        messages.success(request, f"Credited {money.usd(form.cleaned_data['amount'])}.")
        return redirect("wallet-page")
    return _page(request, "frontend/wallet.html", _wallet_context(request, credit_form=form),
                 status=400)


# the Stripe top-up (POST wallet/topup/ and paying in the page): frontend/stripe_views.py


# ---------------------------------------------------------------- markets

def container_terms(v: dict) -> dict:
    """A bid form's container fields resolved as the API resolves a body's
    (env_templates.resolve), and its secrets: an empty entry is a field not given.
    Raises InvalidInput."""
    return {**env_templates.resolve(
        template=v.get("template") or "", image=v.get("image") or None,
        command=v.get("command") or None, ports=v.get("ports") or None,
        env=v.get("env") or None, min_cuda=v.get("min_cuda") or None, ssh=v.get("ssh")),
        "secrets": v.get("secrets") or {}}


def bid_terms(v: dict, *, sealed: bool = False) -> dict:
    """A bid form's terms (frontend/forms_terms.py) as place_bid / place_sealed_bid take
    them; a sealed bid's failover is a bool (empty: yes), a bid's None (the default)."""
    failover = v.get("failover")
    stop_grace = v.get("stop_grace_seconds")
    return {"checkpoint": v.get("checkpoint"), "min_reliability": v.get("min_reliability"),
            "failover": failover is not False if sealed else failover,
            "notice_signal": v.get("notice_signal") or "",
            "stop_grace_seconds": DEFAULT_STOP_GRACE_SECONDS if stop_grace is None
            else stop_grace}


# ---------------------------------------------------------------- orders and leases

def _order_rows(orders):
    return [{"id": o.pk, "side": o.side, "market": o.market.slug, "status": o.status,
             "price": usd(o.price), "gpus": o.gpus, "remaining": o.remaining_gpus,
             "filled": o.gpus - o.remaining_gpus if o.side == "bid" else None,
             "hours": (o.duration_seconds or 0) / 3600 if o.duration_seconds else None,
             "tif": o.time_in_force, "node": o.node.name if o.node_id else "",
             "created_at": o.created_at, "active": o.status in Order.ACTIVE}
            for o in orders]


def _clock(seconds: int) -> str:
    """3725 → '1:02:05' (as leases.js counts it)."""
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _port_label(port: int, roles: dict | None) -> str:
    """"22 (ssh)": a container port and its role (the lease's port_roles), or "8080"."""
    role = (roles or {}).get(str(port))
    return f"{port} ({role})" if role else str(port)


def _lease_rows(leases, *, role: str):
    leases = list(leases)
    tails = dict(LeaseLog.objects.filter(lease_id__in=[x.pk for x in leases])
                 .values_list("lease_id", "tail"))
    saved = checkpoint_reports.by_lease([x.pk for x in leases])  # issue 15
    # idle detection (issue 16) from the GPU telemetry: the buyer's page only
    idle = telemetry.idle_states(leases) if role == "buyer" else {}
    rows = []
    now = timezone.now()
    for x in leases:
        ended_early = x.status in ("failed", "preempted", "cancelled")
        ran = 0 if x.started_at is None else \
            max(0, int(min((now - x.started_at).total_seconds(), x.duration_seconds)))
        rows.append({
            "id": x.pk, "market": x.market.slug, "status": x.status, "gpus": x.gpu_count,
            "node": x.node.name, "price": usd(x.price), "hours": x.duration_seconds / 3600,
            "container_id": x.container_id, "started_at": x.started_at, "ends_at": x.ends_at,
            "ended_at": x.ended_at, "cause": x.cause, "ended_early": ended_early,
            "cost": usd(x.cost), "provider_amount": usd(x.provider_amount),
            "platform_fee": usd(x.platform_fee), "image": x.image, "role": role,
            "log_tail": tails.get(x.pk, ""),
            "preempt_at": x.preempt_at if x.status in Lease.ACTIVE else None,
            # another deadline its workload was told of (docs/LEASE_CONTRACT.md)
            "notice_deadline": x.notice_deadline if x.status in Lease.ACTIVE
            and x.notice_reason and x.notice_reason != "preemption" else None,
            "notice_reason": x.notice_reason,
            "ports": [_port_label(p, x.port_roles) for p in x.ports or []],
            "template": x.template,
            # unended: the time left and the cost so far, counted on by leases.js
            "live": x.status in Lease.ACTIVE, "server_time": now,
            "price_micros": x.price, "duration_seconds": x.duration_seconds,
            "time_left": _clock(max(0, int((x.ends_at - now).total_seconds())))
            if x.ends_at else None,
            "cost_so_far": usd(lease_cost(x.price, x.gpu_count, ran)),
            # where the buyer connects, while the lease runs ("host:port" per port)
            "endpoints": [{"port": _port_label(e["container_port"], x.port_roles),
                           "address": endpoint_text(e)}
                          for e in x.endpoints or []] if x.status in Lease.ACTIVE else [],
            # the buyer's way in (never the provider's to see)
            "ssh_command": ssh_command(x) if role == "buyer" and x.status in Lease.ACTIVE
            else None,
            "ssh": x.ssh,
            # the Jupyter link holds the lease's token: its buyer's page only
            "jupyter": jupyter_link(x) if role == "buyer" and x.status in Lease.ACTIVE
            else None,
            "secret_names": sealed_names(x.secrets_sealed),
            # the bucket (never its credentials) and the runner's last reports
            "checkpoint_url": (x.checkpoint or {}).get("url", ""),
            "checkpoints": saved.get(x.pk, []),
            # issue 15: the chain's story (failover) and the provider's fault credit
            "chain": (chains.story(chains.chain_of(x))  # the buyer's: other nodes' names
                      if role == "buyer" and (x.chain_id or x.status == "failed") else []),
            "fault_credit": usd(x.fault_credit) if x.fault_credit else "",
            "idle": idle.get(x.pk),
            "charted": role == "buyer" and x.status == Lease.Status.RUNNING,
        })
    return rows


@member
def my_orders(request):
    orders = (Order.objects.filter(owner=request.user).select_related("market", "node")
              .order_by("-pk")[:200])
    bids = selectors.own_bids(request.user.pk).select_related("auction").order_by("-pk")
    return _page(request, "frontend/orders.html", {
        "orders": _order_rows(orders),
        "sealed_bids": [{"id": b.pk, "auction": b.auction_id, "status": b.status,
                         "price": usd(b.price), "gpus": b.gpus, "awarded": b.awarded_gpus,
                         "paid": usd(b.paid_price)} for b in bids],
    })


@member
@require_POST
def order_cancel(request, pk: int):
    try:
        order = book.cancel_order(user_id=request.user.pk, order_id=pk)
    except MarketError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"Order #{order.pk} cancelled.")
    return _redirect_next(request, request.POST.get("next", ""), "orders-page")


@member
def my_leases(request):
    return _page(request, "frontend/leases.html", {
        "leases": _lease_rows(Lease.objects.filter(buyer=request.user)
                              .select_related("market", "node").order_by("-pk")[:200],
                              role="buyer"),
    })


# ---------------------------------------------------------------- sealed auctions

def auction_list(request):
    now = timezone.now()
    rows = []
    for a in Auction.objects.select_related("market").order_by("-pk")[:100]:
        rows.append({"id": a.pk, "market": a.market.slug, "gpus": a.gpus, "rule": a.rule,
                     "reserve": usd(a.reserve_price), "hours": a.duration_seconds / 3600,
                     "status": a.status, "closes_at": a.closes_at,
                     "seconds_left": max(0, int((a.closes_at - now).total_seconds()))
                     if a.status == "open" else 0,
                     "bids": selectors.bid_count(a),
                     "clearing": usd(a.clearing_price) if a.clearing_price else None})
    return _page(request, "frontend/auctions.html", {"auctions": rows})


def _auction_context(request, auction: Auction, form):
    now = timezone.now()
    is_open = auction.status == Auction.Status.OPEN
    mine = None
    if request.user.is_authenticated:
        own = (selectors.own_bids(request.user.pk).filter(auction=auction)
               .exclude(status="withdrawn").order_by("-pk").first())
        if own is not None:
            mine = {"id": own.pk, "status": own.status, "price": usd(own.price),
                    "gpus": own.gpus, "min_gpus": own.min_gpus, "awarded": own.awarded_gpus,
                    "paid": usd(own.paid_price), "active": own.status == "active"}
    awards = []
    if auction.status == Auction.Status.CLOSED:
        awards = [{"gpus": b.awarded_gpus, "price": usd(b.paid_price)}
                  for b in selectors.awards(auction).order_by("pk")]
    return {
        "auction": auction, "form": form, "mine": mine, "awards": awards, "is_open": is_open,
        "reserve": usd(auction.reserve_price), "hours": auction.duration_seconds / 3600,
        "clearing": usd(auction.clearing_price) if auction.clearing_price else None,
        "bid_count": selectors.bid_count(auction),
        "seconds_left": max(0, int((auction.closes_at - now).total_seconds())) if is_open else 0,
        "server_time": now.isoformat(),
        "own_lot": request.user.is_authenticated and auction.provider_id == request.user.pk,
        "lot_hold": usd(auction.reserve_price * auction.gpus * auction.duration_seconds // 3600),
    }


def auction_detail(request, pk: int):
    auction = get_object_or_404(Auction.objects.select_related("market", "node"), pk=pk)
    form = f.SealedBidForm(request.POST or None, images=runtimes.runs_images(
        auction.node.runtime), where="this lot's node")
    if request.method == "POST":
        if not request.user.is_authenticated:
            return redirect(f"{reverse(LOGIN)}?next={request.path}")
        if form.is_valid():
            v = form.cleaned_data
            try:
                bid = auction_services.place_sealed_bid(
                    bidder_id=request.user.pk, auction_id=pk, price=v["price"], gpus=v["gpus"],
                    min_gpus=v["min_gpus"], interconnect=v["interconnect"] or "any",
                    **bid_terms(v, sealed=True), **container_terms(v))
            except (MarketError, ledger.SettlementError) as exc:
                _service_error(form, exc)
            else:
                replaced = (f" It replaces your bid #{bid.replaced_bid_id}, whose hold is "
                            "released." if bid.replaced_bid_id else "")
                messages.success(request, f"Your sealed bid #{bid.pk} is in: "
                                          f"{money.price(bid.price)}.{replaced}")
                return redirect("auction", pk=pk)
        return _page(request, "frontend/auction.html",
                     _auction_context(request, auction, form), status=400)
    return _page(request, "frontend/auction.html", _auction_context(request, auction, form))


@member
@require_POST
def sealed_bid_withdraw(request, pk: int):
    try:
        bid = auction_services.withdraw_sealed_bid(bidder_id=request.user.pk, bid_id=pk)
    except MarketError as exc:
        messages.error(request, exc.message)
        auction_id = selectors.own_bids(request.user.pk).filter(pk=pk).values_list(
            "auction_id", flat=True).first()
        return redirect("auction", pk=auction_id) if auction_id else redirect("auctions-page")
    messages.success(request, f"Sealed bid #{bid.pk} withdrawn; its hold is released.")
    return redirect("auction", pk=bid.auction_id)
