"""`gpumarket` bidding, orders, leases, wait and logs against a live server and its feed
(conftest.py). The runner's reports are real HTTP calls with the node's runner token."""

from __future__ import annotations

import json
from datetime import timedelta

from django.utils import timezone

from marketplace.auctions import close_auction, open_auction
from marketplace.models import Lease, Order
from settlement.models import Hold
from tests.factories import H100, UserFactory, ask, funded_buyer, registered_node
from tests.support.servers import AsgiServer
from tests.support.waiting import wait_until

from .conftest import Gm, Market

IMAGE = "gpumarket/busybox:local"


def _bid(gm, *extra: str) -> dict:
    done = gm("bid", H100, "--gpus", "1", "--price", "2.50", "--hours", "1", "--image", IMAGE,
              "--json", *extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _read_until(process, text: str, seen: list[str], timeout: float = 30) -> None:
    """Read the process's lines into `seen` until one contains `text`."""
    def found():
        line = process.stdout.readline()
        seen.append(line)
        return text in line or (line == "" and process.poll() is not None)
    wait_until(f"{text!r} from the CLI", found, timeout=timeout, every=0)
    assert text in seen[-1], seen


def test_markets_and_the_book_need_no_login(gm, market):
    listed = gm("markets", "--url", gm.url)
    assert listed.returncode == 0, listed.stderr
    assert any(line.startswith(H100) for line in listed.stdout.splitlines())
    book = gm("book", H100, "--url", gm.url)
    assert book.returncode == 0, book.stderr
    assert "  $1.500000  8 GPUs" in book.stdout.splitlines()
    as_json = json.loads(gm("book", H100, "--url", gm.url, "--json").stdout)
    assert as_json["asks"] == [{"price": "1.500000", "gpus": 8}]


def test_a_bid_that_fills_prints_its_lease_and_wait_follows_the_feed_to_running(gm, market):
    gm.login(market.buyer)
    placed = _bid(gm, "--port", "8888")
    [lease_id] = placed["leases"]
    assert placed["status"] == "filled"
    # --interval 600: a poll would come far too late, so the feed must carry the changes
    waiting = gm.popen("wait", str(lease_id), "--interval", "600")
    seen: list[str] = []
    _read_until(waiting, f"lease {lease_id}: pending", seen)
    market.run(lease_id, endpoints=[{"container_port": 8888, "host": "gpu.example",
                                     "host_port": 40124}])
    assert waiting.wait(timeout=30) == 0
    seen += waiting.stdout.read().splitlines()
    assert any(f"lease {lease_id}: running" in line for line in seen), seen
    assert "(the live feed" not in "".join(seen)  # it never fell back to polling
    shown = gm("lease", str(lease_id))
    assert shown.returncode == 0, shown.stderr
    assert f"lease {lease_id}: running" in shown.stdout
    assert "price:    $1.500000/GPU-h for 1 h" in shown.stdout
    assert "port 8888: gpu.example:40124" in shown.stdout.splitlines()
    listed = gm("leases")
    assert any(line.split()[:2] == [str(lease_id), "running"]
               for line in listed.stdout.splitlines()), listed.stdout


def test_wait_exits_1_naming_the_cause_when_the_lease_fails(gm, market):
    gm.login(market.buyer)
    [lease_id] = _bid(gm)["leases"]
    waiting = gm.popen("wait", str(lease_id), "--interval", "600")
    _read_until(waiting, f"lease {lease_id}: pending", [])
    market.runner(lease_id, "events", {"status": "failed", "cause": "image pull failed"})
    assert waiting.wait(timeout=30) == 1
    rest = waiting.stdout.read()
    assert f"gpumarket: lease {lease_id} failed before it ran" in rest
    assert "image pull failed" in rest


def test_a_resting_bid_is_listed_and_cancelled_and_its_hold_released(gm, market):
    gm.login(market.buyer)
    placed = json.loads(gm("bid", H100, "--gpus", "2", "--price", "1.25", "--hours", "3",
                           "--image", IMAGE, "--json").stdout)
    assert placed["status"] == "open" and placed["leases"] == []
    wallet = json.loads(gm("wallet", "--json").stdout)
    assert wallet["held"] == "7.500000"  # 1.25 × 2 GPUs × 3 h, exact
    listed = gm("orders", "--status", "open")
    assert listed.returncode == 0, listed.stderr
    [row] = [r for r in listed.stdout.splitlines() if r.startswith(str(placed["id"]))]
    assert row.split()[1:6] == ["bid", "open", H100, "$1.250000", "2/2"]
    cancelled = gm("cancel", str(placed["id"]))
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == f"order {placed['id']}: cancelled"
    assert "held:      $0.000000" in gm("wallet").stdout


def test_a_refused_bid_exits_1_in_one_line_naming_the_field_and_writes_nothing(gm, market):
    broke = UserFactory()
    gm.login(broke)
    before = (Order.objects.count(), Hold.objects.count(), Lease.objects.count())
    poor = gm("bid", H100, "--gpus", "1", "--price", "2.50", "--hours", "1", "--image", IMAGE)
    assert poor.returncode == 1
    [line] = poor.stderr.splitlines()
    assert line.startswith("gpumarket: ") and "Traceback" not in poor.stderr
    bad_image = gm("bid", H100, "--gpus", "1", "--price", "2.50", "--hours", "1",
                   "--image", "Not An Image")
    assert bad_image.returncode == 1
    [line] = bad_image.stderr.splitlines()
    assert line.startswith("gpumarket: image: must be a Docker image reference")
    private = gm("bid", H100, "--gpus", "1", "--price", "2.50", "--hours", "1",
                 "--image", "10.0.0.5:5000/x:1")
    assert private.returncode == 1
    [line] = private.stderr.splitlines()
    assert line.startswith("gpumarket: image: must not name a registry at a private or "
                           "loopback address (registry 10.0.0.5 is a private address)"), line
    unknown = gm("bid", "no-such-gpu", "--gpus", "1", "--price", "2.5", "--hours", "1",
                 "--image", IMAGE)
    assert unknown.returncode == 1 and len(unknown.stderr.splitlines()) == 1
    assert (Order.objects.count(), Hold.objects.count(), Lease.objects.count()) == before


def test_usage_errors_exit_2_before_anything_is_sent(gm, market):
    gm.login(funded_buyer(10))
    for args, says in (
        (("bid", H100, "--gpus", "1", "--price", "2.5x", "--hours", "1", "--image", IMAGE),
         "argument --price: '2.5x' is not an amount in USD"),
        (("bid", H100, "--gpus", "1", "--price", "0.0000001", "--hours", "1"),
         "argument --price"),
        (("bid", H100, "--gpus", "1", "--price", "2", "--hours", "1"),
         "give --template ID"),
        (("bid", H100, "--gpus", "1", "--price", "2", "--hours", "1", "--image", IMAGE,
          "--secret", "sk-live-123"), "--secret (the 1st one) is not NAME=VALUE"),
        (("lease", "abc"), "argument LEASE: 'abc' is not a whole number"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
    ):
        done = gm(*args)
        assert done.returncode == 2, (args, done.stderr)
        [line] = done.stderr.splitlines()
        assert says in line, line
        assert "sk-live-123" not in line
    assert Order.objects.count() == 1  # the ask of the market fixture only


def test_logs_prints_the_tail_and_follow_prints_each_new_line_once_until_the_end(gm, market):
    gm.login(market.buyer)
    [lease_id] = _bid(gm)["leases"]
    market.run(lease_id)
    market.runner(lease_id, "logs", {"tail": "epoch 1\nepoch 2\n"})
    once = gm("logs", str(lease_id))
    assert once.returncode == 0, once.stderr
    assert once.stdout == "epoch 1\nepoch 2\n"
    following = gm.popen("logs", str(lease_id), "--follow", "--interval", "0.2")
    seen: list[str] = []
    _read_until(following, "epoch 2", seen)
    market.runner(lease_id, "logs", {"tail": "epoch 2\nepoch 3\n"})
    _read_until(following, "epoch 3", seen)
    market.runner(lease_id, "events", {"status": "completed", "usage_seconds": 60})
    assert following.wait(timeout=30) == 0
    seen += following.stdout.read().splitlines(keepends=True)
    text = "".join(seen)
    assert [text.count(f"epoch {n}\n") for n in (1, 2, 3)] == [1, 1, 1], text
    assert f"lease {lease_id}: completed" in text


def test_another_buyers_lease_is_a_refusal_exit_1(gm, market):
    gm.login(market.buyer)
    [lease_id] = _bid(gm)["leases"]
    other = Gm(gm.url, gm.config.with_name("other.json"))
    other.login(UserFactory())
    for args in (("lease", str(lease_id)), ("logs", str(lease_id))):
        done = other(*args)
        assert done.returncode == 1, done.stderr
        assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_sealed_bid_is_placed_listed_and_counted_on_the_open_auction(gm):
    provider, node, _ = registered_node(name="auction-node")
    auction = open_auction(provider_id=provider.pk, node_id=node.pk, gpus=4,
                           reserve_price=1_000_000, duration_seconds=7200,
                           closes_at=timezone.now() + timedelta(hours=1), rule="uniform_price")
    gm.login(funded_buyer(100))
    done = gm("sealed-bid", str(auction.pk), "--price", "1.75", "--gpus", "2", "--image", IMAGE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("sealed bid ") and f"on auction {auction.pk}: active, 2 GPUs " \
        "at $1.750000/GPU-h" in done.stdout
    mine = json.loads(gm("--json", "sealed-bids").stdout)["results"]
    assert [(b["auction"], b["price"], b["gpus"]) for b in mine] == [(auction.pk, "1.750000", 2)]
    listed = gm("auctions", "--open", "--url", gm.url)
    [row] = [r for r in listed.stdout.splitlines() if r.startswith(str(auction.pk))]
    assert row.split()[1:8] == ["open", H100, "4", "$1.000000", "uniform_price", "2", "h"]
    assert row.split()[8] == "1"  # the bid count; never its price or bidder
    assert json.loads(gm("wallet", "--json").stdout)["held"] == "7.000000"  # 1.75 × 2 × 2 h


def test_wait_polls_when_the_server_has_no_websockets(tmp_path, transactional_db):
    with AsgiServer(ws="none") as live:
        gm = Gm(live.url, tmp_path / "config.json")
        provider, node, token = registered_node(name="poll-node")
        ask(provider, node, price=1_500_000, gpus=8)
        market = Market(provider, node, token, funded_buyer(100), live.url)
        gm.login(market.buyer)
        [lease_id] = _bid(gm)["leases"]
        waiting = gm.popen("wait", str(lease_id), "--interval", "0.2")
        try:
            seen: list[str] = []
            _read_until(waiting, "(the live feed is unavailable", seen)
            market.run(lease_id)
            assert waiting.wait(timeout=30) == 0
            assert f"lease {lease_id}: running" in waiting.stdout.read()
        finally:
            if waiting.poll() is None:
                waiting.kill()
            waiting.wait(timeout=10)
            waiting.stdout.close()


def test_a_bid_above_the_ask_prints_its_lease_at_the_fill_price(gm, market):
    gm.login(market.buyer)
    done = gm("bid", H100, "--gpus", "1", "--price", "2.60", "--hours", "1", "--image", IMAGE)
    assert done.returncode == 0, done.stderr
    [lease] = Lease.objects.filter(buyer=market.buyer)
    assert "bid at $2.600000/GPU-h" in done.stdout
    assert f"lease {lease.pk} at $1.500000/GPU-h" in done.stdout  # the ask's price


def test_a_won_sealed_bid_lists_what_it_pays_and_its_lease(gm):
    provider, node, _ = registered_node(name="won-node")
    auction = open_auction(provider_id=provider.pk, node_id=node.pk, gpus=2,
                           reserve_price=1_000_000, duration_seconds=3600,
                           closes_at=timezone.now() + timedelta(hours=1))
    gm.login(funded_buyer(100))
    placed = json.loads(gm("--json", "sealed-bid", str(auction.pk), "--price", "1.75",
                           "--image", IMAGE).stdout)
    assert placed["lease"] is None
    close_auction(auction_id=auction.pk, now=auction.closes_at)
    lease = Lease.objects.get()
    mine = gm("sealed-bids")
    assert mine.returncode == 0, mine.stderr
    assert (f"won 2 GPUs, paying $1.000000/GPU-h: lease {lease.pk} "
            f"(`gpumarket wait {lease.pk}`)") in mine.stdout
    assert json.loads(gm("--json", "sealed-bids").stdout)["results"][0]["lease"] == lease.pk
