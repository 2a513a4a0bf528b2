"""Sign up and get an API token (programs use `Authorization: Token <key>`)."""

from __future__ import annotations

from django.contrib.auth import get_user_model, password_validation
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, serializers
from rest_framework.authtoken.models import Token
from rest_framework.response import Response
from rest_framework.views import APIView

from settlement.fields import StrictInputSerializer


class SignupIn(StrictInputSerializer):
    username = serializers.RegexField(r"^[A-Za-z0-9_.@+-]{3,150}$", max_length=150)
    password = serializers.CharField(min_length=8, max_length=128, write_only=True)
    email = serializers.EmailField(required=False, allow_blank=True, default="")

    def validate_username(self, value: str) -> str:
        if get_user_model().objects.filter(username__iexact=value).exists():
            raise serializers.ValidationError("is already taken")
        return value

    def validate_password(self, value: str) -> str:
        password_validation.validate_password(value)
        return value


class Signup(APIView):
    """Create an account; the answer carries its API token."""

    permission_classes = [permissions.AllowAny]
    authentication_classes: list = []

    @extend_schema(request=SignupIn)
    def post(self, request):
        data = SignupIn(data=request.data)
        data.is_valid(raise_exception=True)
        user = get_user_model().objects.create_user(**data.validated_data)
        token, _ = Token.objects.get_or_create(user=user)
        return Response({"id": user.pk, "username": user.username, "token": token.key},
                        status=201)


class Me(APIView):
    """Who the token or session belongs to."""

    def get(self, request):
        user = request.user
        return Response({"id": user.pk, "username": user.username,
                         "is_provider": hasattr(user, "provider")})
