"""Sign up and get an API token (programs use `Authorization: Token <key>` or
`Authorization: Bearer <key>`). Each signup and each POST /api/v1/auth/token/ issues a new
token, shown once (marketplace/api_tokens.py: stored hashed, expiring; list and revoke
them at /api/v1/auth/tokens/)."""

from __future__ import annotations

from django.contrib.auth import authenticate, get_user_model, password_validation
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core.fields import StrictCharField, StrictInputSerializer
from marketplace import api_tokens
from marketplace.api.parsers import StrictJSONParser
from marketplace.api.throttles import LoginAddressThrottle, SignupAddressThrottle, begin_login
from marketplace.auth_backends import release_connection


class SignupIn(StrictInputSerializer):
    username = serializers.RegexField(
        r"^[A-Za-z0-9_.@+-]{3,150}$", max_length=150,
        error_messages={"invalid": "must be 3 to 150 characters: letters, digits and "
                        "_ . @ + -"},
        help_text="3 to 150 characters: letters, digits and _ . @ + -")
    password = StrictCharField(max_length=128, write_only=True, trim_whitespace=False,
                               help_text="checked by the server's password validators "
                               "(AUTH_PASSWORD_VALIDATORS): at least 10 characters, not a "
                               "common password, not all digits, not like the username")
    email = serializers.EmailField(required=False, allow_blank=True, default="")

    def validate_username(self, value: str) -> str:
        if get_user_model().objects.filter(username__iexact=value).exists():
            raise serializers.ValidationError("is already taken")
        return value

    def validate(self, attrs):
        attrs = super().validate(attrs)
        # with the user it would be (the similarity validator compares username and email)
        user = get_user_model()(username=attrs["username"], email=attrs.get("email", ""))
        try:
            password_validation.validate_password(attrs["password"], user)
        except DjangoValidationError as exc:
            raise serializers.ValidationError({"password": exc.messages}) from None
        return attrs


class SignupOut(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
    token = serializers.CharField(help_text="the API token: Authorization: Bearer <token>; "
                                  "shown once, only its hash is stored")
    expires_at = serializers.DateTimeField(help_text="when the token expires (as "
                                           "POST /auth/token/ answers it)")
    token_expires_at = serializers.DateTimeField(help_text="the same as expires_at (the "
                                                 "older name, kept)")


class Signup(APIView):
    """Create an account; the answer carries its API token. At most GPUMARKET_SIGNUP_RATE
    per client address (429 with Retry-After beyond)."""

    permission_classes = [permissions.AllowAny]
    authentication_classes: list = []
    throttle_classes = [SignupAddressThrottle]

    @extend_schema(request=SignupIn, responses={201: SignupOut})
    def post(self, request):
        data = SignupIn(data=request.data)
        data.is_valid(raise_exception=True)
        release_connection()  # create_user hashes the password first: with no connection
        user = get_user_model().objects.create_user(**data.validated_data)
        issued = api_tokens.issue(user=user, name="signup")
        return Response({"id": user.pk, "username": user.username, "token": issued.key,
                         "expires_at": issued.token.expires_at,
                         "token_expires_at": issued.token.expires_at}, status=201)


class TokenIn(StrictInputSerializer):
    username = StrictCharField(max_length=150)
    password = StrictCharField(max_length=128, trim_whitespace=False, write_only=True)
    name = StrictCharField(max_length=100, required=False, default="", allow_blank=True,
                           help_text="a label for the new token, shown in /auth/tokens/")


class TokenOut(serializers.Serializer):
    id = serializers.IntegerField(help_text="the token's id in /api/v1/auth/tokens/")
    token = serializers.CharField(help_text="shown once: only its hash is stored")
    expires_at = serializers.DateTimeField()


class TokenLogin(APIView):
    """A new API token, for your username and password (JSON only); valid
    GPUMARKET_API_TOKEN_TTL_DAYS days, shown once. Wrong credentials are a 400 whose
    `detail` says so; no field is named (which one was wrong is not told).
    429 with Retry-After beyond GPUMARKET_LOGIN_RATE attempts per client address, or
    after GPUMARKET_LOGIN_LOCKOUT_FAILURES failures for one username (throttles.py)."""

    permission_classes: list = []
    authentication_classes: list = []
    throttle_classes = [LoginAddressThrottle]
    parser_classes = [StrictJSONParser]

    @extend_schema(request=TokenIn, responses={200: TokenOut})
    def post(self, request):
        data = TokenIn(data=request.data)
        data.is_valid(raise_exception=True)
        attempt = begin_login(data.validated_data["username"])
        user = authenticate(request=request, username=data.validated_data["username"],
                            password=data.validated_data["password"])
        if user is None:
            raise serializers.ValidationError("unable to log in with these credentials")
        attempt.succeeded()
        issued = api_tokens.issue(user=user, name=data.validated_data["name"])
        return Response({"id": issued.token.pk, "token": issued.key,
                         "expires_at": issued.token.expires_at})


class MeOut(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
    is_provider = serializers.BooleanField()


class Me(APIView):
    """Who the token or session belongs to."""

    @extend_schema(responses=MeOut)
    def get(self, request):
        user = request.user
        return Response({"id": user.pk, "username": user.username,
                         "is_provider": hasattr(user, "provider")})
