"""The alert rule language, a small recursive-descent parser (no Django):

    rule      := condition ("AND" condition)*
    condition := METRIC OP NUMBER [UNIT] ["FOR" NUMBER ("s"|"m"|"h"|"d")]
    OP        := "<" | "<=" | ">" | ">=" | "==" | "!="

METRICS names each metric, its unit and how a subject's GPUs combine. Keywords are
case-insensitive; a rule that does not parse is a RuleError naming the 1-based character
position. Thresholds are exact: Decimal, USD turned into integer micro-USD."""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

# metric → (unit, what it is); the unit may be left out except for USD
METRICS = {
    "gpu_utilization": ("%", "mean GPU utilization of the lease's or node's GPUs, 0–100"),
    "gpu_temperature": ("C", "hottest GPU temperature, °C"),
    "gpu_power": ("W", "total GPU power draw, watts"),
    "gpu_ecc_errors": ("", "most uncorrectable ECC errors on one GPU"),
    "lease_cost": ("USD", "what the running lease has cost so far (leases only)"),
}
LEASE_ONLY = {"lease_cost"}
# the largest threshold each metric takes, in its unit (a bound past any real value)
MAX_THRESHOLD = {"gpu_utilization": Decimal(100), "gpu_temperature": Decimal(200),
                 "gpu_power": Decimal(100_000), "gpu_ecc_errors": Decimal(10**9),
                 "lease_cost": Decimal(10**9)}
UNITS = {"C", "W", "USD"}  # words read as a unit after a threshold (and "%")
OPS = ("<=", ">=", "==", "!=", "<", ">")
DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_FOR_SECONDS = 7 * 86400
MAX_CONDITIONS = 8
MAX_CHARS = 500

_TOKEN = re.compile(r"\s*(?:(?P<num>\d+(?:\.\d+)?)|(?P<word>[A-Za-z_][A-Za-z0-9_]*)"
                    r"|(?P<op><=|>=|==|!=|<|>)|(?P<pct>%))")


class RuleError(ValueError):
    """A rule that does not parse; `position` is 1-based, the message names it."""

    def __init__(self, position: int, says: str) -> None:
        super().__init__(f"at position {position}: {says}")
        self.position = position


@dataclass(frozen=True)
class Condition:
    metric: str
    op: str
    threshold: Decimal  # in the metric's unit; micro-USD for lease_cost
    for_seconds: int = 0

    def holds(self, value) -> bool:
        if value is None:
            return False
        v, t = Decimal(value), self.threshold
        return {"<": v < t, "<=": v <= t, ">": v > t, ">=": v >= t, "==": v == t,
                "!=": v != t}[self.op]

    def as_json(self) -> dict:
        """{metric, op, threshold (a decimal string in `unit`), unit, for_seconds};
        lease_cost's threshold is integer micro-USD (unit "micro-USD")."""
        unit = METRICS[self.metric][0]
        return {"metric": self.metric, "op": self.op, "threshold": str(self.threshold),
                "unit": "micro-USD" if unit == "USD" else unit,
                "for_seconds": self.for_seconds}


@dataclass
class _Token:
    kind: str  # num | word | op | pct | end
    text: str
    position: int  # 1-based


def _tokens(text: str) -> list[_Token]:
    tokens, at = [], 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            return [*tokens, _Token("end", "", at + 1)]
        m = _TOKEN.match(text, at)
        if m is None or m.end() == at:
            raise RuleError(at + 1, f"unexpected character {text[at]!r}")
        kind = m.lastgroup
        tokens.append(_Token(kind, m.group(kind), m.start(kind) + 1))
        at = m.end()


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.i = 0

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        self.i += 1
        return token

    def keyword(self, word: str) -> bool:
        token = self.peek()
        if token.kind == "word" and token.text.upper() == word:
            self.i += 1
            return True
        return False

    def rule(self) -> list[Condition]:
        conditions = [self.condition()]
        while self.keyword("AND"):
            if len(conditions) == MAX_CONDITIONS:
                raise RuleError(self.peek().position, f"at most {MAX_CONDITIONS} conditions")
            conditions.append(self.condition())
        end = self.peek()
        if end.kind != "end":
            raise RuleError(end.position, f"expected AND or the end, found {end.text!r}")
        return conditions

    def condition(self) -> Condition:
        token = self.take()
        if token.kind != "word" or token.text not in METRICS:
            found = repr(token.text) if token.kind != "end" else "the end"
            raise RuleError(token.position, f"expected a metric ({', '.join(METRICS)}), "
                                            f"found {found}")
        metric, unit = token.text, METRICS[token.text][0]
        op = self.take()
        if op.kind != "op":
            raise RuleError(op.position, f"expected a comparison ({' '.join(OPS)}) after "
                                         f"{metric}")
        number = self.take()
        if number.kind != "num":
            raise RuleError(number.position, "expected a number")
        threshold = Decimal(number.text)
        if "." in number.text and len(number.text.split(".")[1]) > 6:
            raise RuleError(number.position, "a threshold with at most 6 decimals")
        if threshold > MAX_THRESHOLD[metric]:
            raise RuleError(number.position, f"{metric} takes a threshold of at most "
                                             f"{MAX_THRESHOLD[metric]:,} {unit}".rstrip())
        given = self.peek()
        if given.kind == "pct" or (given.kind == "word" and given.text.upper() in UNITS):
            self.i += 1
            if given.text.upper() != unit.upper() or not unit:
                takes = f"takes {unit}" if unit else "takes no unit"
                raise RuleError(given.position, f"{metric} {takes}, not {given.text}")
        elif unit == "USD":
            raise RuleError(given.position, f"{metric} needs its unit: USD")
        if unit == "USD":
            micros = threshold * 1_000_000
            if micros != micros.to_integral_value():
                raise RuleError(number.position, "USD with at most 6 decimals")
            threshold = micros.to_integral_value()
        return Condition(metric, op.text, threshold, self.duration())

    def duration(self) -> int:
        if not self.keyword("FOR"):
            return 0
        number = self.take()
        if number.kind != "num" or "." in number.text:
            raise RuleError(number.position, "expected a whole number of s, m, h or d "
                                             "after FOR")
        unit = self.take()
        if unit.kind != "word" or unit.text.lower() not in DURATION:
            raise RuleError(unit.position, "expected s, m, h or d after the duration")
        seconds = int(number.text) * DURATION[unit.text.lower()]
        if seconds > MAX_FOR_SECONDS:
            raise RuleError(number.position, "a duration of at most 7 days")
        return seconds


def parse(text: str) -> list[Condition]:
    """The conditions of `text` (all must hold, each for its duration). Raises RuleError."""
    if len(text) > MAX_CHARS:
        raise RuleError(MAX_CHARS + 1, f"a rule of at most {MAX_CHARS} characters")
    return _Parser(text).rule()


def for_leases_only(conditions: list[Condition]) -> bool:
    return any(c.metric in LEASE_ONLY for c in conditions)
