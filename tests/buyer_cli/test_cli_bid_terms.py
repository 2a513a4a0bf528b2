"""The bid terms of the API in the CLI (buyer_cli/bidding.py): `bid` and `sealed-bid` send
--node, --notice-signal, --stop-grace, --no-failover, --min-reliability and the checkpoint
(--checkpoint-url/-endpoint/-key-id, the secret key from a file or
$GPUMARKET_CHECKPOINT_SECRET_KEY, against moto's S3 server with credentials enforced); a
bad value is exit 1 naming the field, nothing written; a checkpoint without its secret key
is a usage error (exit 2) before anything is sent."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from marketplace import sealing
from marketplace.auctions import open_auction
from marketplace.models import Lease, Order, SealedBid
from settlement.models import Hold
from tests.factories import H100, ask, funded_buyer, registered_node

IMAGE = "gpumarket/busybox:local"
BID = ("bid", H100, "--gpus", "1", "--price", "2.50", "--hours", "1", "--image", IMAGE)


@pytest.fixture(autouse=True)
def _private_endpoints_allowed(settings):
    settings.GPUMARKET_CHECKPOINT_ALLOW_PRIVATE = True  # moto listens on 127.0.0.1


@pytest.fixture
def store(s3_server, tmp_path):
    bucket = s3_server.bucket("ckpt-cli")
    key_file = tmp_path / "secret-key"
    key_file.write_text(s3_server.secret_access_key + "\n")
    return s3_server, f"s3://{bucket}/runs", key_file


def _checkpoint_args(server, url: str) -> tuple[str, ...]:
    return ("--checkpoint-url", url, "--checkpoint-endpoint", server.endpoint_url,
            "--checkpoint-key-id", server.access_key_id)


def test_bid_sends_every_term_and_the_secret_key_from_a_file(gm, market, store):
    server, url, key_file = store
    other, other_node, _ = registered_node(name="cheaper-node", own_uuids=True)
    ask(other, other_node, price=500_000, gpus=8)
    gm.login(market.buyer)
    done = gm(*BID, "--node", str(market.node.pk), "--notice-signal", "SIGUSR2",
              "--stop-grace", "30", "--no-failover", "--min-reliability", "0.9",
              *_checkpoint_args(server, url), "--checkpoint-secret-key-file", str(key_file))
    assert done.returncode == 0, done.stderr
    order = Order.objects.get(side="bid")
    assert (order.node_id, order.notice_signal, order.stop_grace_seconds, order.failover,
            str(order.min_reliability)) == (market.node.pk, "SIGUSR2", 30, False, "0.900")
    assert Lease.objects.get().node_id == market.node.pk  # not the cheaper node
    assert order.checkpoint["url"] == url
    secret = server.secret_access_key
    assert sealing.unseal(order.checkpoint_sealed)["secret_access_key"] == secret
    assert secret not in done.stdout + done.stderr


def test_sealed_bid_takes_the_terms_and_the_secret_key_from_the_environment(gm, store):
    server, url, _ = store
    provider, node, _ = registered_node(name="auction-node")
    auction = open_auction(provider_id=provider.pk, node_id=node.pk, gpus=4,
                           reserve_price=1_000_000, duration_seconds=3600,
                           closes_at=timezone.now() + timedelta(hours=1))
    gm.login(funded_buyer(100))
    done = gm("sealed-bid", str(auction.pk), "--price", "1.75", "--image", IMAGE,
              "--notice-signal", "SIGINT", "--stop-grace", "0", "--no-failover",
              *_checkpoint_args(server, url),
              GPUMARKET_CHECKPOINT_SECRET_KEY=server.secret_access_key)
    assert done.returncode == 0, done.stderr
    bid = SealedBid.objects.get()
    assert (bid.notice_signal, bid.stop_grace_seconds, bid.failover) == ("SIGINT", 0, False)
    assert bid.checkpoint["url"] == url


@pytest.mark.parametrize(("args", "says"), [
    (("--notice-signal", "SIGKILL"), "notice_signal: "),
    (("--stop-grace", "301"), "stop_grace_seconds: "),
    (("--min-reliability", "1.5"), "min_reliability: "),
    (("--node", "999999"), "node: "),
])
def test_a_bad_term_exits_1_naming_the_field(gm, market, args, says):
    gm.login(market.buyer)
    done = gm(*BID, *args)
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"gpumarket: {says}"), line
    assert Order.objects.filter(side="bid").count() == 0 and not Hold.objects.exists()


def test_wrong_checkpoint_credentials_exit_1_naming_checkpoint(gm, market, store, tmp_path):
    server, url, _ = store
    wrong = tmp_path / "wrong"
    wrong.write_text("wrong-secret-key-never-printed")
    gm.login(market.buyer)
    done = gm(*BID, *_checkpoint_args(server, url), "--checkpoint-secret-key-file", str(wrong))
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("gpumarket: checkpoint"), line
    assert "wrong-secret-key-never-printed" not in line
    assert Order.objects.filter(side="bid").count() == 0 and not Hold.objects.exists()


def test_checkpoint_usage_errors_exit_2_before_anything_is_sent(gm, market, tmp_path):
    gm.login(market.buyer)
    for args, says in (
        (("--checkpoint-url", "s3://bucket/p", "--checkpoint-key-id", "AKIA"),
         "--checkpoint-url needs the store's secret key"),
        (("--checkpoint-key-id", "AKIA"), "need --checkpoint-url"),
        (("--checkpoint-url", "s3://bucket/p", "--checkpoint-secret-key-file",
          str(tmp_path / "missing")), "--checkpoint-secret-key-file"),
        (("--stop-grace", "-1"), "argument --stop-grace"),
    ):
        done = gm(*BID, *args)
        assert done.returncode == 2, (args, done.stderr)
        [line] = done.stderr.splitlines()
        assert says in line, line
    assert Order.objects.filter(side="bid").count() == 0


def test_bid_prefer_cached_image_is_sent_and_kept_on_the_order(gm, market):
    gm.login(market.buyer)
    done = gm(*BID, "--prefer-cached-image", "--json")
    assert done.returncode == 0, done.stderr
    assert Order.objects.get(side="bid").prefer_cached_image is True

