"""The page filters of frontend/templatetags/gpumarket.py: one way to show money,
prices, GPU counts and status words."""

from __future__ import annotations

import pytest
from django.template import Context, Template

from frontend.templatetags.gpumarket import gpus, price, status_word, usd, usd_change, usd_exact


@pytest.mark.parametrize(("value", "shown"), [
    (248_440_000, "$248.44"), (248_444_999, "$248.44"), (248_445_000, "$248.45"),
    (0, "$0.00"), (10_000, "$0.01"), (14_999, "$0.01"), (15_000, "$0.02"),
    (5_678, "$0.005678"), (-1, "-$0.000001"), (-1_200_000, "-$1.20"),
    ("2.49", "$2.49"), ("$2.490000", "$2.49"), ("12.345678", "$12.35"),
    (None, "—"), ("—", "—"), ("", "—"),
])
def test_usd_two_decimals(value, shown):
    assert usd(value) == shown


@pytest.mark.parametrize(("value", "shown"), [
    (2_865_000, "$2.865 /GPU-h"), (2_000_000, "$2.00 /GPU-h"), (1, "$0.000001 /GPU-h"),
    (2_490_000, "$2.49 /GPU-h"), ("2.490000", "$2.49 /GPU-h"), (None, "—"),
])
def test_price_precision(value, shown):
    assert price(value) == shown


def test_usd_exact_keeps_every_micro():
    assert usd_exact(12_345_678) == "$12.345678"
    assert usd_exact(5_678) == "$0.005678"
    assert usd_exact(-10_000) == "-$0.01"


def test_usd_change_signed():
    assert usd_change(1_200_000) == "+$1.20" and usd_change(-5_678) == "-$0.005678"
    assert usd_change(0) == "—" and usd_change(None) == "—"


def test_gpus_and_status_words():
    assert (gpus(1), gpus(2), gpus(0), gpus(None)) == ("1 GPU", "2 GPUs", "0 GPUs", "—")
    assert status_word("partially_filled") == "partly filled"
    assert status_word("second_price") == "second price"
    assert status_word("uniform_price") == "uniform price"
    assert status_word("open") == "open"
    assert status_word("GTC") == "good till cancelled"
    assert status_word("lease_settle") == "lease settle"


def test_not_money_is_shown_as_given_never_an_error():
    assert usd("n/a") == "n/a" and price(True) == "True"


def test_filters_in_a_template():
    html = Template("{% load gpumarket %}{{ a|usd }} {{ p|price }} {{ n|gpus }} "
                    "{{ s|status_word }}").render(Context(
                        {"a": 248_440_000, "p": 2_865_000, "n": 2, "s": "partially_filled"}))
    assert html == "$248.44 $2.865 /GPU-h 2 GPUs partly filled"
