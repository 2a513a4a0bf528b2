"""Issue 10, item 2: the admin never reveals or narrows a sealed bid's price or quantity
(nor a hold, journal entry or wallet balance that implies it) before close, for any staff
user, superusers included; after close a losing bid stays sealed except through the
superusers' reveal view, which records who looked. Real admin HTTP requests (Django's
test client) against PostgreSQL."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from marketplace import auctions
from marketplace.admin import SealedBidAdmin
from marketplace.models import SealedBid, SealedBidAudit
from settlement.models import Account, Hold, JournalEntry
from tests.factories import RTX4090_DUMP, UserFactory, funded_buyer, registered_node

pytestmark = pytest.mark.django_db

ALICE_PRICE, ALICE_GPUS = 3_141_592, 5  # alice's hold: 15,707,960 for one hour
BOB_PRICE, BOB_GPUS = 2_718_281, 3  # bob's hold: 8,154,843
VIEW = ["view_sealedbid", "view_hold", "view_journalentry", "view_posting", "view_account",
        "view_auction", "view_sealedbidaudit"]


def _spellings(micros: int) -> list[str]:
    usd = f"{micros / 1_000_000:.6f}"
    return [str(micros), f"{micros:,}", usd, usd.rstrip("0")]


SECRETS = [s for n in (ALICE_PRICE, BOB_PRICE, ALICE_PRICE * ALICE_GPUS, BOB_PRICE * BOB_GPUS,
                       100_000_000 - ALICE_PRICE * ALICE_GPUS,
                       100_000_000 - BOB_PRICE * BOB_GPUS) for s in _spellings(n)]


def _assert_nothing_sealed_in(response, where: str) -> None:
    text = response.content.decode()
    for spelling in SECRETS:
        assert spelling not in text, f"{spelling} (a sealed figure) leaks via {where}"


@pytest.fixture
def lot():
    provider, node, _ = registered_node(RTX4090_DUMP)
    auction = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                    reserve_price=1_000_000, duration_seconds=3600,
                                    rule="uniform_price",
                                    closes_at=timezone.now() + timedelta(minutes=5))
    alice, bob = funded_buyer(100), funded_buyer(100)
    a = auctions.place_sealed_bid(bidder_id=alice.pk, auction_id=auction.pk,
                                  price=ALICE_PRICE, gpus=ALICE_GPUS, template="vllm",
                                  env={"SEALED_ENV": "hush-hush"})
    b = auctions.place_sealed_bid(bidder_id=bob.pk, auction_id=auction.pk,
                                  price=BOB_PRICE, gpus=BOB_GPUS)
    return auction, a, b


@pytest.fixture(params=["staff with view permissions", "superuser"])
def operator(request, client):
    if request.param == "superuser":
        user = UserFactory(is_staff=True, is_superuser=True)
    else:
        user = UserFactory(is_staff=True)
        user.user_permissions.set(Permission.objects.filter(codename__in=VIEW))
    client.force_login(user)
    return client


def _url(model: str, view: str = "changelist", *args) -> str:
    app = "settlement" if model in {"hold", "journalentry", "account"} else "marketplace"
    return reverse(f"admin:{app}_{model}_{view}", args=args)


def _page(response) -> tuple[int, bytes]:
    """Status and body, the body without its CSRF tokens (new on every answer)."""
    return response.status_code, re.sub(rb'name="csrfmiddlewaretoken" value="[^"]*"', b"",
                                        response.content)


def _cells(html: str, column: str) -> list[str]:
    return re.findall(rf'<td class="field-{column}[^"]*">(.*?)</td>', html)


def test_query_string_lookups_on_secret_figures_are_refused_alike(operator, lot):
    """The attack: ?price__gte=N, N bisected. Every such lookup (and any on the holds,
    entries and balances that imply the price) is a 400 whose answer does not depend on
    N or on the price."""
    probes = {
        "sealedbid": ["price__gte", "price__lt", "price__in", "price__range", "gpus__gte",
                      "min_gpus__lte", "gpus", "price", "image__startswith"],
        "auction": ["bids__price__gte", "bids__gpus__gte"],
        "hold": ["original__gte", "amount__lt", "released__gte", "captured__gte"],
        "journalentry": ["postings__amount__gte", "hold__original__gte", "memo__contains"],
        "account": ["balance__gte", "balance__lt", "owner__holds__amount__gte"],
    }
    for model, lookups in probes.items():
        for lookup in lookups:
            answers = set()
            for n in (0, BOB_PRICE, ALICE_PRICE, ALICE_PRICE + 1, 10**12):
                value = f"{n},{n + 1}" if lookup.endswith(("__in", "__range")) else n
                answers.add(_page(operator.get(_url(model), {lookup: value})))
            assert len(answers) == 1, f"{model}?{lookup}=N answers depend on N"
            status, body = answers.pop()
            assert status == 400 and lookup.encode() in body, (model, lookup, status, body)


def test_ordering_and_search_on_secret_columns_are_refused(operator, lot):
    for model, secret_columns in (("sealedbid", ["sealed_price", "sealed_gpus"]),
                                  ("hold", ["sealed_original", "sealed_amount",
                                            "sealed_released"]),
                                  ("account", ["sealed_balance"])):
        html = operator.get(_url(model)).content.decode()
        headers = re.findall(r'<th scope="col" class="([^"]*)"', html)
        assert headers, model
        for column in secret_columns:
            index = next(i for i, h in enumerate(headers) if f"column-{column}" in h)
            for o in (str(index), f"-{index}", f"1.{index}"):
                r = operator.get(_url(model), {"o": o})
                assert r.status_code == 400 and b"cannot be sorted on" in r.content, (model, o)
        r = operator.get(_url(model), {"q": str(ALICE_PRICE)})
        assert r.status_code == 400 and b"q: not a parameter" in r.content


def test_every_accepted_ordering_answers_the_same_whatever_the_prices(operator, lot):
    """Swap alice's and bob's figures: every changelist ordering the admin accepts and
    each bid's page answer byte for byte the same (the figures never shape the answer)."""
    _, a, b = lot

    def answers():
        out = {}
        for o in ["", *(f"{p}{i}" for i in range(10) for p in ("", "-"))]:
            out[o] = _page(operator.get(_url("sealedbid"), {"o": o} if o else {}))
        for bid in (a, b):
            out[bid.pk] = _page(operator.get(_url("sealedbid", "change", bid.pk)))
        return out

    before = answers()
    assert sum(status == 200 for status, _ in
               (v for k, v in before.items() if isinstance(k, str))) > 5
    SealedBid.objects.filter(pk=a.pk).update(price=BOB_PRICE, gpus=BOB_GPUS)
    SealedBid.objects.filter(pk=b.pk).update(price=ALICE_PRICE, gpus=ALICE_GPUS)
    assert answers() == before
    SealedBid.objects.filter(pk=a.pk).update(price=ALICE_PRICE, gpus=ALICE_GPUS)
    SealedBid.objects.filter(pk=b.pk).update(price=BOB_PRICE, gpus=BOB_GPUS)


