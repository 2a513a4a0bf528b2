from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from marketplace.logs import install_uvicorn_redaction

        install_uvicorn_redaction()  # no credential of a URL in uvicorn's log lines

        from marketplace.health import on_gpu_health_changed, on_units_changed
        from providers.signals import gpu_health_changed, units_changed

        gpu_health_changed.connect(on_gpu_health_changed,
                                   dispatch_uid="marketplace.health.on_gpu_health_changed")
        units_changed.connect(on_units_changed,
                              dispatch_uid="marketplace.health.on_units_changed")

        from marketplace.matching import on_node_cuda_changed, on_node_runtime_changed
        from providers.signals import node_cuda_changed, node_runtime_changed

        node_cuda_changed.connect(on_node_cuda_changed,
                                  dispatch_uid="marketplace.matching.on_node_cuda_changed")
        node_runtime_changed.connect(
            on_node_runtime_changed, dispatch_uid="marketplace.matching.on_node_runtime_changed")

        from marketplace import runner_push  # lease changes → the node's runner, on commit

        runner_push.connect()

        from marketplace import checks as market_checks
        from settlement import checks

        checks.register(market_checks.holds_match_open_bids_and_leases)

        from marketplace.selectors import sealed_hold_ids
        from settlement import sealed

        sealed.register(sealed_hold_ids)  # the admin masks these holds' amounts
        checks.register(market_checks.provider_earnings_match_settled_leases)
        checks.register(market_checks.chains_are_sound)
