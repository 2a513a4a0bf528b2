"""Alert rules and their incidents in the admin, read-only."""

from django.contrib import admin

from alerts.models import AlertIncident, AlertRule


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    list_display = ["id", "user", "name", "expression", "enabled", "created_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(AlertIncident)
class AlertIncidentAdmin(admin.ModelAdmin):
    list_display = ["rule", "subject", "fired_at", "resolved_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
