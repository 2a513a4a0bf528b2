"""drf-spectacular extensions: how the OpenAPI schema (/api/schema/) describes our own
authentication classes and money fields. Imported by marketplace/urls.py, so they are
registered before any schema is generated."""

from __future__ import annotations

from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerFieldExtension,
)
from drf_spectacular.plumbing import build_basic_type, build_bearer_security_scheme_object
from drf_spectacular.types import OpenApiTypes

_API_TOKEN = ("a user's API token (`gmu_…`; signup and POST /api/v1/auth/token/ show it "
              "once; it expires after GPUMARKET_API_TOKEN_TTL_DAYS, list and revoke them at "
              "/api/v1/auth/tokens/)")


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """The user's API token as `Authorization: Token <key>`."""

    target_class = "marketplace.api.auth.ApiTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": f"{_API_TOKEN}, as `Token <key>`"}


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """The same API token as `Authorization: Bearer <key>`."""

    target_class = "marketplace.api.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        definition = build_bearer_security_scheme_object(header_name="Authorization",
                                                         token_prefix="Bearer")
        definition["description"] = _API_TOKEN
        return definition


class RunnerTokenScheme(OpenApiAuthenticationExtension):
    """A node's runner token (`gmr_…`) as `Authorization: Bearer <runner token>`; only the
    /api/v1/runner/ endpoints take it (docs/RUNNER_PROTOCOL.md)."""

    target_class = "providers.auth.RunnerTokenAuthentication"
    name = "runnerToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "gmr_…",
                "description": "a node's runner token (POST /api/v1/nodes/ shows it once)"}


class UsdFieldSchema(OpenApiSerializerFieldExtension):
    """settlement.fields.UsdField: a decimal USD string with at most 6 places."""

    target_class = "settlement.fields.UsdField"

    def map_serializer_field(self, auto_schema, direction):
        schema = build_basic_type(OpenApiTypes.STR)
        schema["pattern"] = r"^(0|[1-9][0-9]{0,12})(\.[0-9]{1,6})?$"
        schema["example"] = "2.49"
        schema["description"] = "decimal USD string, at most 6 decimal places"
        return schema
