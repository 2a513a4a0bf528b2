from hypothesis import given
from hypothesis import strategies as st

from settlement.money import MoneyFormatError, format_usd, lease_cost, parse_usd
from settlement.split import split


def test_design_examples():
    assert split(333, 1500) == (333, 49, 284)
    assert split(1, 1500) == (1, 0, 1)
    assert split(1_000_000, 1500) == (1_000_000, 150_000, 850_000)


@given(gross=st.integers(min_value=0, max_value=10**18), bps=st.integers(0, 10_000))
def test_split_is_exact_and_dust_goes_to_provider(gross, bps):
    parts = split(gross, bps)
    assert parts.platform_fee + parts.provider == gross
    assert parts.platform_fee == gross * bps // 10_000
    assert parts.provider * 10_000 >= gross * (10_000 - bps)  # provider never rounded down


def test_lease_cost_floors_per_second():
    # 2 GPUs at 2.49 USD/GPU-h for 8 s
    assert lease_cost(2_490_000, 2, 8) == 2_490_000 * 2 * 8 // 3600 == 11_066
    assert lease_cost(2_490_000, 8, 3600) == 19_920_000


def test_parse_usd_accepts_only_plain_decimal_strings():
    assert parse_usd("2.49") == 2_490_000
    assert parse_usd("2.490000") == 2_490_000
    assert parse_usd("0.000001") == 1
    assert format_usd(2_490_000) == "2.490000"
    for bad in (2.49, "2.4900001", "-1", "NaN", "Infinity", "1e3", " 2.49", "", "2.", ".5",
                None, True, "01.5"):
        try:
            parse_usd(bad)
        except MoneyFormatError:
            continue
        raise AssertionError(f"{bad!r} was accepted")
