"""The leases page's Stop and Extend (marketplace/lease_control.py, the API's services):
a GET shows the confirmation step (what the stop charges so far; what an extension
costs), the POST does it and redirects to the leases page with the outcome (PRG): the
exact final charge after a stop, the new end after an extension. Not the buyer's lease:
404. A refusal (409 in the API) is shown on the confirmation page, nothing written."""

from __future__ import annotations

import secrets

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect
from django.utils import timezone

from frontend import forms as f
from frontend.views import _page, _service_error, member, usd
from marketplace import lease_control
from marketplace.errors import MarketError
from marketplace.models import Lease, LeaseExtension
from settlement import services as ledger
from settlement.money import lease_cost


def _own_lease(request, pk: int) -> Lease:
    lease = Lease.objects.select_related("market", "node").filter(
        pk=pk, buyer=request.user).first()
    if lease is None:
        raise Http404(f"no lease {pk} of yours")
    return lease


def _so_far(lease: Lease) -> tuple[int, int]:
    """(seconds run, micro-USD owed) if the lease stopped now."""
    if lease.started_at is None:
        return 0, 0
    seconds = int(min((timezone.now() - lease.started_at).total_seconds(),
                      lease.duration_seconds))
    seconds = max(seconds, 0)
    return seconds, lease_cost(lease.price, lease.gpu_count, seconds)


def _summary(lease: Lease) -> dict:
    seconds, owed = _so_far(lease)
    return {"id": lease.pk, "market": lease.market.slug, "status": lease.status,
            "gpus": lease.gpu_count, "node": lease.node.name, "price": usd(lease.price),
            "started_at": lease.started_at, "ends_at": lease.ends_at,
            "duration_seconds": lease.duration_seconds, "seconds_run": seconds,
            "owed": usd(owed), "interruptible": lease.interruptible,
            "per_hour": usd(lease_cost(lease.price, lease.gpu_count, 3600)),
            "active": lease.status in Lease.ACTIVE}


def _charged(lease: Lease) -> str:
    seconds = int((lease.ended_at - lease.started_at).total_seconds()) \
        if lease.started_at and lease.ended_at else 0
    seconds = min(max(seconds, 0), lease.duration_seconds)
    return (f"charged {usd(lease.cost)} USD for {seconds} s (provider "
            f"{usd(lease.provider_amount)}, platform {usd(lease.platform_fee)}); the rest of "
            "its hold is back in your wallet")


@member
def lease_stop(request, pk: int):
    """GET: the confirmation; POST: stop it now (idempotent: an ended lease is only
    reported)."""
    lease = _own_lease(request, pk)
    if request.method != "POST":
        if lease.status not in Lease.ACTIVE:
            messages.info(request, f"Lease #{lease.pk} has already ended ({lease.status}).")
            return redirect("leases-page")
        return _page(request, "frontend/lease_stop.html", {"lease": _summary(lease)})
    was = lease.status
    try:
        lease = lease_control.stop_lease(buyer_id=request.user.pk, lease_id=pk)
    except MarketError as exc:
        messages.error(request, exc.message)
        return redirect("leases-page")
    if was in Lease.ACTIVE:
        messages.success(request, f"Lease #{lease.pk} stopped: {_charged(lease)}.")
    else:
        messages.info(request, f"Lease #{lease.pk} had already ended ({lease.status}): "
                               f"{_charged(lease)}.")
    return redirect("leases-page")


@member
def lease_extend(request, pk: int):
    """GET: the form (hours) with the price; POST: extend it, or show why not (400)."""
    lease = _own_lease(request, pk)
    form = f.ExtendLeaseForm(request.POST if request.method == "POST" else None,
                             initial={"request_id": secrets.token_urlsafe(16)})
    if request.method == "POST" and form.is_valid():
        hours, request_id = form.cleaned_data["hours"], form.cleaned_data["request_id"] or ""
        cost = lease_control.extension_cost(lease, hours * 3600)
        try:
            lease = lease_control.extend_lease(buyer_id=request.user.pk, lease_id=pk,
                                               seconds=hours * 3600, field="hours",
                                               request_id=request_id)
        except MarketError as exc:
            _service_error(form, exc)
        else:
            if request_id:  # a form sent twice: the first extension's own figure
                cost = LeaseExtension.objects.get(lease=lease, request_id=request_id).cost
            until = (f"until {lease.ends_at:%Y-%m-%d %H:%M:%S} UTC" if lease.ends_at
                     else f"to {lease.duration_seconds // 3600} h in all")
            messages.success(request, f"Lease #{lease.pk} extended by {hours} h {until}: "
                                      f"{usd(cost)} USD more held.")
            return redirect("leases-page")
    wallet = ledger.wallet(user_id=request.user.pk)
    return _page(request, "frontend/lease_extend.html",
                 {"lease": _summary(lease), "form": form, "available": usd(wallet.available)},
                 status=400 if form.is_bound else 200)
