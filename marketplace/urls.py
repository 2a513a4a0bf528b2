"""URL map: pages at /, the REST API under /api/v1/, its schema and docs, admin. Any
other path under /api/ (any method, no CSRF check: it writes nothing) is a JSON 404, and
Django's own 400/403/404/500 answers are JSON under /api/ (marketplace/api/errors.py)."""

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from alerts import api as alerts_api
from marketplace import converters  # noqa: F401 (registers <gpuclass:…>)
from marketplace.api import (  # noqa: F401
    accounts,
    errors,
    market_data,
    nodes,
    reliability,
    runner,
    runner_checkpoints,
    runner_images,
    schema,
    ssh_keys,
    tokens,
)
from marketplace.api import maintenance as maintenance_api
from marketplace.api import telemetry as telemetry_api
from marketplace.api import views as market
from marketplace.api.errors import api_not_found
from marketplace.metrics_view import metrics_view
from providers import api as providers_api
from settlement import api as settlement_api
from webhooks import api as webhooks_api

api_v1 = [
    path("signup/", accounts.Signup.as_view(), name="signup"),
    path("auth/token/", accounts.TokenLogin.as_view(), name="auth-token"),
    path("auth/tokens/", tokens.TokenList.as_view(), name="auth-tokens"),
    path("auth/tokens/<int:pk>/", tokens.TokenRevoke.as_view(), name="auth-token-revoke"),
    path("ws-tickets/", tokens.WsTicketCreate.as_view(), name="ws-tickets"),
    path("me/", accounts.Me.as_view(), name="me"),
    path("ssh-keys/", ssh_keys.SshKeyList.as_view(), name="ssh-keys"),
    path("ssh-keys/<int:pk>/", ssh_keys.SshKeyDelete.as_view(), name="ssh-key-delete"),
    path("gpu-classes/", market.GpuClassList.as_view(), name="gpu-classes"),
    path("gpu-classes/<gpuclass:slug>/", market.GpuClassDetail.as_view(), name="gpu-class-detail"),
    path("gpu-classes/<gpuclass:slug>/book/", market.OrderBookDepth.as_view(), name="order-book"),
    path("gpu-classes/<gpuclass:slug>/offers/", market_data.MarketOffers.as_view(),
         name="market-offers"),
    path("gpu-classes/<gpuclass:slug>/history/", market_data.MarketHistory.as_view(),
         name="market-history"),
    path("fills/", market.RecentFills.as_view(), name="fills"),
    path("templates/", market.TemplateList.as_view(), name="templates"),
    path("orders/", market.OrderListCreate.as_view(), name="orders"),
    path("orders/<int:pk>/", market.OrderDetail.as_view(), name="order-detail"),
    path("orders/<int:pk>/cancel/", market.OrderCancel.as_view(), name="order-cancel"),
    path("auctions/", market.AuctionListCreate.as_view(), name="auctions"),
    path("auctions/<int:pk>/", market.AuctionDetail.as_view(), name="auction-detail"),
    path("auctions/<int:pk>/bids/", market.SealedBidCreate.as_view(), name="sealed-bid-create"),
    path("sealed-bids/", market.MySealedBids.as_view(), name="sealed-bids"),
    path("sealed-bids/<int:pk>/withdraw/", market.SealedBidWithdraw.as_view(),
         name="sealed-bid-withdraw"),
    path("leases/", market.LeaseList.as_view(), name="leases"),
    path("leases/<int:pk>/", market.LeaseDetail.as_view(), name="lease-detail"),
    path("leases/<int:pk>/logs/", runner.LeaseLogs.as_view(), name="lease-logs"),
    path("leases/<int:pk>/metrics/", telemetry_api.LeaseMetrics.as_view(), name="lease-metrics"),
    path("leases/<int:pk>/stop/", market.LeaseStop.as_view(), name="lease-stop"),
    path("leases/<int:pk>/extend/", market.LeaseExtend.as_view(), name="lease-extend"),
    path("providers/", providers_api.ProviderOnboard.as_view(), name="providers"),
    path("nodes/", providers_api.NodeList.as_view(), name="nodes"),
    path("nodes/<int:pk>/reliability/", reliability.NodeReliability.as_view(),
         name="node-reliability"),
    path("nodes/<int:pk>/", providers_api.NodeDetail.as_view(), name="node-detail"),
    path("nodes/<int:pk>/retire/", nodes.NodeRetire.as_view(), name="node-retire"),
    path("nodes/<int:pk>/rotate-token/", providers_api.NodeRotateToken.as_view(),
         name="node-rotate-token"),
    path("nodes/<int:pk>/maintenance/", maintenance_api.NodeMaintenance.as_view(),
         name="node-maintenance"),
    path("nodes/<int:pk>/maintenance/<int:window_id>/",
         maintenance_api.NodeMaintenanceWindow.as_view(), name="node-maintenance-window"),
    path("wallet/", settlement_api.WalletView.as_view(), name="wallet"),
    path("wallet/history/", settlement_api.WalletHistoryView.as_view(), name="wallet-history"),
    path("wallet/dev-credit/", settlement_api.DevCreditView.as_view(), name="dev-credit"),
    path("wallet/topups/", settlement_api.TopUpCreate.as_view(), name="topups"),
    path("payouts/", settlement_api.PayoutListCreate.as_view(), name="payouts"),
    path("payouts/connect/", settlement_api.ConnectOnboard.as_view(), name="payouts-connect"),
    path("chain/address/", settlement_api.ChainAddressView.as_view(), name="chain-address"),
    path("stripe/webhook/", settlement_api.StripeWebhook.as_view(), name="stripe-webhook"),
    path("ledger/entries/", settlement_api.LedgerEntries.as_view(), name="ledger-entries"),
    path("webhooks/", webhooks_api.EndpointList.as_view(), name="webhooks"),
    path("webhooks/<int:pk>/", webhooks_api.EndpointDetail.as_view(), name="webhook-detail"),
    path("webhooks/<int:pk>/deliveries/", webhooks_api.EndpointDeliveries.as_view(),
         name="webhook-deliveries"),
    path("webhooks/<int:pk>/test/", webhooks_api.EndpointTest.as_view(), name="webhook-test"),
    path("alert-rules/", alerts_api.AlertRuleList.as_view(), name="alert-rules"),
    path("alert-rules/<int:pk>/", alerts_api.AlertRuleDetail.as_view(), name="alert-rule-detail"),
    path("runner/inventory/", providers_api.RunnerInventory.as_view(), name="runner-inventory"),
    path("runner/heartbeat/", telemetry_api.RunnerHeartbeat.as_view(), name="runner-heartbeat"),
    path("runner/benchmarks/", providers_api.RunnerBenchmarks.as_view(),
         name="runner-benchmarks"),
    path("runner/leases/", runner.RunnerLeases.as_view(), name="runner-leases"),
    path("runner/images/", runner_images.RunnerImages.as_view(), name="runner-images"),
    path("runner/leases/<int:pk>/events/", runner.RunnerLeaseEvent.as_view(),
         name="runner-lease-event"),
    path("runner/leases/<int:pk>/logs/", runner.RunnerLeaseLogs.as_view(),
         name="runner-lease-logs"),
    path("runner/leases/<int:pk>/checkpoints/", runner_checkpoints.RunnerCheckpointReport
         .as_view(), name="runner-lease-checkpoints"),
]

urlpatterns = [
    path("metrics", metrics_view, name="metrics"),  # Prometheus (docs/METRICS.md)
    path("", include("frontend.urls")),  # also /admin/login/, rate-limited (frontend/login.py)
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    re_path(r"^api(/.*)?$", api_not_found),
    path("admin/", admin.site.urls),
]

handler400 = errors.bad_request
handler403 = errors.permission_denied
handler404 = errors.page_not_found
handler500 = errors.server_error
