"""What a capture takes from a lease's holds: the one money rule shared by the
one-at-a-time services (settlement.services `_capture`: hold_capture_many,
hold_settle_many) and the set-based batches (settlement.bulk), so every path writes the
very same entries and hold figures. Pure arithmetic over integer micro-USD; no database.

The rule: `amount` is taken from the holds in the order given (the first hold first),
split once over the whole amount (settlement.split at GPUMARKET_TAKE_RATE_BPS); each
hold keeps its own share of the capture and of the fee (cumulative floors, so the shares
sum to the split's fee exactly); with `release` every hold's rest goes back to the buyer
(or, with `carry` too, stays in buyer_held for a new hold).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from core import metrics
from settlement.models import Account, Hold
from settlement.money import format_usd
from settlement.split import Split, split

Kind = Account.Kind


@dataclass(frozen=True)
class Settled:
    split: Split   # this capture: gross, platform_fee, provider (micro-USD)
    released: int  # micro-USD of the hold returned to the buyer (0 for a periodic capture)
    entry_id: int
    captured_total: int  # micro-USD captured from the hold so far, this capture included
    fee_total: int       # of which the platform's
    carried_hold_id: int | None = None  # hold_settle_many with carry_reference


@dataclass(frozen=True)
class CapturePlan:
    """What one capture writes: its split, the postings by (kind, owner id), the memo,
    each hold's (take, fee, rest) in the order given, and the micro-USD released."""

    split: Split
    postings: list[tuple[tuple[str, int | None], int]]
    memo: str
    shares: list[tuple[int, int, int]]  # per hold, in order: (captured, fee, released)
    released: int

    def apply(self, holds: list[Hold], entry_id: int) -> Settled:
        """Move the holds' figures (model instances, in memory), count the capture in the
        metrics and say what was settled."""
        metrics.ledger_captured(self.split.gross, self.split.platform_fee)
        for hold, (take, fee, rest) in zip(holds, self.shares, strict=True):
            hold.captured += take
            hold.captured_fee += fee
            hold.released += rest
            hold.amount -= take + rest
        return Settled(split=self.split, released=self.released, entry_id=entry_id,
                       captured_total=sum(h.captured for h in holds),
                       fee_total=sum(h.captured_fee for h in holds))


def plan_capture(held: list[int], *, buyer_id: int, amount: int, provider_id: int,
                 release: bool, carry: bool = False) -> CapturePlan:
    """The plan of capturing `amount` micro-USD from holds that still hold `held`
    micro-USD each (in fill order) of buyer `buyer_id`, paid to `provider_id`. The caller
    checks that `amount` is within the holds (0 <= amount <= sum(held))."""
    bps = settings.GPUMARKET_TAKE_RATE_BPS
    parts = split(amount, bps)
    left, through, fee_through = amount, 0, 0
    shares = []
    for have in held:
        take = min(left, have)
        left -= take
        through += take
        fee = through * bps // 10_000 - fee_through
        fee_through += fee
        shares.append((take, fee, have - take if release else 0))
    released = sum(rest for *_, rest in shares)
    freed = 0 if carry else released  # carried: stays in buyer_held, on the new hold
    return CapturePlan(
        split=parts,
        postings=[
            ((Kind.BUYER_HELD, buyer_id), -(amount + freed)),
            ((Kind.PROVIDER_EARNED, provider_id), parts.provider),
            ((Kind.PLATFORM_REVENUE, None), parts.platform_fee),
            ((Kind.BUYER_AVAILABLE, buyer_id), freed),
        ],
        memo=f"captured {format_usd(amount)} USD: provider {format_usd(parts.provider)}, "
             f"platform {format_usd(parts.platform_fee)}; "
             f"{'carried' if carry else 'released'} {format_usd(released)}",
        shares=shares, released=released)
