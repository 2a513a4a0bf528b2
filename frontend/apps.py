from django.apps import AppConfig


class FrontendConfig(AppConfig):
    name = "frontend"

    def ready(self) -> None:
        # the live feed listens to the market's saves and publishes after commit
        from frontend import signals

        signals.connect()
