"""Settlement's Celery tasks: thin, idempotent, calling one service each."""

from __future__ import annotations

import logging

from celery import shared_task

from core import metrics
from settlement import onchain

log = logging.getLogger("gpumarket.settlement")


@shared_task(name="settlement.tasks.mirror_on_chain")
def mirror_on_chain() -> dict:
    """Credit new on-chain deposits and mirror new ledger settlements on chain (beat,
    every 30 s, only when GPUMARKET_CHAIN_RPC_URL is set). Safe to retry or overlap."""
    cfg = onchain.from_settings()
    if cfg is None:
        return {"enabled": False}
    deposits = onchain.sync_deposits(cfg)
    settled, problems = onchain.mirror_settlements(cfg)
    return {"enabled": True, "deposits": deposits, "settled": settled, "refused": problems}


@shared_task(name="settlement.tasks.ledger_check")
def ledger_check() -> dict:
    """Run every registered ledger check (as `manage.py ledger_check`) and export the
    result: gpumarket_ledger_check_ok 1 or 0, and the time it ran (beat, every
    GPUMARKET_LEDGER_CHECK_SECONDS). A violation is logged at ERROR; it changes nothing."""
    from settlement.checks import first_violation

    violation = first_violation()
    metrics.ledger_check_result(violation is None)
    if violation:
        log.error("ledger_check: %s", violation)
    return {"ok": violation is None, "violation": violation}
