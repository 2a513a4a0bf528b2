"""Wallet and ledger API: balances, holds, journal entries, and the development
credit (only when GPUMARKET_DEV_CREDIT is on)."""

from __future__ import annotations

from django.conf import settings
from django.http import JsonResponse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core.fields import StrictCharField, StrictInputSerializer
from core.pagination import Pagination, paginated
from settlement import services
from settlement.fields import UsdField
from settlement.models import Hold, JournalEntry, Payout, Posting


class HoldSerializer(serializers.ModelSerializer):
    original = UsdField(positive=False)
    amount = UsdField(positive=False)
    captured = UsdField(positive=False)
    released = UsdField(positive=False)

    class Meta:
        model = Hold
        fields = ["id", "status", "reference", "original", "amount", "captured", "released",
                  "created_at", "closed_at"]


class WalletSerializer(serializers.Serializer):
    available = UsdField(positive=False)
    held = UsdField(positive=False)
    earned = UsdField(positive=False)
    holds = HoldSerializer(many=True)


class WalletView(APIView):
    """Your balances (available, held, earned as a provider) and active holds."""

    @extend_schema(responses=WalletSerializer)
    def get(self, request):
        return Response(wallet_body(request.user))


def wallet_body(user) -> dict:
    w = services.wallet(user_id=user.pk)
    holds = Hold.objects.filter(buyer=user, status=Hold.Status.ACTIVE).order_by("pk")
    return WalletSerializer({"available": w.available, "held": w.held, "earned": w.earned,
                             "holds": holds}).data


class DevCreditIn(StrictInputSerializer):
    amount = UsdField()

    def validate_amount(self, value: int) -> int:
        if value > 1_000_000 * 1_000_000:
            raise serializers.ValidationError("at most 1000000 USD per credit")
        return value


class DevCreditView(APIView):
    """Development credit (demo and tests only; 404 unless GPUMARKET_DEV_CREDIT=1)."""

    @extend_schema(request=DevCreditIn, responses=WalletSerializer)
    def post(self, request):
        if not settings.GPUMARKET_DEV_CREDIT:
            return Response({"detail": "development credit is disabled on this server"},
                            status=404)
        data = DevCreditIn(data=request.data)
        data.is_valid(raise_exception=True)
        services.dev_credit(user_id=request.user.pk, amount=data.validated_data["amount"])
        return Response(wallet_body(request.user))


class PostingSerializer(serializers.ModelSerializer):
    account = serializers.CharField(source="account.kind")
    owner = serializers.IntegerField(source="account.owner_id", allow_null=True)
    amount = UsdField(positive=False)

    class Meta:
        model = Posting
        fields = ["account", "owner", "amount"]


class EntrySerializer(serializers.ModelSerializer):
    postings = PostingSerializer(many=True)

    class Meta:
        model = JournalEntry
        fields = ["id", "kind", "memo", "reference", "created_at", "postings"]


class LedgerEntries(generics.ListAPIView):
    """Journal entries that touch your accounts, newest first, with all their postings."""

    pagination_class = Pagination
    serializer_class = EntrySerializer

    def get_queryset(self):
        return (JournalEntry.objects.filter(postings__account__owner=self.request.user)
                .distinct().prefetch_related("postings__account").order_by("-pk"))


class HistoryRowSerializer(serializers.Serializer):
    """One journal entry of your wallet: what it changed and your balances after it."""

    id = serializers.IntegerField(source="entry_id", help_text="the journal entry's id")
    created_at = serializers.DateTimeField()
    kind = serializers.CharField(help_text="the journal entry's kind, e.g. hold_place")
    description = serializers.CharField(source="words", help_text='e.g. "hold placed"')
    reference = serializers.CharField(help_text='what caused it, e.g. "order:12"')
    available = UsdField(positive=False, help_text="change of the available balance")
    held = UsdField(positive=False, help_text="change of the held balance")
    owed = UsdField(positive=False, help_text="change of what you owe (negative: more)")
    available_after = UsdField(positive=False)
    held_after = UsdField(positive=False)
    owed_after = UsdField(positive=False)


class WalletHistoryView(APIView):
    """Your wallet's journal entries, newest first, with running balances; `?kind=`
    topup | credit | hold | charge | refund (anything else: 400 naming `kind`)."""

    pagination_class = Pagination
    query_filters = ("kind",)

    @extend_schema(responses=HistoryRowSerializer(many=True))
    def get(self, request):
        from settlement import selectors

        try:
            rows = selectors.wallet_history(user_id=request.user.pk,
                                            group=request.query_params.get("kind"))
        except selectors.UnknownKind as exc:
            raise serializers.ValidationError({"kind": [str(exc)]}) from None
        return paginated(self, request, rows, HistoryRowSerializer)


class TopUpIn(StrictInputSerializer):
    amount = UsdField()

    def validate_amount(self, value: int) -> int:
        from settlement.stripe_payments import MICROS_PER_CENT

        if value % MICROS_PER_CENT:
            raise serializers.ValidationError("must be whole cents, such as \"25.00\"")
        return value


class TopUpOut(serializers.Serializer):
    id = serializers.IntegerField()
    amount = UsdField()
    payment_intent = serializers.CharField(help_text="the Stripe PaymentIntent's id")
    client_secret = serializers.CharField(help_text="confirm it with Stripe.js")


