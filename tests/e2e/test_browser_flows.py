"""Real-browser tests: headless Debian Chromium driven by Playwright (sync API) against
pytest-django's live server, in-process (so `settings` changes reach it).

The live server is Django's WSGI server: it has no websocket routes, so the pages run
their documented fallback (periodic fetches of the REST API or of the page itself);
they must still update without a reload, and log no JavaScript error. Each test saves
a screenshot of the page it checks under test-artifacts/.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connections
from django.utils import timezone

from tests.conftest import DATA, ROOT, require_or_skip
from tests.factories import ensure_catalog, funded_buyer, in_a_day, registered_node, with_ssh_key
from tests.settlement.test_stripe_topups import localstripe_url  # noqa: F401 (fixture)
from tests.support.servers import AsgiServer
from tests.support.waiting import wait_until

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = ROOT / "test-artifacts"
H100_DUMP = DATA / "nvidia-smi" / "h100-80gb-hbm3-x8.driver-535.183.01.txt"
PASSWORD = "a long test password 7"
MARKET = "h100-sxm-80gb"

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


class Browser:
    def __init__(self, page, errors: list[str]) -> None:
        self.page, self.errors = page, errors

    def shot(self, name: str) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def signup(self, base: str, username: str) -> None:
        page = self.page
        page.goto(f"{base}/signup/")
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password", exact=True).fill(PASSWORD)
        page.get_by_label("Password confirmation").fill(PASSWORD)
        page.get_by_label("Password confirmation").press("Enter")  # from the keyboard
        page.wait_for_url(re.compile(r"/wallet/$"))


@pytest.fixture
def browser(monkeypatch):
    if not Path(CHROMIUM).exists():
        require_or_skip("chromium not installed")
    try:
        from playwright.sync_api import sync_playwright
    except ModuleNotFoundError:
        require_or_skip("playwright not installed (the `test` extra)")
    # Playwright's sync API keeps an event loop in this thread; the test's own ORM calls
    # (setting the scene) are plain synchronous code between browser steps.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    errors: list[str] = []
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = chromium.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(15_000)
        page = context.new_page()
        page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}")
                if m.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
        try:
            yield Browser(page, errors)
        finally:
            page.goto("about:blank")  # stop the page's refresh requests before the server goes
            chromium.close()
            # the test's ORM calls ran inside Playwright's greenlet, on a connection of
            # their own (asgiref Local follows the context): close it here, in that context
            connections.close_all()


def test_provider_onboards_adds_node_and_sees_its_h100s(live_server, browser, tmp_path):
    from playwright.sync_api import expect

    ensure_catalog()
    page = browser.page
    browser.signup(live_server.url, "provider1")
    page.get_by_role("link", name="Provider portal").click()
    page.get_by_label("Provider name").fill("Acme GPUs")
    page.get_by_label("Provider name").press("Enter")
    expect(page.get_by_text("You are a provider now")).to_be_visible()
    page.get_by_label("Node name").fill("h100-box-1")
    page.get_by_role("button", name="Add node and show its runner token").click()

    token = page.get_by_label("Runner token", exact=True).input_value()
    assert token.startswith("gmr_")
    commands = page.locator("#runner-commands").inner_text()
    assert f"gpumarket-runner register --url {live_server.url} --token {token}" in commands
    assert "gpumarket-runner run" in commands
    browser.shot("browser-provider-token")

    page.get_by_role("link", name="Go to the node").click()
    expect(page.locator("#no-gpus")).to_be_visible()
    marker = page.evaluate("window.__noReload = Math.random()")

    done = subprocess.run(
        [sys.executable, "-m", "providers.runner", "register", "--url", live_server.url,
         "--token", token, "--simulate", str(H100_DUMP), "--state-dir", str(tmp_path / "r")],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr

    models = page.locator("td.gpu-model")
    expect(models).to_have_count(8)  # appears without a reload (the page refreshes itself)
    assert set(models.all_inner_texts()) == {"NVIDIA H100 80GB HBM3"}
    assert page.evaluate("window.__noReload") == marker
    expect(page.locator("#gpu-total")).to_have_text("8")
    expect(page.locator("#gpu-table .healthy")).to_have_count(8)
    browser.shot("browser-provider-node")
    # the token is shown once: the node page never shows it
    assert token not in page.content()
    assert browser.errors == []


def test_buyer_funds_bids_and_sees_fill_and_lease_without_reload(live_server, browser,
                                                                  settings):
    from playwright.sync_api import expect

    from marketplace import book, leases
    from marketplace.models import Lease

    settings.GPUMARKET_DEV_CREDIT = True
    provider, node, _ = registered_node()
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=2_000_000, gpus=2, available_until=in_a_day())
    page = browser.page
    browser.signup(live_server.url, "buyer1")

    page.get_by_label("Amount (USD)").fill("100")
    page.get_by_role("button", name="Add development credit").click()
    expect(page.locator("#wallet-available")).to_have_text("$100.00")

    page.goto(f"{live_server.url}/markets/{MARKET}/")
    expect(page.locator("#best-ask")).to_have_text("$2.00 /GPU-h")
    page.get_by_label("GPUs", exact=True).fill("4")
    page.get_by_label("Hours").fill("1")
    page.get_by_label("Limit price (USD per GPU-hour)").fill("2.50")
    page.get_by_label("GPUs per node (gang size)").fill("2")
    expect(page.locator("#hold-preview")).to_contain_text("= $10.00 USD")
    page.get_by_role("button", name="Place bid").click()
    expect(page.get_by_text("2 of 4 GPUs filled")).to_be_visible()
    first = Lease.objects.get(buyer__username="buyer1")
    expect(page.locator(f"#lease-{first.pk}")).to_contain_text("pending")
    expect(page.locator("#best-bid")).to_have_text("$2.50 /GPU-h")  # the rest of the bid stands
    expect(page.locator("#depth-rows")).to_contain_text("2.50")
    browser.shot("browser-buyer-depth")

    # From here on, no reload: the provider offers two more GPUs, the resting bid fills.
    marker = page.evaluate("window.__noReload = Math.random()")
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=2_200_000, gpus=2, available_until=in_a_day())
    second = Lease.objects.filter(buyer__username="buyer1").exclude(pk=first.pk).get()
    expect(page.locator(f"#lease-{second.pk}")).to_contain_text("pending")
    expect(page.locator("#my-orders")).to_contain_text("filled")
    expect(page.locator("#trade-rows tr")).to_have_count(2)
    expect(page.locator("#trade-rows tr").first).to_contain_text("2.50")  # the resting bid's price
    expect(page.locator("#best-bid")).to_have_text("—")

    leases.mark_running(lease=second, container_id="e2e0c0ffee42")
    expect(page.locator(f"#lease-{second.pk}")).to_contain_text("running")
    expect(page.locator(f"#lease-{second.pk}")).to_contain_text("e2e0c0ffee42")
    assert page.evaluate("window.__noReload") == marker
    browser.shot("browser-buyer-market")
    assert browser.errors == []


def test_buyer_picks_a_template_and_it_fills_only_on_the_node_that_can_run_it(
        live_server, browser, settings):
    from playwright.sync_api import expect

    from marketplace import book
    from marketplace.models import Lease

    settings.GPUMARKET_DEV_CREDIT = True
    provider, old, _ = registered_node(name="old-driver", cuda_version="12.2", own_uuids=True)
    _, new, _ = registered_node(name="new-driver", cuda_version="12.6", own_uuids=True,
                                user=provider)
    for node, price in ((old, 2_000_000), (new, 2_300_000)):
        book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                       price=price, gpus=2, available_until=in_a_day())
    page = browser.page
    browser.signup(live_server.url, "templ1")
    page.get_by_label("Amount (USD)").fill("100")
    page.get_by_role("button", name="Add development credit").click()
    with_ssh_key(get_user_model().objects.get(username="templ1"))  # the template has ssh

    page.goto(f"{live_server.url}/markets/{MARKET}/")
    row = page.locator('#templates tr[data-template="pytorch-jupyter"]')
    expect(row).to_contain_text("needs CUDA 12.4: 1 of 2 nodes with asks qualify")
    page.get_by_label("Template", exact=True).select_option("pytorch-jupyter")
    page.get_by_label("GPUs", exact=True).fill("2")
    page.get_by_label("Hours").fill("1")
    page.get_by_label("Limit price (USD per GPU-hour)").fill("2.50")
    page.get_by_label("Own image (or the template's, overridden)").fill(
        "gpumarket/busybox:local")
    page.get_by_role("button", name="Place bid").click()
    expect(page.get_by_text("2 of 2 GPUs filled")).to_be_visible()
    lease = Lease.objects.get(buyer__username="templ1")
    assert lease.node == new and lease.price == 2_300_000  # not the cheaper 12.2 node
    assert lease.template == "pytorch-jupyter" and lease.ports == [22, 8888]
    expect(row).to_contain_text("0 of 1 nodes")  # the 12.6 node's GPUs are leased now
    browser.shot("browser-template-bid")
    assert browser.errors == []


def _stripe_page(settings, live_server, stripe_url: str) -> None:
    import httpx

    secret = "whsec_gpumarket_browser"
    settings.STRIPE_SECRET_KEY = "sk_test_gpumarket"
    settings.STRIPE_PUBLISHABLE_KEY = "pk_test_gpumarket"
    settings.STRIPE_WEBHOOK_SECRET = secret
    settings.STRIPE_API_BASE = stripe_url
    settings.STRIPE_JS_URL = f"{stripe_url}/js.stripe.com/v3/"
    # localstripe also posts its signed webhooks to the live server: either path may
    # credit first, the other finds it done
    httpx.post(f"{stripe_url}/_config/webhooks/gpumarket",
               data={"url": f"{live_server.url}/api/v1/stripe/webhook/", "secret": secret}
               ).raise_for_status()


def _type_card(page, number: str) -> None:
    from playwright.sync_api import expect

    card = page.locator("#card-element")
    expect(card.locator("input")).to_have_count(5)  # the mock's Card Element
    for field, value in (("number", number), ("exp_month", "12"), ("exp_year", "34"),
                         ("cvc", "123"), ("postal_code", "10001")):
        card.get_by_placeholder(field, exact=True).fill(value)


@pytest.mark.parametrize(("card", "three_d_secure"), [("4242424242424242", False),
                                                      ("4000002500003155", True)])
def test_buyer_tops_up_with_a_test_card_in_the_page_and_sees_the_credit(
        live_server, browser, settings, localstripe_url, card, three_d_secure):  # noqa: F811
    """Stripe.js (localstripe's own mock of it, loaded from the STRIPE_JS_URL setting):
    the buyer types a test card into the Card Element and pays; a 3-D Secure card is
    authenticated in the page (confirmCardSetup, then confirmCardPayment with the
    PaymentIntent's client secret, each answered in the mock's dialog). The wallet shows
    the credit, which came from Stripe's answer to the server, once."""
    from playwright.sync_api import expect

    from settlement import services as ledger
    from settlement.models import JournalEntry, TopUp

    _stripe_page(settings, live_server, localstripe_url)
    page = browser.page
    browser.signup(live_server.url, "card-buyer")
    expect(page.locator("#wallet-available")).to_have_text("$0.00")

    page.get_by_label("Amount (USD)").fill("25.00")
    page.get_by_label("Amount (USD)").press("Enter")  # from the keyboard
    _type_card(page, card)
    assert ledger.wallet(user_id=TopUp.objects.get().buyer_id).available == 0
    browser.shot(f"browser-stripe-card-{card[-4:]}")

    page.get_by_role("button", name="Pay $25.00").click()
    if three_d_secure:  # the card's setup, then the payment itself
        for _ in range(2):
            page.get_by_role("button", name="Complete authentication").click()
    page.wait_for_url(re.compile(r"/wallet/$"))
    expect(page.get_by_text("Stripe confirmed your payment: $25.00 added.")).to_be_visible()
    expect(page.locator("#wallet-available")).to_have_text("$25.00")
    browser.shot(f"browser-stripe-topup-credited-{card[-4:]}")
    topup = TopUp.objects.get()
    assert topup.status == "succeeded" and topup.credited == 25_000_000
    time.sleep(1)  # localstripe's webhook, if it comes after the page's return: still once
    assert JournalEntry.objects.filter(kind="stripe_topup").count() == 1
    assert ledger.wallet(user_id=topup.buyer_id).available == 25_000_000
    assert browser.errors == []


def test_a_declined_card_is_shown_and_nothing_is_credited(live_server, browser, settings,
                                                          localstripe_url):  # noqa: F811
    from playwright.sync_api import expect

    from settlement import services as ledger
    from settlement.models import JournalEntry, TopUp

    _stripe_page(settings, live_server, localstripe_url)
    page = browser.page
    browser.signup(live_server.url, "declined-buyer")
    page.get_by_label("Amount (USD)").fill("25.00")
    page.get_by_role("button", name="Top up with Stripe").click()
    _type_card(page, "4000000000000002")
    page.get_by_role("button", name="Pay $25.00").click()
    expect(page.locator("#card-errors")).to_contain_text("declined")
    expect(page.get_by_role("button", name="Pay $25.00")).to_be_enabled()  # try another
    browser.shot("browser-stripe-declined")
    assert ledger.wallet(user_id=TopUp.objects.get().buyer_id).available == 0
    assert JournalEntry.objects.filter(kind="stripe_topup").count() == 0
    # the mock's fetch of a 402 is logged by Chromium as a failed resource load: that one
    # line is the declined card's answer, no error of the page's own
    assert [e for e in browser.errors if "status of 402" not in e] == []


def test_sealed_auction_counts_down_and_shows_its_result(live_server, browser):
    from playwright.sync_api import expect

    from marketplace import auctions

    provider, node, _ = registered_node()
    closes_at = timezone.now() + timedelta(seconds=8)
    lot = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                reserve_price=2_000_000, duration_seconds=3600,
                                closes_at=closes_at)
    rival = funded_buyer(1000)
    auctions.place_sealed_bid(bidder_id=rival.pk, auction_id=lot.pk, price=4_250_000)

    page = browser.page
    browser.signup(live_server.url, "bidder1")
    from django.contrib.auth import get_user_model

    from settlement import services as ledger
    me = get_user_model().objects.get(username="bidder1")
    ledger.dev_credit(user_id=me.pk, amount=500_000_000)

    page.goto(f"{live_server.url}/auctions/{lot.pk}/")
    expect(page.locator("#bid-count")).to_have_text("1")
    first = page.locator("#countdown").inner_text()
    page.wait_for_timeout(1300)
    assert page.locator("#countdown").inner_text() != first  # it counts down
    assert re.fullmatch(r"00:0\d", page.locator("#countdown").inner_text())

    page.get_by_label("Your price (USD per GPU-hour)").fill("3.00")
    page.get_by_label("Your price (USD per GPU-hour)").press("Enter")
    expect(page.locator("#my-bid")).to_contain_text("$3.00")
    expect(page.locator("#bid-count")).to_have_text("2")
    assert "4.25" not in page.content()  # the rival's sealed bid is never shown
    marker = page.evaluate("window.__noReload = Math.random()")

    expect(page.locator("#countdown")).to_have_text("closing…", timeout=15_000)
    wait_until("the auction's closing time", lambda: timezone.now() >= closes_at, timeout=30,
               every=0.1)
    auctions.close_auction(auction_id=lot.pk)  # None if the worker closed it first

    expect(page.locator("#clearing-price")).to_have_text("$3.00 /GPU-h")  # second price
    expect(page.locator("#auction-status")).to_have_text("closed")
    expect(page.locator("#my-bid")).to_contain_text("lost")
    expect(page.locator("#auction-result")).to_contain_text("8")
    assert "4.25" not in page.content()
    assert page.evaluate("window.__noReload") == marker
    browser.shot("browser-auction-result")
    assert browser.errors == []


