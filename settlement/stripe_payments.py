"""Stripe money in: wallet top-ups with PaymentIntents.

Units: Stripe counts USD in cents; the ledger in micro-USD. A top-up of N cents
credits N × 10,000 micro-USD (DESIGN.md, "Units"). The conversion happens here and
nowhere else.

Flow (Stripe docs, "Accept a payment" with PaymentIntents, and "Webhooks: verify
signatures"): `topup_create` makes a PaymentIntent (our idempotency key per top-up,
never the library's random one) and returns its client secret for Stripe.js; the
wallet is credited ONLY by `webhook_handle` on a verified `payment_intent.succeeded`
event — signature checked on the raw body with the endpoint secret, timestamp within
the tolerance — once per event id (unique StripeEvent row) and once per
PaymentIntent (journal idempotency key), whatever the order and number of
deliveries. No database lock is held while Stripe is called.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import stripe
from django.conf import settings
from django.db import IntegrityError, transaction

from settlement.models import Account, JournalEntry, StripeEvent, TopUp
from settlement.services import account, post_entry

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


def verify(payload: bytes, signature: str | None) -> stripe.Event:
    """Check the `Stripe-Signature` header against the raw body (HMAC-SHA256 with the
    endpoint secret, timestamp within STRIPE_WEBHOOK_TOLERANCE_SECONDS). Raises
    WebhookRefused with the reason."""
    if not settings.STRIPE_WEBHOOK_SECRET:
        raise StripeDisabled("Stripe webhooks are not configured on this server")
    if not signature:
        raise WebhookRefused("missing Stripe-Signature header")
    try:
        return stripe.Webhook.construct_event(
            payload, signature, settings.STRIPE_WEBHOOK_SECRET,
            tolerance=settings.STRIPE_WEBHOOK_TOLERANCE_SECONDS,
        )
    except stripe.SignatureVerificationError as exc:
        raise WebhookRefused(f"signature verification failed: {exc.user_message or exc}") \
            from None
    except ValueError:
        raise WebhookRefused("the body is not a Stripe event (invalid JSON)") from None


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
    if event.type != "payment_intent.succeeded":
        return f"ignored {event.type}"
    intent = event.data.object
    key = f"stripe-pi:{intent.id}"
    if JournalEntry.objects.filter(idempotency_key=key).exists():
        return f"payment intent {intent.id} already credited"
    topup = TopUp.objects.select_for_update().filter(payment_intent_id=intent.id).first()
    user_id = topup.buyer_id if topup else None
    if user_id is None:
        meta = intent.metadata.to_dict() if intent.metadata else {}
        user_id = int(meta["gpumarket_user_id"]) if "gpumarket_user_id" in meta else None
    if user_id is None:
        return f"ignored: payment intent {intent.id} is not a gpumarket top-up"
    # amount_received is what Stripe collected; localstripe omits it, and for a
    # succeeded PaymentIntent without partial capture it equals amount.
    received = getattr(intent, "amount_received", None)
    try:
        micros = cents_to_micros(int(intent.amount if received is None else received))
    except (AttributeError, TypeError, ValueError):
        raise WebhookRefused(f"payment intent {intent.id} has no valid amount") from None
    post_entry(
        kind=JournalEntry.Kind.STRIPE_TOPUP,
        postings=[(account(Account.Kind.EXTERNAL_STRIPE), -micros),
                  (account(Account.Kind.BUYER_AVAILABLE, user_id), micros)],
        memo=f"Stripe top-up {intent.id}", reference=f"user:{user_id}", idempotency_key=key,
    )
    if topup:
        topup.status = TopUp.Status.SUCCEEDED
        topup.credited = micros
        topup.save(update_fields=["status", "credited"])
    return f"credited {micros} micro-USD to user {user_id}"
