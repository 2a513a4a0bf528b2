"""Settlement's Celery tasks: thin, idempotent, calling one service each."""

from __future__ import annotations

from celery import shared_task

from settlement import onchain


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
