"""Stripe money out: provider payouts through Stripe Connect.

Onboarding (Stripe docs, "Connect: Express accounts"): `connect_onboard` creates the
provider's connected account once and returns an account link URL for Stripe's
hosted onboarding.

Payout (Stripe docs, "Create a transfer"; "Idempotent requests"): three steps, the
Stripe call outside any database lock:
1. reserve — in one transaction, lock the provider's earned account, take the whole
   cents of the balance (the sub-cent rest stays), create the Payout and move that
   amount earned → payout-in-flight;
2. transfer — `Transfer.create` to the connected account with OUR idempotency key
   `gpumarket-payout-<id>` (never the library's random one), so a retry after a crash or
   a timeout can never pay twice;
3. settle — success: in-flight → Stripe (external), payout `paid`; a definitive refusal
   from Stripe: in-flight → earned (the balances are exactly as before), payout
   `failed` with Stripe's message. A network error leaves the payout `pending` for
   `payout_retry`, which repeats step 2 with the same key.
"""

from __future__ import annotations

import logging

import stripe
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from settlement.models import Account, ConnectedAccount, JournalEntry, Payout
from settlement.services import SettlementError, account, post_entry
from settlement.stripe_payments import MICROS_PER_CENT, client
from webhooks import events as webhooks

log = logging.getLogger("gpumarket.payouts")

Kind = Account.Kind


class PayoutRefused(SettlementError):
    """Nothing to pay, or no connected account; the message says which."""


def connect_onboard(*, user_id: int, return_url: str, refresh_url: str) -> str:
    """Create the provider's Express connected account (once) and return a fresh account
    link URL for Stripe's hosted onboarding. Raises StripeDisabled, stripe.StripeError."""
    stripe_client = client()
    connected = ConnectedAccount.objects.filter(user_id=user_id).first()
    if connected is None:
        acct = stripe_client.v1.accounts.create(
            params={"type": "express", "metadata": {"gpumarket_user_id": str(user_id)}},
            options={"idempotency_key": f"gpumarket-connect-{user_id}"},
        )
        connected, _ = ConnectedAccount.objects.get_or_create(
            user_id=user_id, defaults={"stripe_account_id": acct.id})
    link = stripe_client.v1.account_links.create(params={
        "account": connected.stripe_account_id, "type": "account_onboarding",
        "return_url": return_url, "refresh_url": refresh_url,
    })
    return link.url


def connect_status(*, user_id: int) -> str:
    """The provider's Connect account as Stripe reports it (Stripe docs, "The Account
    object": details_submitted, payouts_enabled): "not set up" (no account), "onboarding
    not finished", "payouts enabled", "payouts not enabled yet" (details submitted, Stripe
    still verifying), or "Stripe did not answer" (an error: the page still works).
    Raises StripeDisabled."""
    client()  # refuse early when Stripe is off
    connected = ConnectedAccount.objects.filter(user_id=user_id).first()
    if connected is None:
        return "not set up"
    # a page waits on this read: a short timeout, no retries (it changes nothing)
    quick = stripe.StripeClient(settings.STRIPE_SECRET_KEY,
                                base_addresses={"api": settings.STRIPE_API_BASE},
                                max_network_retries=0,
                                http_client=stripe.new_default_http_client(timeout=5))
    try:
        acct = quick.v1.accounts.retrieve(connected.stripe_account_id)
    except stripe.StripeError as exc:
        log.warning("connect status of user %s: %s", user_id, exc.__class__.__name__)
        return "Stripe did not answer"
    if not getattr(acct, "details_submitted", False):
        return "onboarding not finished"
    return "payouts enabled" if getattr(acct, "payouts_enabled", False) \
        else "payouts not enabled yet"


def payout_create(*, provider_id: int) -> Payout:
    """Pay out the provider's earned balance in whole cents. Raises PayoutRefused (nothing
    written) when there is no connected account or less than one cent; StripeDisabled."""
    client()  # refuse early when Stripe is off
    connected = ConnectedAccount.objects.filter(user_id=provider_id).first()
    if connected is None:
        raise PayoutRefused("set up payouts first: no Stripe connected account")
    with transaction.atomic():
        earned = Account.objects.select_for_update().filter(
            kind=Kind.PROVIDER_EARNED, owner_id=provider_id).first()
        cents = (earned.balance if earned else 0) // MICROS_PER_CENT
        if cents <= 0:
            raise PayoutRefused("nothing to pay out: less than one cent earned")
        payout = Payout.objects.create(provider_id=provider_id, amount_cents=cents,
                                       amount=cents * MICROS_PER_CENT)
        post_entry(kind=JournalEntry.Kind.PAYOUT_RESERVE,
                   postings=[(earned, -payout.amount),
                             (account(Kind.PROVIDER_PAYOUT_PENDING, provider_id),
                              payout.amount)],
                   reference=f"payout:{payout.pk}")
    return _transfer(payout, connected.stripe_account_id)


def payout_retry(*, payout_id: int) -> Payout:
    """Repeat the transfer of a payout still `pending` (same idempotency key)."""
    payout = Payout.objects.get(pk=payout_id)
    if payout.status != Payout.Status.PENDING:
        return payout
    connected = ConnectedAccount.objects.get(user_id=payout.provider_id)
    return _transfer(payout, connected.stripe_account_id)


def _transfer(payout: Payout, destination: str) -> Payout:
    try:
        transfer = client().v1.transfers.create(
            params={"amount": payout.amount_cents, "currency": "usd",
                    "destination": destination,
                    "metadata": {"gpumarket_payout_id": str(payout.pk)}},
            options={"idempotency_key": payout.idempotency_key},
        )
    except stripe.APIConnectionError:
        log.warning("payout %s: Stripe unreachable; left pending for retry", payout.pk)
        return payout
    except stripe.StripeError as exc:
        return _close(payout, failure=str(exc.user_message or exc))
    return _close(payout, transfer_id=transfer.id)


def _close(payout: Payout, *, transfer_id: str = "", failure: str = "") -> Payout:
    with transaction.atomic():
        payout = Payout.objects.select_for_update().get(pk=payout.pk)
        if payout.status != Payout.Status.PENDING:
            return payout  # a concurrent retry closed it
        in_flight = account(Kind.PROVIDER_PAYOUT_PENDING, payout.provider_id)
        if failure:
            post_entry(kind=JournalEntry.Kind.PAYOUT_REVERSED,
                       postings=[(in_flight, -payout.amount),
                                 (account(Kind.PROVIDER_EARNED, payout.provider_id),
                                  payout.amount)],
                       memo=failure, reference=f"payout:{payout.pk}")
            payout.status, payout.failure = Payout.Status.FAILED, failure[:300]
        else:
            post_entry(kind=JournalEntry.Kind.PAYOUT_SENT,
                       postings=[(in_flight, -payout.amount),
                                 (account(Kind.EXTERNAL_STRIPE), payout.amount)],
                       memo=f"transfer {transfer_id}", reference=f"payout:{payout.pk}",
                       idempotency_key=payout.idempotency_key)
            payout.status, payout.transfer_id = Payout.Status.PAID, transfer_id
            webhooks.emit(payout.provider_id, "payout.paid", {
                "payout": payout.pk, "amount_usd_micros": payout.amount})
        payout.closed_at = timezone.now()
        payout.save(update_fields=["status", "failure", "transfer_id", "closed_at"])
    log.info("payout %s: %s", payout.pk, payout.status)
    return payout
