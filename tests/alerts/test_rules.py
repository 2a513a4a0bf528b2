"""The alert rule parser (alerts/rules.py): the seeds' forms parse to exact conditions;
anything else is a RuleError naming the 1-based position."""

from __future__ import annotations

from decimal import Decimal

import pytest

from alerts.rules import Condition, RuleError, parse


def test_the_seeds_forms_parse_exactly():
    assert parse("gpu_utilization < 5% FOR 30m AND lease_cost > 50 USD") == [
        Condition("gpu_utilization", "<", Decimal(5), 1800),
        Condition("lease_cost", ">", Decimal(50_000_000), 0)]
    assert parse("gpu_temperature > 85 FOR 2m") == [
        Condition("gpu_temperature", ">", Decimal(85), 120)]
    assert parse("lease_cost >= 0.000001 usd and gpu_power<=300W for 1h") == [
        Condition("lease_cost", ">=", Decimal(1), 0),
        Condition("gpu_power", "<=", Decimal(300), 3600)]


@pytest.mark.parametrize(("rule", "position", "says"), [
    ("", 1, "expected a metric"),
    ("gpu_util < 5", 1, "expected a metric"),
    ("gpu_utilization 5", 17, "expected a comparison"),
    ("gpu_utilization < five", 19, "expected a number"),
    ("gpu_utilization < 5 USD", 21, "gpu_utilization takes %, not USD"),
    ("lease_cost > 50", 16, "lease_cost needs its unit: USD"),
    ("lease_cost > 0.0000001 USD", 14, "at most 6 decimals"),
    ("gpu_temperature > 85 FOR 2x", 27, "expected s, m, h or d"),
    ("gpu_temperature > 85 FOR 1.5m", 26, "whole number"),
    ("gpu_temperature > 85 FOR 8d", 26, "at most 7 days"),
    ("gpu_temperature > 85 OR gpu_power > 1", 22, "expected AND or the end, found 'OR'"),
    ("gpu_temperature > 85 AND", 25, "expected a metric"),
    ("gpu_power > 300 $", 17, "unexpected character '$'"),
    ("lease_cost > " + "1" * 29 + " USD", 14, "at most 1,000,000,000 USD"),
    ("gpu_utilization > 100.5%", 19, "at most 100 %"),
    ("gpu_temperature > 85.1234567", 19, "at most 6 decimals"),
])
def test_a_rule_that_does_not_parse_names_the_position(rule, position, says):
    with pytest.raises(RuleError) as caught:
        parse(rule)
    assert caught.value.position == position
    assert str(caught.value).startswith(f"at position {position}: ")
    assert says in str(caught.value)


def test_a_parsed_condition_names_the_unit_of_its_threshold():
    cost, util = parse("lease_cost > 50 USD AND gpu_utilization < 5%")
    assert cost.as_json() == {"metric": "lease_cost", "op": ">", "threshold": "50000000",
                              "unit": "micro-USD", "for_seconds": 0}
    assert util.as_json()["unit"] == "%"


def test_a_condition_on_a_missing_reading_does_not_hold():
    [c] = parse("gpu_utilization < 5%")
    assert c.holds(2) and c.holds(4.9) and not c.holds(5) and not c.holds(None)
