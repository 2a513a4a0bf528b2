"""Pages: home, accounts, the buyer's bidding UI and the provider portal."""

from django.contrib.auth import views as auth_views
from django.urls import path

from frontend import lease_views, login, portal_views, ssh_views, stripe_views, views
from marketplace import converters  # noqa: F401 (registers <gpuclass:…>)

urlpatterns = [
    path("", views.home, name="home"),
    path("signup/", views.signup, name="signup-page"),
    path("login/", login.LoginView.as_view(template_name="frontend/login.html",
                                                redirect_authenticated_user=True,
                                                next_page="wallet-page"),
         name="login"),
    path("admin/login/", login.admin_login, name="admin-login-limited"),
    path("logout/", auth_views.LogoutView.as_view(next_page="home"), name="logout"),
    path("wallet/", views.wallet, name="wallet-page"),
    path("wallet/dev-credit/", views.wallet_dev_credit, name="wallet-dev-credit"),
    path("wallet/ssh-keys/", ssh_views.ssh_key_add, name="ssh-key-add-page"),
    path("wallet/ssh-keys/<int:pk>/delete/", ssh_views.ssh_key_delete,
         name="ssh-key-delete-page"),
    path("wallet/topup/", stripe_views.wallet_topup, name="wallet-topup"),
    path("wallet/topup/<int:pk>/pay/", stripe_views.wallet_topup_pay, name="wallet-topup-pay"),
    path("wallet/topup/<int:pk>/return/", stripe_views.wallet_topup_return,
         name="wallet-topup-return"),
    path("markets/<gpuclass:slug>/", views.market, name="market"),
    path("orders/", views.my_orders, name="orders-page"),
    path("orders/<int:pk>/cancel/", views.order_cancel, name="order-cancel-page"),
    path("leases/", views.my_leases, name="leases-page"),
    path("leases/<int:pk>/stop/", lease_views.lease_stop, name="lease-stop-page"),
    path("leases/<int:pk>/extend/", lease_views.lease_extend, name="lease-extend-page"),
    path("auctions/", views.auction_list, name="auctions-page"),
    path("auctions/<int:pk>/", views.auction_detail, name="auction"),
    path("sealed-bids/<int:pk>/withdraw/", views.sealed_bid_withdraw,
         name="sealed-bid-withdraw-page"),
    path("provider/", portal_views.portal, name="portal"),
    path("provider/onboard/", portal_views.portal_onboard, name="portal-onboard"),
    path("provider/nodes/", portal_views.node_add, name="node-add"),
    path("provider/nodes/<int:pk>/", portal_views.node_detail, name="node"),
    path("provider/nodes/<int:pk>/maintenance/", portal_views.node_maintenance,
         name="node-maintenance-page"),
    path("provider/nodes/<int:pk>/maintenance/<int:window_id>/withdraw/",
         portal_views.node_maintenance_withdraw, name="node-maintenance-withdraw"),
    path("provider/nodes/<int:pk>/rotate-token/", portal_views.node_rotate_token,
         name="node-rotate-token-page"),
    path("provider/asks/", portal_views.ask_add, name="ask-add"),
    path("provider/auctions/", portal_views.auction_add, name="auction-add"),
    path("provider/payouts/address/", portal_views.payout_address, name="payout-address"),
    path("provider/payouts/connect/", portal_views.payout_connect, name="payout-connect"),
    path("provider/earnings/", portal_views.earnings, name="earnings"),
]