class TopUpCreate(APIView):
    """Start a Stripe top-up; confirm the returned client_secret with Stripe.js. The
    wallet is credited when Stripe's `payment_intent.succeeded` webhook arrives."""

    @extend_schema(request=TopUpIn, responses={201: TopUpOut})
    def post(self, request):
        from settlement import stripe_payments

        data = TopUpIn(data=request.data)
        data.is_valid(raise_exception=True)
        cents = data.validated_data["amount"] // stripe_payments.MICROS_PER_CENT
        try:
            created = stripe_payments.topup_create(buyer_id=request.user.pk, amount_cents=cents)
        except stripe_payments.StripeDisabled as exc:
            return Response({"detail": str(exc)}, status=404)
        except ValueError as exc:
            return Response({"detail": f"amount: {exc}", "errors": {"amount": [str(exc)]}},
                            status=400)
        except stripe_payments.stripe.StripeError as exc:
            return Response({"detail": f"Stripe refused the payment: {exc.user_message or exc}"},
                            status=502)
        return Response({"id": created.topup.pk, "amount": data.initial_data["amount"],
                         "payment_intent": created.topup.payment_intent_id,
                         "client_secret": created.client_secret}, status=201)


@method_decorator(csrf_exempt, name="dispatch")
class StripeWebhook(View):
    """Stripe's webhook endpoint: the signature is checked on the raw body."""

    def post(self, request):
        from settlement import stripe_payments

        try:
            outcome = stripe_payments.webhook_handle(
                request.body, request.headers.get("Stripe-Signature"))
        except stripe_payments.StripeDisabled as exc:
            return JsonResponse({"detail": str(exc)}, status=404)
        except stripe_payments.WebhookRefused as exc:
            return JsonResponse({"detail": str(exc)}, status=400)
        return JsonResponse({"detail": outcome})

    def http_method_not_allowed(self, request, *args, **kwargs):
        return JsonResponse({"detail": f'method "{request.method}" not allowed: POST only'},
                            status=405, headers={"Allow": "POST"})


class PayoutSerializer(serializers.ModelSerializer):
    amount = UsdField(positive=False)

    class Meta:
        model = Payout
        fields = ["id", "status", "amount", "amount_cents", "transfer_id", "failure",
                  "created_at", "closed_at"]


class ConnectOut(serializers.Serializer):
    url = serializers.URLField(help_text="the Stripe-hosted onboarding link")


class ConnectOnboard(APIView):
    """Set up Stripe payouts: returns the Stripe-hosted onboarding link."""

    @extend_schema(request=None, responses=ConnectOut)
    def post(self, request):
        from settlement import stripe_payments, stripe_payouts

        back = request.build_absolute_uri("/")
        try:
            url = stripe_payouts.connect_onboard(user_id=request.user.pk, return_url=back,
                                                 refresh_url=back)
        except stripe_payments.StripeDisabled as exc:
            return Response({"detail": str(exc)}, status=404)
        except stripe_payments.stripe.StripeError as exc:
            return Response({"detail": f"Stripe refused: {exc.user_message or exc}"},
                            status=502)
        return Response({"url": url})


class PayoutListCreate(APIView):
    """Your payouts, newest first; POST pays out your earned balance in whole cents."""

    pagination_class = Pagination

    @extend_schema(responses=PayoutSerializer(many=True))
    def get(self, request):
        payouts = Payout.objects.filter(provider=request.user).order_by("-pk")
        return paginated(self, request, payouts, PayoutSerializer)

    @extend_schema(request=None, responses={201: PayoutSerializer})
    def post(self, request):
        from settlement import stripe_payments, stripe_payouts

        try:
            payout = stripe_payouts.payout_create(provider_id=request.user.pk)
        except stripe_payments.StripeDisabled as exc:
            return Response({"detail": str(exc)}, status=404)
        except stripe_payouts.PayoutRefused as exc:
            return Response({"detail": str(exc)}, status=409)
        return Response(PayoutSerializer(payout).data, status=201)


ZERO_ADDRESS = "0x" + "0" * 40


class ChainAddressIn(StrictInputSerializer):
    address = StrictCharField(max_length=42)

    def validate_address(self, value: str) -> str:
        # nobody holds the zero address's key: what is credited there is lost for good
        if value.lower() == ZERO_ADDRESS:
            raise serializers.ValidationError("must not be the zero address (nobody can "
                                              "spend from it)")
        return value


class ChainAddressOut(serializers.Serializer):
    address = serializers.CharField(help_text="checksummed (EIP-55)")


class ChainAddressView(APIView):
    """Register your chain address: where you deposit escrow from (buyers) and where your
    share is credited (providers)."""

    @extend_schema(request=ChainAddressIn, responses=ChainAddressOut)
    def post(self, request):
        from settlement import onchain

        data = ChainAddressIn(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            row = onchain.address_register(user_id=request.user.pk,
                                           address=data.validated_data["address"])
        except ValueError as exc:
            return Response({"detail": f"address: {exc}", "errors": {"address": [str(exc)]}},
                            status=400)
        return Response({"address": row.address})