def test_pages_show_sealed_in_place_of_every_figure_before_close(operator, lot):
    auction, a, b = lot
    holds = [Hold.objects.get(pk=bid.hold_id) for bid in (a, b)]
    entries = JournalEntry.objects.filter(hold__in=holds)
    wallets = Account.objects.filter(owner__in=[a.bidder_id, b.bidder_id])
    assert entries.count() == 2 and wallets.count() == 4
    pages = [_url("sealedbid"), _url("auction"), _url("auction", "change", auction.pk),
             _url("hold"), _url("journalentry"), _url("account")]
    pages += [_url("sealedbid", view, bid.pk) for bid in (a, b) for view in ("change", "history")]
    pages += [_url("hold", view, h.pk) for h in holds for view in ("change", "history")]
    pages += [_url("journalentry", "change", e.pk) for e in entries]
    pages += [_url("account", view, w.pk) for w in wallets for view in ("change", "history")]
    for url in pages:
        r = operator.get(url)
        assert r.status_code == 200, url
        _assert_nothing_sealed_in(r, url)

    bids = operator.get(_url("sealedbid")).content.decode()
    for column in ("sealed_price", "sealed_gpus"):
        assert _cells(bids, column) == ["sealed", "sealed"], column
    page = operator.get(_url("sealedbid", "change", a.pk)).content.decode()
    # price, gpus, min_gpus, image, command, ports, template, min_cuda, port_roles, ssh,
    # env, interconnect: every secret field
    assert page.count('<div class="readonly">sealed</div>') == len(
        SealedBidAdmin.secret_fields) == 12
    assert "hush-hush" not in page and "vllm" not in page
    assert "sealed until the auction closes" in page
    hold_list = operator.get(_url("hold")).content.decode()
    for column in ("sealed_original", "sealed_amount", "sealed_captured", "sealed_released"):
        assert _cells(hold_list, column) == ["sealed", "sealed"], column
    entry = operator.get(_url("journalentry", "change", entries[0].pk)).content.decode()
    amounts = re.findall(r'<td class="field-sealed_amount">\s*<p>(.*?)</p>', entry)
    assert amounts == ["sealed", "sealed"]  # both postings of the hold's entry
    accounts = operator.get(_url("account")).content.decode()
    assert _cells(accounts, "sealed_balance").count("sealed") == 4  # both buyers' wallets


