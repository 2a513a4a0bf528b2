"""Choices shared by the market's models (orders, sealed bids)."""

from __future__ import annotations

from django.db import models


class Interconnect(models.TextChoices):
    """What a bid requires between the GPUs of each gang (docs/MATCHING.md,
    "Interconnect"): any (PCIe will do) or nvlink (every pair NVLink-connected)."""

    ANY = "any"
    NVLINK = "nvlink"
