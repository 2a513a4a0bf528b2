"""factory-boy factories and small builders for the market's tests."""

from __future__ import annotations

from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from providers import services as provider_services
from providers.runner.nvsmi import parse_dump
from settlement import services as ledger
from tests.conftest import DATA

H100_DUMP = DATA / "nvidia-smi" / "h100-80gb-hbm3-x8.driver-535.183.01.txt"
RTX4090_DUMP = DATA / "nvidia-smi" / "rtx-4090-x8.driver-535.154.05.txt"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("correct-horse-battery")  # hashed before the save


def funded_buyer(usd: int = 1000):
    user = UserFactory()
    ledger.dev_credit(user_id=user.pk, amount=usd * 1_000_000)
    return user


def ensure_catalog() -> None:
    """The GPU class catalog comes from a data migration; transactional tests flush it."""
    from marketplace.catalog import load_catalog
    from marketplace.models import GpuClass

    if not GpuClass.objects.exists():
        load_catalog(GpuClass)


def registered_node(dump=H100_DUMP, name: str = "node-1", user=None):
    """A provider with a node whose GPUs come from a recorded nvidia-smi dump.
    Returns (provider user, node, runner token)."""
    ensure_catalog()
    user = user or UserFactory()
    provider = provider_services.provider_onboard(user_id=user.pk, display_name="Acme")
    created = provider_services.node_create(provider=provider, name=name)
    inv = parse_dump(dump)
    provider_services.inventory_record(
        node=created.node, hostname=name, driver_version=inv.driver_version,
        cuda_version=inv.cuda_version, runner_version="test", source=f"simulate:{dump.name}",
        gpus=[g.as_protocol() for g in inv.gpus],
    )
    return user, created.node, created.runner_token


def in_a_day():
    return timezone.now() + timedelta(days=1)


def api_token(user, name: str = "test") -> str:
    """A new API token of `user` (marketplace/api_tokens.py: only its hash is stored)."""
    from marketplace import api_tokens

    return api_tokens.issue(user=user, name=name).key
