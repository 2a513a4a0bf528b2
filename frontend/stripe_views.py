"""Wallet top-up with Stripe, completed in the page (Stripe.js).

Settings: STRIPE_SECRET_KEY (Stripe on), STRIPE_PUBLISHABLE_KEY (`pk_…`, for Stripe.js),
STRIPE_JS_URL (default https://js.stripe.com/v3/; tests point it at localstripe's mock,
`http://127.0.0.1:<port>/js.stripe.com/v3/`). Without Stripe configured no script is
loaded at all.

1. POST /wallet/topup/ (amount): a TopUp with its PaymentIntent, and a SetupIntent for
   the card (settlement.stripe_payments); the page mounts the Card Element.
2. In the page (static/frontend/stripe-topup.js): `stripe.confirmCardSetup(<setup
   secret>, {payment_method: {card}})` — the card goes to Stripe only; then POST
   /wallet/topup/<id>/pay/ {setup_intent}: the server charges the PaymentIntent with that
   card; if Stripe asks for authentication the page calls `stripe.confirmCardPayment(<the
   PaymentIntent's client secret>)`.
3. GET /wallet/topup/<id>/return/: the server retrieves the PaymentIntent from Stripe and
   credits the wallet if Stripe says `succeeded` (once; the webhook may have done it
   already), then shows the wallet with its new balance. The browser's word is never
   taken for a payment.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib import messages
from django.http import Http404, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from frontend import forms as f
from frontend.templatetags import gpumarket as money
from frontend.views import _page, _wallet_context, member, usd

DEFAULT_STRIPE_JS = "https://js.stripe.com/v3/"


def stripe_js_url() -> str | None:
    """Where Stripe.js is loaded from; None when Stripe is not configured."""
    if not (settings.STRIPE_SECRET_KEY and getattr(settings, "STRIPE_PUBLISHABLE_KEY", "")):
        return None
    return getattr(settings, "STRIPE_JS_URL", "") or DEFAULT_STRIPE_JS


def _stripe_or_404():
    from settlement import stripe_payments

    if not settings.STRIPE_SECRET_KEY:
        raise Http404("Stripe is not configured on this server")
    return stripe_payments


@member
@require_POST
def wallet_topup(request):
    sp = _stripe_or_404()
    form = f.TopUpForm(request.POST)
    if form.is_valid():
        cents = form.cleaned_data["amount"] // sp.MICROS_PER_CENT
        try:
            created = sp.topup_create(buyer_id=request.user.pk, amount_cents=cents)
            setup_secret = sp.topup_card_setup(topup=created.topup) if stripe_js_url() \
                else None
        except ValueError as exc:
            form.add_error("amount", str(exc))
        except sp.stripe.StripeError as exc:
            form.add_error(None, f"Stripe refused the payment: {exc.user_message or exc}")
        else:
            topup = created.topup
            context = _wallet_context(request, client_secret=created.client_secret)
            context["payment"] = None if setup_secret is None else {
                "topup": topup.pk, "amount": usd(topup.amount_cents * sp.MICROS_PER_CENT),
                "publishable_key": settings.STRIPE_PUBLISHABLE_KEY,
                "setup_secret": setup_secret, "payment_secret": created.client_secret,
                "pay_url": reverse("wallet-topup-pay", args=[topup.pk]),
                "return_url": reverse("wallet-topup-return", args=[topup.pk]),
                "stripe_js": stripe_js_url(),
            }
            return _page(request, "frontend/wallet.html", context, status=201)
    return _page(request, "frontend/wallet.html", _wallet_context(request, topup_form=form),
                 status=400)


@member
@require_POST
def wallet_topup_pay(request, pk: int):
    """JSON: {"setup_intent": "seti_…"} → {"status": <the PaymentIntent's status>}."""
    sp = _stripe_or_404()
    try:
        body = json.loads(request.body or b"{}")
        setup_intent = body["setup_intent"]
        if not isinstance(setup_intent, str) or not setup_intent.startswith("seti_"):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"error": 'send {"setup_intent": "seti_…"}'}, status=400)
    try:
        status = sp.topup_pay(buyer_id=request.user.pk, topup_id=pk,
                              setup_intent_id=setup_intent)
    except sp.TopUp.DoesNotExist:
        raise Http404("no such top-up of yours") from None
    except ValueError as exc:
        return JsonResponse({"error": str(exc)}, status=400)
    except sp.stripe.StripeError as exc:
        return JsonResponse({"error": f"Stripe refused the payment: "
                                      f"{exc.user_message or exc}"}, status=402)
    return JsonResponse({"status": status})


@member
@require_GET
def wallet_topup_return(request, pk: int):
    sp = _stripe_or_404()
    try:
        status, topup = sp.topup_sync(buyer_id=request.user.pk, topup_id=pk)
    except sp.TopUp.DoesNotExist:
        raise Http404("no such top-up of yours") from None
    except sp.stripe.StripeError as exc:
        messages.error(request, f"Could not ask Stripe about the payment: "
                                f"{exc.user_message or exc}")
        return redirect("wallet-page")
    amount = money.usd(topup.amount_cents * sp.MICROS_PER_CENT)
    if status == "succeeded":
        messages.success(request, f"Stripe confirmed your payment: {amount} added.")
    elif status == "processing":
        messages.info(request, f"Stripe is processing your payment of {amount}; the "
                               "wallet is credited when it succeeds.")
    else:
        messages.error(request, f"The payment of {amount} was not completed (Stripe "
                                f"says {status}); your wallet was not credited.")
    return redirect("wallet-page")
