"""Stripe money in: wallet top-ups with PaymentIntents.

Units: Stripe counts USD in cents; the ledger in micro-USD. A top-up of N cents
credits N × 10,000 micro-USD (DESIGN.md, "Units"). The conversion happens here and
nowhere else.

Flow (Stripe docs, "Accept a payment" with PaymentIntents, and "Webhooks: verify
signatures"): `topup_create` makes a PaymentIntent (our idempotency key per top-up,
never the library's random one) and returns its client secret for Stripe.js; the
wallet is credited ONLY by `webhook_handle` on a verified `payment_intent.succeeded`
event — signature checked on the raw body with the endpoint secret, timestamp within
the tolerance either way — once per event id (unique StripeEvent row) and once per
PaymentIntent (journal idempotency key), whatever the order and number of
deliveries. Refunds and disputes: settlement/stripe_refunds.py. No database lock is
held while Stripe is called.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import stripe
from django.conf import settings
from django.db import IntegrityError, transaction

from core import metrics
from settlement.models import Account, JournalEntry, StripeEvent, TopUp
from settlement.services import account, post_entry, wallet_credit_postings
from webhooks import events as webhooks

log = logging.getLogger("gpumarket.stripe")

MICROS_PER_CENT = 10_000
MIN_TOPUP_CENTS = 100            # 1 USD
MAX_TOPUP_CENTS = 1_000_000_00   # 1,000,000 USD


class StripeDisabled(Exception):
    """Stripe is not configured on this server (STRIPE_SECRET_KEY unset)."""


class WebhookRefused(Exception):
    """A webhook that is unsigned, badly signed, stale, or not JSON; changes nothing."""


def cents_to_micros(cents: int) -> int:
    """N cents → N × 10,000 micro-USD. Raises ValueError for a negative amount."""
    if cents < 0:
        raise ValueError("cents must not be negative")
    return cents * MICROS_PER_CENT


def micros_to_whole_cents(micros: int) -> tuple[int, int]:
    """Split micro-USD into (whole cents, sub-cent rest in micro-USD) for a payout."""
    if micros < 0:
        raise ValueError("micro-USD must not be negative")
    return divmod(micros, MICROS_PER_CENT)


def client() -> stripe.StripeClient:
    if not settings.STRIPE_SECRET_KEY:
        raise StripeDisabled("Stripe is not configured on this server")
    return stripe.StripeClient(settings.STRIPE_SECRET_KEY,
                               base_addresses={"api": settings.STRIPE_API_BASE})


@dataclass(frozen=True)
class NewTopUp:
    topup: TopUp
    client_secret: str  # for Stripe.js to confirm the payment in the browser


def topup_create(*, buyer_id: int, amount_cents: int) -> NewTopUp:
    """Start a top-up of `amount_cents` (100 … 100,000,000) with a PaymentIntent.

    Raises ValueError for an amount out of range, StripeDisabled, and stripe.StripeError
    when Stripe refuses (the TopUp row is then marked failed; no money moved).
    """
    if not MIN_TOPUP_CENTS <= amount_cents <= MAX_TOPUP_CENTS:
        raise ValueError(f"must be between {MIN_TOPUP_CENTS} and {MAX_TOPUP_CENTS} cents")
    stripe_client = client()
    topup = TopUp.objects.create(buyer_id=buyer_id, amount_cents=amount_cents)
    try:
        intent = stripe_client.v1.payment_intents.create(
            params={"amount": amount_cents, "currency": "usd",
                    "payment_method_types": ["card"],
                    "metadata": {"gpumarket_user_id": str(buyer_id),
                                 "gpumarket_topup_id": str(topup.pk)}},
            options={"idempotency_key": f"gpumarket-topup-{topup.pk}"},
        )
    except stripe.StripeError:
        topup.status = TopUp.Status.FAILED
        topup.save(update_fields=["status"])
        raise
    topup.payment_intent_id = intent.id
    topup.save(update_fields=["payment_intent_id"])
    return NewTopUp(topup=topup, client_secret=intent.client_secret)


# ---------------------------------------------------------------- paying in the page
#
# Stripe.js in the wallet page (frontend/stripe_views.py, static/frontend/stripe-topup.js):
# the card goes from the browser to Stripe only (Card Element, `confirmCardSetup` of a
# SetupIntent made for this top-up); the server then charges the top-up's PaymentIntent
# with that PaymentMethod, and the page completes a 3-D Secure step, if Stripe asks for
# one, with `confirmCardPayment(<the PaymentIntent's client secret>)`. The wallet is
# credited from what Stripe says — the verified webhook, or `topup_sync` retrieving the
# PaymentIntent with our secret key when the page comes back — never from the browser.


def topup_card_setup(*, topup: TopUp) -> str:
    """A SetupIntent for the card the buyer types into the page, tagged with the top-up;
    returns its client secret (for Stripe.js)."""
    intent = client().v1.setup_intents.create(
        params={"payment_method_types": ["card"], "usage": "on_session",
                "metadata": {"gpumarket_user_id": str(topup.buyer_id),
                             "gpumarket_topup_id": str(topup.pk)}},
        options={"idempotency_key": f"gpumarket-topup-setup-{topup.pk}"},
    )
    return intent.client_secret


def topup_pay(*, buyer_id: int, topup_id: int, setup_intent_id: str) -> str:
    """Charge the top-up's PaymentIntent with the card set up in the page; returns the
    PaymentIntent's status (`succeeded`, `requires_action`: the page authenticates with
    confirmCardPayment, `processing`, …). Raises TopUp.DoesNotExist (not this buyer's),
    ValueError (a SetupIntent that is not this top-up's, or not succeeded) and
    stripe.StripeError. A succeeded payment is credited at once (as by the webhook)."""
    topup = TopUp.objects.get(pk=topup_id, buyer_id=buyer_id)
    stripe_client = client()
    setup = stripe_client.v1.setup_intents.retrieve(setup_intent_id)
    meta = setup.metadata.to_dict() if setup.metadata else {}
    if meta.get("gpumarket_topup_id") != str(topup.pk) or not topup.payment_intent_id:
        raise ValueError("this card was not set up for this top-up")
    if setup.status != "succeeded" or not setup.payment_method:
        raise ValueError(f"the card is not set up (Stripe says {setup.status})")
    method = setup.payment_method if isinstance(setup.payment_method, str) \
        else setup.payment_method.id
    intent = stripe_client.v1.payment_intents.retrieve(topup.payment_intent_id)
    if intent.status in ("requires_payment_method", "requires_confirmation"):
        stripe_client.v1.payment_intents.update(
            intent.id, params={"payment_method": method},
            options={"idempotency_key": f"gpumarket-topup-{topup.pk}-pm-{setup.id}"})
        intent = stripe_client.v1.payment_intents.confirm(intent.id, options={
            "idempotency_key": f"gpumarket-topup-{topup.pk}-confirm-{setup.id}"})
    if intent.status == "succeeded":
        with transaction.atomic():
            _credit_intent(intent)
    return intent.status


def topup_sync(*, buyer_id: int, topup_id: int) -> tuple[str, TopUp]:
    """Ask Stripe (server-side, secret key) for the top-up's PaymentIntent and credit it
    if it succeeded and was not credited yet; returns (Stripe's status, the top-up).
    Raises TopUp.DoesNotExist and stripe.StripeError."""
    topup = TopUp.objects.get(pk=topup_id, buyer_id=buyer_id)
    if not topup.payment_intent_id:
        return "failed", topup
    intent = client().v1.payment_intents.retrieve(topup.payment_intent_id)
    if intent.status == "succeeded":
        with transaction.atomic():
            _credit_intent(intent)
        topup.refresh_from_db()
    return intent.status, topup


def verify(payload: bytes, signature: str | None) -> stripe.Event:
    """Check the `Stripe-Signature` header against the raw body (HMAC-SHA256 with the
    endpoint secret, timestamp within STRIPE_WEBHOOK_TOLERANCE_SECONDS of now, past or
    future). Raises WebhookRefused with the reason."""
    if not settings.STRIPE_WEBHOOK_SECRET:
        raise StripeDisabled("Stripe webhooks are not configured on this server")
    if not signature:
        raise WebhookRefused("missing Stripe-Signature header")
    tolerance = settings.STRIPE_WEBHOOK_TOLERANCE_SECONDS
    try:
        event = stripe.Webhook.construct_event(
            payload, signature, settings.STRIPE_WEBHOOK_SECRET, tolerance=tolerance)
    except stripe.SignatureVerificationError as exc:
        raise WebhookRefused(f"signature verification failed: {exc.user_message or exc}") \
            from None
    except ValueError:
        raise WebhookRefused("the body is not a Stripe event (invalid JSON)") from None
    # the library refuses only timestamps older than the tolerance (stripe-python 16)
    signed_at = _signed_at(signature)
    if signed_at > time.time() + tolerance:
        raise WebhookRefused(f"signature verification failed: timestamp {signed_at} is more "
                             f"than the tolerance ({tolerance} s) in the future")
    return event


def _signed_at(signature: str) -> int:
    """The `t=` of a Stripe-Signature header the library has verified (the first one, as
    the library reads it)."""
    for item in signature.split(","):
        key, _, value = item.partition("=")
        if key == "t":
            return int(value)
    raise WebhookRefused("signature verification failed: no timestamp")  # pragma: no cover


@metrics.counted_webhook
def webhook_handle(payload: bytes, signature: str | None) -> str:
    """Verify and apply one webhook delivery; returns what happened ("credited …",
    "duplicate event", "ignored …"). Raises WebhookRefused (nothing written)."""
    event = verify(payload, signature)
    try:
        with transaction.atomic():
            record = StripeEvent.objects.create(event_id=event.id, type=event.type)
            outcome = _apply(event)
            record.outcome = outcome[:200]
            record.save(update_fields=["outcome"])
    except IntegrityError:
        if StripeEvent.objects.filter(event_id=event.id).exists():
            return "duplicate event"
        raise
    log.info("stripe %s %s: %s", event.type, event.id, outcome)
    return outcome


def _apply(event: stripe.Event) -> str:
    from settlement import stripe_refunds  # it builds on this module

    if event.type in stripe_refunds.EVENT_TYPES:
        return stripe_refunds.apply(event)
    if event.type != "payment_intent.succeeded":
        return f"ignored {event.type}"
    return _credit_intent(event.data.object)


def _credit_intent(intent) -> str:
    """Credit a PaymentIntent that Stripe says succeeded (a verified webhook, or our own
    server-side retrieve): once per PaymentIntent, whichever path comes first. Runs in
    the caller's transaction; the top-up row is locked first, so the paths queue. A
    PaymentIntent of ours without a top-up row (only its metadata names the buyer) gets
    one, so that its refunds and disputes find it."""
    topup = TopUp.objects.select_for_update().filter(payment_intent_id=intent.id).first()
    user_id = None
    if topup is None:
        meta = intent.metadata.to_dict() if intent.metadata else {}
        try:
            user_id = int(meta["gpumarket_user_id"])
        except (KeyError, TypeError, ValueError):
            return f"ignored: payment intent {intent.id} is not a gpumarket top-up"
    # amount_received is what Stripe collected; localstripe omits it, and for a
    # succeeded PaymentIntent without partial capture it equals amount.
    received = getattr(intent, "amount_received", None)
    try:
        cents = int(intent.amount if received is None else received)
        cents_to_micros(cents)
    except (AttributeError, TypeError, ValueError):
        raise WebhookRefused(f"payment intent {intent.id} has no valid amount") from None
    if topup is None:
        made, _ = TopUp.objects.get_or_create(
            payment_intent_id=intent.id, defaults={"buyer_id": user_id, "amount_cents": cents})
        topup = TopUp.objects.select_for_update().get(pk=made.pk)
    return credit_topup(topup, cents)


def credit_topup(topup: TopUp, cents: int) -> str:
    """Credit `cents` received for `topup` (locked by the caller, in its transaction) to
    its buyer, once per PaymentIntent (journal idempotency key); marks it succeeded."""
    key = f"stripe-pi:{topup.payment_intent_id}"
    if JournalEntry.objects.filter(idempotency_key=key).exists():
        return f"payment intent {topup.payment_intent_id} already credited"
    micros = cents_to_micros(cents)
    user_id = topup.buyer_id
    post_entry(
        kind=JournalEntry.Kind.STRIPE_TOPUP,
        postings=wallet_credit_postings(user_id=user_id, amount=micros,
                                        source=account(Account.Kind.EXTERNAL_STRIPE)),
        memo=f"Stripe top-up {topup.payment_intent_id}", reference=f"user:{user_id}",
        idempotency_key=key,
    )
    topup.status = TopUp.Status.SUCCEEDED
    topup.credited = micros
    topup.save(update_fields=["status", "credited"])
    webhooks.emit(user_id, "topup.credited", {"topup": topup.pk, "amount_usd_micros": micros})
    return f"credited {micros} micro-USD to user {user_id}"
