from django.apps import AppConfig


class SettlementConfig(AppConfig):
    name = "settlement"
    default_auto_field = "django.db.models.BigAutoField"
