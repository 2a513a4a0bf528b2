"""The provider portal's pages: onboarding, nodes and their runner tokens (rotation
too), GPUs and health, asks, auctions, payouts and earnings. Same rules as
frontend/views.py: a form parses, one service acts, its refusal shows next to the field."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.db.models import Q
from django.http import Http404, HttpResponseNotAllowed
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from frontend import forms as f
from frontend.templatetags.gpumarket import usd as usd_text
from frontend.views import (
    _lease_rows,
    _order_rows,
    _page,
    _provider,
    _rows_json,
    _service_error,
    member,
    usd,
)
from marketplace import auctions as auction_services
from marketplace import book, interconnect, maintenance, node_retire, reliability, selectors
from marketplace.errors import MarketError
from marketplace.models import Auction, Lease, Order
from providers.benchmarks import gpu_score, latest_results
from providers.models import Node, Provider
from providers.recordings import unregistered_dump
from providers.services import (
    ProviderError,
    node_create,
    node_rename,
    provider_onboard,
    runner_heard,
)
from providers.services import node_rotate_token as rotate_runner_token
from settlement import services as ledger
from settlement.models import ChainAddress, ConnectedAccount, Payout

# ---------------------------------------------------------------- provider portal

def _portal_context(request, provider, **forms):
    nodes = list(provider.nodes.filter(retired_at__isnull=True).order_by("pk")) \
        if provider else []
    node_rows = []
    for n in nodes:
        gpus = list(n.gpus.all())
        node_rows.append({
            "id": n.pk, "name": n.name, "hostname": n.hostname, "gpus": len(gpus),
            "models": sorted({g.product_name for g in gpus}),
            "unhealthy": sum(1 for g in gpus if not g.healthy),
            "registered_at": n.registered_at, "last_heartbeat_at": n.last_heartbeat_at,
            "heard": runner_heard(n),
        })
    user = request.user
    asks = (Order.objects.filter(owner=user, side="ask").select_related("market", "node")
            .order_by("-pk")[:50])
    lots = Auction.objects.filter(provider=user).select_related("market").order_by("-pk")[:50]
    return {
        "provider": provider, "nodes": node_rows,
        "retired_nodes": list(provider.nodes.filter(retired_at__isnull=False)
                              .order_by("pk")) if provider else [],
        "provider_form": forms.get("provider_form") or f.ProviderForm(),
        "node_form": forms.get("node_form") or f.NodeForm(),
        "ask_form": forms.get("ask_form") or f.AskForm(nodes=nodes),
        "auction_form": forms.get("auction_form") or f.AuctionForm(nodes=nodes),
        "address_form": forms.get("address_form") or f.PayoutAddressForm(),
        "asks": _order_rows(asks),
        "lots": [{"id": a.pk, "market": a.market.slug, "gpus": a.gpus, "status": a.status,
                  "rule": a.rule, "reserve": usd(a.reserve_price), "closes_at": a.closes_at,
                  "bids": selectors.bid_count(a),
                  "clearing": usd(a.clearing_price) if a.clearing_price else None}
                 for a in lots],
        "leases": _lease_rows(Lease.objects.filter(provider=user)
                              .select_related("market", "node").order_by("-pk")[:50],
                              role="provider"),
        "stripe": bool(settings.STRIPE_SECRET_KEY),
        "payouts": _payout_context(user),
        "chain_address": ChainAddress.objects.filter(user=user)
        .values_list("address", flat=True).first(),
    }


@member
def portal(request):
    provider = _provider(request.user)
    return _page(request, "frontend/portal.html", _portal_context(request, provider))


@member
@require_POST
def portal_onboard(request):
    form = f.ProviderForm(request.POST)
    if form.is_valid():
        try:
            provider_onboard(user_id=request.user.pk,
                             display_name=form.cleaned_data["display_name"])
        except ProviderError as exc:
            _service_error(form, exc)
        else:
            messages.success(request, "You are a provider now. Add your first node.")
            return redirect("portal")
    return _page(request, "frontend/portal.html",
                 _portal_context(request, _provider(request.user), provider_form=form),
                 status=400)


def _require_provider(request) -> Provider:
    provider = _provider(request.user)
    if provider is None:
        raise Http404("become a provider first")
    return provider


@member
@require_POST
def node_add(request):
    provider = _require_provider(request)
    form = f.NodeForm(request.POST)
    if form.is_valid():
        try:
            created = node_create(provider=provider, name=form.cleaned_data["name"])
        except ProviderError as exc:
            _service_error(form, exc)
        else:
            return _token_page(request, created.node, created.runner_token, rotated=False,
                               status=201)
    return _page(request, "frontend/portal.html",
                 _portal_context(request, provider, node_form=form), status=400)


def _token_page(request, node, token: str, *, rotated: bool, status: int):
    """The page that shows a runner token, once: only its hash is stored; not cached."""
    site = request.build_absolute_uri("/").rstrip("/")
    response = _page(request, "frontend/node_token.html", {
        "node": node, "token": token, "site": site, "rotated": rotated,
        "dump": unregistered_dump()}, status=status)
    response["Cache-Control"] = "no-store"
    return response


@member
@require_POST
def node_rotate_token(request, pk: int):
    """The node page's "Rotate runner token" (POST, CSRF, the box ticked): the new token,
    shown once. Not your node: 404; the box not ticked: the node page again, 400."""
    provider = _require_provider(request)
    node = get_object_or_404(Node, pk=pk, provider=provider)
    form = f.RotateTokenForm(request.POST)
    if form.is_valid():
        try:
            rotated = rotate_runner_token(user_id=request.user.pk, node_id=node.pk)
        except ProviderError as exc:
            _service_error(form, exc)
        else:
            return _token_page(request, rotated.node, rotated.runner_token, rotated=True,
                               status=200)
    return node_detail(request, pk, rotate_form=form, status=400)


@member
@require_POST
def node_rename_page(request, pk: int):
    """The node page's "Rename": PRG to the node page; a bad or taken name, the node page
    again with the error next to the field (400). Not your node: 404."""
    provider = _require_provider(request)
    node = get_object_or_404(Node, pk=pk, provider=provider)
    form = f.RenameNodeForm(request.POST)
    if form.is_valid():
        try:
            node = node_rename(user_id=request.user.pk, node_id=node.pk,
                               name=form.cleaned_data["name"])
        except ProviderError as exc:
            _service_error(form, exc)
        else:
            messages.success(request, f"Node renamed to “{node.name}”.")
            return redirect("node", pk=node.pk)
    return node_detail(request, pk, rename_form=form, status=400)


@member
@require_POST
def node_maintenance(request, pk: int):
    """The node page's "Announce maintenance" (POST, CSRF): the window, or the node page
    again with the refusal on its field, 400. Not your node: 404."""
    provider = _require_provider(request)
    node = get_object_or_404(Node, pk=pk, provider=provider)
    form = f.MaintenanceForm(request.POST)
    if form.is_valid():
        v = form.cleaned_data
        try:
            maintenance.announce(user_id=request.user.pk, node_id=node.pk,
                                 starts_at=v["starts_at"], ends_at=v["ends_at"],
                                 reason=v["reason"])
        except MarketError as exc:
            _service_error(form, exc)
        else:
            messages.success(request, "Maintenance window announced: its time is no longer "
                                      "sold, and leases that would overlap it get their notice.")
            return redirect("node", pk=node.pk)
    return node_detail(request, pk, maintenance_form=form, status=400)


@member
@require_POST
def node_retire_page(request, pk: int):
    """The node page's "Retire node" (the box ticked): PRG to the portal, saying which asks
    were cancelled; refused (active leases, open auctions): PRG to the node page, saying
    why; the box unticked: the node page again (400). Not your node: 404."""
    provider = _require_provider(request)
    node = get_object_or_404(Node, pk=pk, provider=provider)
    form = f.RetireNodeForm(request.POST)
    if form.is_valid():
        try:
            retired = node_retire.retire_node(user_id=request.user.pk, node_id=node.pk)
        except MarketError as exc:  # (active leases, open auctions): PRG, the reason shown
            messages.error(request, f"Node “{node.name}” was not retired: {exc.message}.")
            return redirect("node", pk=node.pk)
        asks = retired.cancelled_asks
        messages.success(request, f"Node “{node.name}” retired"
                         + (f"; ask{'s' if len(asks) > 1 else ''} "
                            f"{', '.join(f'#{a}' for a in asks)} cancelled." if asks else "."))
        return redirect("portal")
    return node_detail(request, pk, retire_form=form, status=400)




@member
@require_POST
def node_maintenance_withdraw(request, pk: int, window_id: int):
    """Withdraw a window (POST, CSRF); its notices are taken back. Not yours: 404."""
    provider = _require_provider(request)
    node = get_object_or_404(Node, pk=pk, provider=provider)
    try:
        maintenance.withdraw(user_id=request.user.pk, node_id=node.pk, window_id=window_id)
    except MarketError as exc:
        if getattr(exc, "status", 400) == 404:
            raise Http404(str(exc)) from None
        messages.error(request, str(exc))
    else:
        messages.success(request, "Maintenance window withdrawn.")
    return redirect("node", pk=node.pk)


@member
def node_detail(request, pk: int, *, rotate_form=None, rename_form=None, retire_form=None,
                maintenance_form=None,
                status: int = 200):
    provider = _require_provider(request)
    node = get_object_or_404(Node, pk=pk, provider=provider)
    gpus = []
    latest = latest_results(node.gpus.all())
    for g in node.gpus.select_related("gpu_class", "parent").order_by("pci_bus_id",
                                                                      "gpu_instance_id"):
        # a MIG slice has no readings of its own: its GPU's (the runner reads the GPU)
        health = g.last_health or (g.parent.last_health if g.parent_id else {}) or {}
        result = latest.get(g.pk)
        gpus.append({
            "uuid": g.uuid, "product_name": g.product_name, "gpu_class": g.gpu_class.slug,
            "memory_gib": round(g.memory_mib / 1024, 1), "pci_bus_id": g.pci_bus_id,
            "mig_mode": g.mig_mode, "healthy": g.healthy,
            "findings": [{"severity": x.get("severity", ""), "rule": x.get("rule", ""),
                          "evidence": x.get("evidence") or x.get("message") or ""}
                         for x in (g.findings or []) if isinstance(x, dict)],
            "temperature": health.get("temperature_c", health.get("temperature")),
            "power": health.get("power_w", health.get("power_draw_w")),
            "utilization": health.get("utilization_pct", health.get("gpu_util")),
            "unhealthy_since": g.unhealthy_since,
            # None: "not benchmarked yet"; a failed correctness check is never a score
            "score": gpu_score(g, result),
            "benchmark_failed": result is not None and not result.correct,
            "benchmark_at": result.measured_at if result is not None else None,
            "nvlink": (f"{g.nvlink_links_active} links, {len(g.nvlink_peers)} peer GPU"
                       f"{'' if len(g.nvlink_peers) == 1 else 's'}"
                       if g.nvlink_links_active is not None else ""),
            "pcie": (f"Gen {g.pcie_generation} \u00d7{g.pcie_width}"
                     if g.pcie_generation and g.pcie_width else ""),
        })
    classes = {g.gpu_class for g in node.gpus.select_related("gpu_class")}
    topology = [interconnect.node_summary(node.pk, c.pk)
                for c in sorted(classes, key=lambda c: c.slug)]
    return _page(request, "frontend/node.html", {
        "node": node, "heard": runner_heard(node), "gpus": gpus,
        "classes": sorted(classes, key=lambda c: c.slug),
        "topology": topology,
        "leases": _lease_rows(Lease.objects.filter(node=node)
                              .select_related("market", "node").order_by("-pk")[:50],
                              role="provider"),
        "rotate_form": rotate_form or f.RotateTokenForm(),
        "reliability": reliability.records(node_id=node.pk),
        "rename_form": rename_form or f.RenameNodeForm(initial={"name": node.name}),
        "retire_form": retire_form or f.RetireNodeForm(),
        "retire_refusal": None if node.retired_at else node_retire.refusal(node),
        "windows": maintenance.upcoming([node.pk]).get(node.pk, []),
        "maintenance_form": maintenance_form or f.MaintenanceForm(),
    }, status=status)


@member
@require_POST
def ask_add(request):
    provider = _require_provider(request)
    nodes = list(provider.nodes.filter(retired_at__isnull=True).order_by("pk"))
    form = f.AskForm(request.POST, nodes=nodes)
    if form.is_valid():
        v = form.cleaned_data
        try:
            placed = book.place_ask(
                provider_id=request.user.pk, node_id=v["node"], market_slug=None,
                price=v["price"], gpus=v["gpus"],
                available_until=timezone.now() + timedelta(hours=v["available_hours"]))
        except MarketError as exc:
            _service_error(form, exc)
        else:
            messages.success(request, f"Ask #{placed.order.pk} placed; "
                                      f"{len(placed.leases)} lease(s) matched at once.")
            return redirect("portal")
    return _page(request, "frontend/portal.html",
                 _portal_context(request, provider, ask_form=form), status=400)


@member
@require_POST
def auction_add(request):
    provider = _require_provider(request)
    nodes = list(provider.nodes.filter(retired_at__isnull=True).order_by("pk"))
    form = f.AuctionForm(request.POST, nodes=nodes)
    if form.is_valid():
        v = form.cleaned_data
        try:
            lot = auction_services.open_auction(
                provider_id=request.user.pk, node_id=v["node"], gpus=v["gpus"],
                reserve_price=v["reserve_price"], duration_seconds=v["hours"] * 3600,
                closes_at=timezone.now() + timedelta(minutes=v["closes_in_minutes"]),
                rule=v["rule"])
        except MarketError as exc:
            _service_error(form, exc)
        else:
            messages.success(request, f"Sealed-bid auction #{lot.pk} is open.")
            return redirect("auction", pk=lot.pk)
    return _page(request, "frontend/portal.html",
                 _portal_context(request, provider, auction_form=form), status=400)


@member
@require_POST
def payout_address(request):
    from settlement import onchain

    provider = _require_provider(request)
    form = f.PayoutAddressForm(request.POST)
    if form.is_valid():
        try:
            onchain.address_register(user_id=request.user.pk,
                                     address=form.cleaned_data["address"])
        except ValueError as exc:
            form.add_error("address", str(exc))
        else:
            messages.success(request, "Payout address saved.")
            return redirect("portal")
    return _page(request, "frontend/portal.html",
                 _portal_context(request, provider, address_form=form), status=400)


def _payout_context(user) -> dict:
    """The portal's payouts card: Stripe Connect status (Stripe's word on the account),
    what "withdraw" pays now (whole
    cents, micro-USD) and what stays (the sub-cent rest), the latest payouts."""
    from settlement import stripe_payouts
    from settlement.stripe_payments import micros_to_whole_cents

    earned = ledger.wallet(user_id=user.pk).earned
    cents, rest = micros_to_whole_cents(max(0, earned))
    connected = ConnectedAccount.objects.filter(user=user).exists()
    return {
        "connected": connected,
        # Stripe is asked only when there is an account to ask about
        "status": stripe_payouts.connect_status(user_id=user.pk)
        if connected and settings.STRIPE_SECRET_KEY else "not set up",
        "earned": earned, "withdrawable": cents * 10_000, "rest": rest,
        "history": list(Payout.objects.filter(provider=user).order_by("-pk")[:20]),
    }


@member
@require_POST
def payout_withdraw(request):
    """"Withdraw": pay the earned balance out in whole cents to the provider's Stripe
    connected account (settlement.stripe_payouts.payout_create); the sub-cent rest stays.
    The outcome (paid, failed with Stripe's reason, pending: retried) is a message on the
    portal (post/redirect/get). Stripe off: 404."""
    from settlement import stripe_payments, stripe_payouts

    _require_provider(request)
    try:
        payout = stripe_payouts.payout_create(provider_id=request.user.pk)
    except stripe_payments.StripeDisabled:
        raise Http404("Stripe is not configured on this server") from None
    except stripe_payouts.PayoutRefused as exc:
        messages.error(request, f"No payout: {exc}.")
        return redirect(f"{reverse('portal')}#payouts")
    paid = usd_text(payout.amount)
    if payout.status == Payout.Status.PAID:
        rest = ledger.wallet(user_id=request.user.pk).earned
        messages.success(request, f"Payout #{payout.pk}: {paid} sent to your Stripe account"
                                  f"; {usd_text(rest)} stays in your balance.")
    elif payout.status == Payout.Status.FAILED:
        messages.error(request, f"Payout #{payout.pk} of {paid} failed: {payout.failure} "
                                "Your balance is as it was.")
    else:
        messages.info(request, f"Payout #{payout.pk} of {paid} is pending: Stripe did not "
                               "answer. Retry it below (the same key: never paid twice).")
    return redirect(f"{reverse('portal')}#payouts")


@member
@require_POST
def payout_retry(request, pk: int):
    """Repeat a pending payout's transfer with its own idempotency key (not yours: 404)."""
    from settlement import stripe_payments, stripe_payouts

    _require_provider(request)
    payout = get_object_or_404(Payout, pk=pk, provider=request.user)
    try:
        payout = stripe_payouts.payout_retry(payout_id=payout.pk)
    except stripe_payments.StripeDisabled:
        raise Http404("Stripe is not configured on this server") from None
    messages.info(request, f"Payout #{payout.pk}: {payout.status}"
                           f"{': ' + payout.failure if payout.failure else '.'}")
    return redirect(f"{reverse('portal')}#payouts")


@member
def payout_connect(request):
    from settlement import stripe_payments, stripe_payouts

    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    _require_provider(request)
    back = request.build_absolute_uri(reverse("portal"))
    try:
        url = stripe_payouts.connect_onboard(user_id=request.user.pk, return_url=back,
                                             refresh_url=back)
    except stripe_payments.StripeDisabled:
        raise Http404("Stripe is not configured on this server") from None
    except stripe_payments.stripe.StripeError as exc:
        messages.error(request, f"Stripe refused: {exc.user_message or exc}")
        return redirect("portal")
    return redirect(url)


@member
def earnings(request):
    _require_provider(request)
    settled = (Lease.objects.filter(provider=request.user)
               .filter(Q(settled_at__isnull=False) | Q(cost__isnull=False))
               .select_related("market", "node").order_by("settled_at", "pk"))
    rows, series, total = [], [], 0
    totals = {"cost": 0, "provider": 0, "fee": 0}
    for x in settled:
        cost, prov, fee = x.cost or 0, x.provider_amount or 0, x.platform_fee or 0
        totals["cost"] += cost
        totals["provider"] += prov
        totals["fee"] += fee
        total += prov
        at = x.settled_at or x.ended_at or x.created_at
        rows.append({"id": x.pk, "market": x.market.slug, "node": x.node.name,
                     "gpus": x.gpu_count, "status": x.status, "settled_at": at,
                     "cost": usd(cost), "provider_amount": usd(prov), "platform_fee": usd(fee),
                     "share": f"{prov * 100 / cost:.1f} %" if cost else "—"})
        # micro-USD; earnings.js plots them on a time axis (ms since the epoch, UTC)
        series.append({"t": at.strftime("%Y-%m-%d %H:%M:%S"), "ms": int(at.timestamp() * 1000),
                       "cumulative": total, "lease": prov})
    w = ledger.wallet(user_id=request.user.pk)
    return _page(request, "frontend/earnings.html", {
        "rows": rows[::-1], "series_json": _rows_json(series),
        "totals": {k: usd(v) for k, v in totals.items()}, "earned": usd(w.earned),
        "take_rate": getattr(settings, "GPUMARKET_TAKE_RATE_BPS", 1500) / 100,
    })