@pytest.fixture
def closed_lot():
    """A second_price lot: alice wins (pays bob's price), bob and carol lose."""
    provider, node, _ = registered_node(RTX4090_DUMP)
    auction = auctions.open_auction(provider_id=provider.pk, node_id=node.pk, gpus=8,
                                    reserve_price=1_000_000, duration_seconds=3600,
                                    closes_at=timezone.now() + timedelta(minutes=5))
    bids = [auctions.place_sealed_bid(bidder_id=funded_buyer(100).pk, auction_id=auction.pk,
                                      price=price) for price in (ALICE_PRICE, BOB_PRICE,
                                                                 1_234_567)]
    return auction, bids


def test_after_close_only_the_winner_is_shown_and_losers_stay_sealed(operator, closed_lot):
    auction, (alice, bob, carol) = closed_lot
    auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    html = operator.get(_url("sealedbid")).content.decode()
    shown = dict(zip(re.findall(r'<th class="field-id"><a href="[^"]*">(\d+)</a>', html),
                     _cells(html, "sealed_price"), strict=True))
    assert shown == {str(alice.pk): str(ALICE_PRICE), str(bob.pk): "sealed",
                     str(carol.pk): "sealed"}
    for bid in (bob, carol):
        hold = Hold.objects.get(pk=bid.hold_id)
        own = [*_spellings(bid.price), *_spellings(bid.price * 8)]
        for url in (_url("sealedbid", "change", bid.pk), _url("hold", "change", hold.pk),
                    _url("hold", "history", hold.pk),
                    *(_url("journalentry", "change", e.pk) for e in hold.entries.all())):
            r = operator.get(url)
            assert r.status_code == 200, url
            for spelling in own:
                assert spelling not in r.content.decode(), (url, spelling)
    r = operator.get(_url("sealedbid"), {"price__lt": BOB_PRICE})
    assert r.status_code == 400 and SealedBidAudit.objects.count() == 0


def test_reveal_is_superusers_only_after_close_and_records_who_looked(client, closed_lot):
    auction, (_, _, carol) = closed_lot
    reveal = reverse("admin:marketplace_sealedbid_reveal", args=[carol.pk])
    superuser = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(superuser)
    # before close: not even a superuser
    r = client.post(reveal, {"reason": "curious"})
    assert r.status_code == 409 and b"sealed until it closes" in r.content
    assert SealedBidAudit.objects.count() == 0

    auctions.close_auction(auction_id=auction.pk, now=auction.closes_at)
    staff = UserFactory(is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(codename__in=VIEW))
    client.force_login(staff)
    assert client.get(reveal).status_code == 403
    assert client.post(reveal, {"reason": "curious"}).status_code == 403

    client.force_login(superuser)
    page = client.get(_url("sealedbid", "change", carol.pk)).content.decode()
    assert f'href="{reveal}"' in page
    r = client.get(reveal)  # the form: nothing revealed, nothing recorded
    assert r.status_code == 200 and b'name="reason"' in r.content
    _assert_nothing_sealed_in(r, "the reveal form")
    assert "1.234567" not in r.content.decode() and "1234567" not in r.content.decode()
    r = client.post(reveal, {"reason": "  "})
    assert r.status_code == 400 and b"This field is required" in r.content
    assert SealedBidAudit.objects.count() == 0

    r = client.post(reveal, {"reason": "dispute #12: bidder says it bid higher"})
    assert r.status_code == 200
    text = r.content.decode()
    assert "1234567" in text and str(1_234_567 * 8) in text  # the price and its hold
    audit = SealedBidAudit.objects.get()
    assert (audit.viewer, audit.bid, audit.auction_id, audit.reason) == (
        superuser, carol, auction.pk, "dispute #12: bidder says it bid higher")
    assert audit.viewed_at is not None

    # the audit trail: shown read-only, even to a superuser; never the figures themselves
    listing = client.get(_url("sealedbidaudit"))
    assert listing.status_code == 200 and b"dispute #12" in listing.content
    assert b"1234567" not in listing.content
    assert client.get(_url("sealedbidaudit", "change", audit.pk)).status_code == 200
    assert client.get(_url("sealedbidaudit", "add")).status_code == 403
    assert client.get(_url("sealedbidaudit", "delete", audit.pk)).status_code == 403
    assert client.post(_url("sealedbidaudit", "change", audit.pk),
                       {"reason": "nothing"}).status_code == 403
    # and the bid itself stays sealed in the ordinary pages after the reveal
    assert _cells(client.get(_url("sealedbid")).content.decode(), "sealed_price").count(
        "sealed") == 2


def test_other_admins_cannot_reach_the_figures_through_relations(client, lot):
    """Django's own admins (users) refuse lookups across relations to the figures; ours
    refuse any undeclared lookup (test_query_string_lookups_… above)."""
    users = reverse("admin:auth_user_changelist")
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    for lookup in ("sealed_bids__price__gte", "holds__original__gte",
                   "ledger_accounts__balance__gte", "sealed_bids__gpus"):
        answers = {_page(client.get(users, {lookup: n})) for n in (0, BOB_PRICE, 10**12)}
        assert len(answers) == 1 and answers.pop()[0] == 400, lookup
