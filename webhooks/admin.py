"""Webhooks in the admin, read-only: endpoints (never their secret), events, deliveries."""

from django.contrib import admin

from webhooks.models import WebhookDelivery, WebhookEndpoint, WebhookEvent


class ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ReadOnly):
    list_display = ["id", "user", "url", "enabled", "created_at"]
    fields = ["user", "url", "events", "enabled", "created_at"]  # never secret_sealed


@admin.register(WebhookEvent)
class WebhookEventAdmin(ReadOnly):
    list_display = ["id", "user", "type", "created_at"]
    list_filter = ["type"]


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnly):
    list_display = ["event", "endpoint", "status", "attempts", "last_status_code",
                    "latency_ms", "next_attempt_at"]
    list_filter = ["status"]
