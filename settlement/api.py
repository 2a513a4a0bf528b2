"""Wallet and ledger API: balances, holds, journal entries, and the development
credit (only when GPUMARKET_DEV_CREDIT is on)."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import generics, serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from settlement import services
from settlement.fields import UsdField
from settlement.models import Hold, JournalEntry, Posting


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


class DevCreditIn(serializers.Serializer):
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

    serializer_class = EntrySerializer

    def get_queryset(self):
        return (JournalEntry.objects.filter(postings__account__owner=self.request.user)
                .distinct().prefetch_related("postings__account").order_by("-pk"))