@pytest.fixture
def asgi_server(settings, transactional_db):
    """The real ASGI application (pages + websockets) under uvicorn, in a thread."""
    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
    with AsgiServer() as server:
        yield server.url


def test_market_page_follows_the_websocket_feed(asgi_server, browser):
    """Over ASGI the pages use the live feed itself (no polling): a trade made elsewhere
    shows in the depth, the trades and my leases without a reload."""
    from playwright.sync_api import expect

    from marketplace import book
    from marketplace.models import Lease

    provider, node, _ = registered_node()
    page = browser.page
    browser.signup(asgi_server, "wsbuyer")
    from django.contrib.auth import get_user_model

    from settlement import services as ledger
    me = get_user_model().objects.get(username="wsbuyer")
    ledger.dev_credit(user_id=me.pk, amount=100_000_000)
    book.place_bid(buyer_id=me.pk, market_slug=MARKET, price=2_400_000, gpus=2,
                   duration_seconds=3600)

    page.goto(f"{asgi_server}/markets/{MARKET}/")
    expect(page.locator("#live-status")).to_have_text("live")  # both sockets open
    expect(page.locator("#best-bid")).to_have_text("$2.40 /GPU-h")
    marker = page.evaluate("window.__noReload = Math.random()")

    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=2_000_000, gpus=2, available_until=in_a_day())
    lease = Lease.objects.get(buyer=me)
    expect(page.locator("#trade-rows tr")).to_have_count(1)
    expect(page.locator("#trade-rows")).to_contain_text("2.40")
    expect(page.locator("#best-bid")).to_have_text("—")
    expect(page.locator(f"#lease-{lease.pk}")).to_contain_text("pending")
    expect(page.locator("#live-status")).to_have_text("live")
    assert page.evaluate("window.__noReload") == marker
    browser.shot("browser-market-websocket")
    assert browser.errors == []
