"""The whole buyer path in a real browser (headless Chromium, Playwright) with real parts
behind it: sign up, credit, an SSH key on the wallet page, the `cuda-ssh` template with its
image overridden to the local sshd image in the market's bid form, a GPU won from an ask
whose node is served by a real runner process (Docker, a user-defined bridge network,
ports published on 127.0.0.1), the exact `ssh -p … root@…` command on the leases page, a
real SSH login (paramiko) with that command's host and port, Stop… with its confirmation,
the exact charge on the page, and the wallet and the ledger agreeing with it (85/15)."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model

from frontend.templatetags.gpumarket import usd as money
from frontend.views import usd
from marketplace import book
from marketplace.models import Lease
from settlement import services as ledger
from settlement.checks import first_violation
from settlement.money import lease_cost
from settlement.split import split
from tests.conftest import DATA
from tests.e2e.test_browser_flows import browser  # noqa: F401 (fixture)
from tests.factories import in_a_day, registered_node
from tests.support.containers import inspected
from tests.support.ssh import key_pair, port_open, ssh_login
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e, pytest.mark.docker]
TITAN_DUMP = DATA / "nvidia-smi" / "titan-v-x1.driver-560.35.03.txt"  # CUDA 12.6 >= 12.4
MARKET = "titan-v"
ASK_PRICE = 2_400_000  # micro-USD per GPU-hour: the trade price (the ask rests)


def test_a_buyer_picks_cuda_ssh_wins_a_gpu_logs_in_over_ssh_and_stops_it(
        live_server, browser, settings, docker_client, ssh_image, lease_network,  # noqa: F811
        runner_factory):
    from playwright.sync_api import expect

    settings.GPUMARKET_DEV_CREDIT = True
    provider, node, token = registered_node(TITAN_DUMP, name="titan-ssh")
    node.gpus.all().delete()  # the runner registers them itself
    runner = runner_factory(live_server.url, token, TITAN_DUMP)
    assert runner.register().returncode == 0, runner.output()
    runner.start(network=lease_network, extra=("--public-host", "127.0.0.1"))
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=ASK_PRICE, gpus=1, available_until=in_a_day())

    page = browser.page
    browser.signup(live_server.url, "sshbuyer")
    page.get_by_label("Amount (USD)").fill("20")
    page.get_by_role("button", name="Add development credit").click()
    expect(page.locator("#wallet-available")).to_have_text("$20.00")
    laptop = key_pair(comment="me@laptop")
    page.get_by_label("Public key").fill(laptop.public_line)
    page.get_by_role("button", name="Add SSH key").click()
    expect(page.locator("#ssh-keys")).to_contain_text("SHA256:")

    page.goto(f"{live_server.url}/markets/{MARKET}/")
    page.get_by_label("Template", exact=True).select_option("cuda-ssh")
    page.get_by_label("GPUs", exact=True).fill("1")
    page.get_by_label("Hours").fill("1")
    page.get_by_label("Limit price (USD per GPU-hour)").fill("2.60")
    page.get_by_label("Own image (or the template's, overridden)").fill(ssh_image)
    page.get_by_role("button", name="Place bid").click()
    expect(page.get_by_text("1 of 1 GPU filled")).to_be_visible()  # ("1 GPU", issue 14)
    buyer = get_user_model().objects.get(username="sshbuyer")
    lease = Lease.objects.get(buyer=buyer)
    assert (lease.template, lease.image, lease.ssh, lease.price) == \
        ("cuda-ssh", ssh_image, True, ASK_PRICE)

    page.goto(f"{live_server.url}/leases/")
    row = page.locator(f"#lease-{lease.pk}")
    expect(row).to_contain_text("template cuda-ssh")
    command = row.locator(".ssh-command code")
    expect(command).to_have_text(re.compile(r"ssh -p \d+ root@\S+"), timeout=60_000)
    m = re.fullmatch(r"ssh -p (\d+) root@(\S+)", command.inner_text())
    port, host = int(m.group(1)), m.group(2)
    assert host == "127.0.0.1"
    expect(row).to_contain_text(f"port 22 (ssh) → {host}:{port}")
    assert wait_until("the buyer's key to log in over the printed command",
                      lambda: ssh_login(port, laptop, host=host), timeout=30) is True
    assert ssh_login(port, key_pair(), host=host) is False  # only the account's key
    browser.shot("buyer-path-ssh-command")

    page.get_by_role("link", name="Stop…").click()
    expect(page.get_by_text("Charged if stopped now")).to_be_visible()
    page.get_by_role("button", name=f"Stop lease #{lease.pk} now").click()
    page.wait_for_url(re.compile(r"/leases/$"))
    ended = Lease.objects.get(pk=lease.pk)
    seconds = int((ended.ended_at - ended.started_at).total_seconds())
    cost = lease_cost(ASK_PRICE, 1, seconds)
    parts = split(cost, 1500)
    assert ended.status == "cancelled" and ended.cause == "stopped by the buyer"
    assert (ended.cost, ended.provider_amount, ended.platform_fee) == \
        (cost, parts.provider, parts.platform_fee)
    expect(page.get_by_text(
        f"charged {usd(cost)} USD for {seconds} s (provider {usd(parts.provider)}, "
        f"platform {usd(parts.platform_fee)})")).to_be_visible()
    browser.shot("buyer-path-stopped")

    assert ledger.wallet(user_id=buyer.pk) == ledger.Wallet(
        available=20_000_000 - cost, held=0, earned=0)
    assert ledger.wallet(user_id=provider.pk).earned == parts.provider
    page.goto(f"{live_server.url}/wallet/")
    expect(page.locator("#wallet-available")).to_have_text(money(20_000_000 - cost))
    assert first_violation() is None

    # by its id: other test databases on this engine have a lease of the same number
    wait_until("the runner to remove the container",
               lambda: not inspected(docker_client, id=ended.container_id), timeout=30)
    assert not port_open(port)
    assert browser.errors == []
