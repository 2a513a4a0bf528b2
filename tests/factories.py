"""factory-boy factories and small builders for the market's tests: users, funded buyers,
registered nodes, API tokens, and one builder per order: `bid(...)`/`ask(...)` place one
through the book (marketplace/book.py), `bid_body(...)`/`ask_body(...)` are the JSON of
POST /api/v1/orders/. Where a test needs other defaults it binds them once
(functools.partial) instead of writing its own builder."""

from __future__ import annotations

import uuid
from datetime import timedelta

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from marketplace import api_tokens, book
from marketplace.catalog import load_catalog
from marketplace.models import GpuClass
from providers import cuda_driver
from providers import services as provider_services
from providers.runner import mig as runner_mig
from providers.runner.gpu_links import topology_fields
from providers.runner.nvsmi import Inventory, parse_dump
from settlement import services as ledger
from tests.conftest import DATA
from tests.support.mig_host import H100_MIG

H100_DUMP = DATA / "nvidia-smi" / "h100-80gb-hbm3-x8.driver-535.183.01.txt"
RTX4090_DUMP = DATA / "nvidia-smi" / "rtx-4090-x8.driver-535.154.05.txt"
H100 = "h100-sxm-80gb"  # the market of H100_DUMP's GPUs
MISSING = object()  # bid_body(price=MISSING): the body without that field


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("correct-horse-battery")  # hashed before the save


def funded_buyer(usd: int = 1000, *, ssh_key: bool = False):
    """A new user with `usd` dollars; ssh_key: with one SSH key (with_ssh_key), as a bid
    with ssh needs."""
    user = UserFactory()
    ledger.dev_credit(user_id=user.pk, amount=usd * 1_000_000)
    if ssh_key:
        with_ssh_key(user)
    return user


def ensure_catalog() -> None:
    """The GPU class catalog comes from a data migration; transactional tests flush it."""
    if not GpuClass.objects.exists():
        load_catalog(GpuClass)


def dump_gpus(dump=H100_DUMP, name: str | None = None) -> list[dict]:
    """The GPUs of a recorded nvidia-smi dump as the runner's inventory lists them (with
    their NVLink peers and PCIe links, gpu_links); with
    `name`, UUIDs derived from it (registered_node's own_uuids)."""
    inv = parse_dump(dump)
    links = topology_fields(inv.gpus, {})  # NVLink peers, as the runner sends them
    gpus = [{**g.as_protocol(), **links[g.uuid]} for g in inv.gpus]
    if name is not None:
        gpus = [{**g, "uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_OID, name + g['uuid'])}"}
                for g in gpus]
    return gpus


def driver_for(driver: str, cuda: str) -> str:
    """`driver`, or the oldest one that supports `cuda` when `driver` cannot
    (providers/cuda_driver.py): a node reporting another CUDA than its dump's."""
    if cuda_driver.refusal(driver, cuda) is None:
        return driver
    major, minor = (int(part) for part in cuda.split(".")[:2])
    row = max(v for v in cuda_driver.MIN_DRIVER if v <= (major, minor))
    return ".".join(str(part) for part in cuda_driver.MIN_DRIVER[row])


def registered_node(dump=H100_DUMP, name: str = "node-1", user=None, *,
                    cuda_version: str | None = None, own_uuids: bool = False):
    """A provider with a node whose GPUs come from a recorded nvidia-smi dump.
    cuda_version: what its runner reports instead of the dump's; own_uuids: GPU UUIDs
    derived from `name`, so that several nodes may come from one dump.
    Its runner has sent one heartbeat (an ask needs a heard node: book.require_heartbeating).
    Returns (provider user, node, runner token)."""
    ensure_catalog()
    user = user or UserFactory()
    provider = provider_services.provider_onboard(user_id=user.pk, display_name="Acme")
    created = provider_services.node_create(provider=provider, name=name)
    inv = parse_dump(dump)
    gpus = dump_gpus(dump, name if own_uuids else None)
    cuda = inv.cuda_version if cuda_version is None else cuda_version
    provider_services.inventory_record(
        node=created.node, hostname=name, driver_version=driver_for(inv.driver_version, cuda),
        cuda_version=cuda,
        runner_version="test", source=f"simulate:{dump.name}", gpus=gpus,
    )
    provider_services.heartbeat_record(node=created.node, runtime="docker", gpus=[])
    return user, created.node, created.runner_token


def mig_market(parent_slug: str, profile: str) -> GpuClass:
    """The catalog's profile market `<parent>.<profile>` (e.g. "h100-sxm-80gb.1g.10gb");
    GpuClass.DoesNotExist for a profile the catalog lacks (marketplace/catalog.py)."""
    ensure_catalog()
    return GpuClass.objects.get(slug=f"{parent_slug}.{profile}", mig_profile=profile)


def mig_node(inventory: Inventory = H100_MIG, name: str = "mig-1", user=None):
    """A provider with a node registered as `inventory`'s units (MIG slices where its GPUs
    have them, in the catalog's profile markets). Returns (user, node, token)."""
    ensure_catalog()
    user = user or UserFactory()
    provider = provider_services.provider_onboard(user_id=user.pk, display_name="Acme")
    created = provider_services.node_create(provider=provider, name=name)
    provider_services.inventory_record(
        node=created.node, hostname=name, driver_version=inventory.driver_version,
        cuda_version=inventory.cuda_version, runner_version="test", source=inventory.source,
        gpus=runner_mig.inventory_items(inventory))
    provider_services.heartbeat_record(node=created.node, runtime="docker", gpus=[])
    return user, created.node, created.runner_token


def in_a_day():
    return timezone.now() + timedelta(days=1)


def api_token(user, name: str = "test") -> str:
    """A new API token of `user` (marketplace/api_tokens.py: only its hash is stored)."""
    return api_tokens.issue(user=user, name=name).key


def bid(buyer, /, *, market: str = H100, price: int = 2_490_000, gpus: int = 1,
        duration_seconds: int = 3600, **terms) -> book.Placed:
    """book.place_bid for `buyer`: price in micro-USD per GPU-hour; `terms`: the other
    keywords of place_bid (image, command, ports, interruptible, gang_size, now, ...)."""
    return book.place_bid(buyer_id=buyer.pk, market_slug=market, price=price, gpus=gpus,
                          duration_seconds=duration_seconds, **terms)


def ask(provider, node, /, *, market: str | None = None, price: int = 2_490_000, gpus: int = 8,
        until=None, **terms) -> book.Placed:
    """book.place_ask of `node` by `provider` until `until` (default: in a day); price in
    micro-USD per GPU-hour; `terms`: the other keywords of place_ask (client_order_id, now)."""
    return book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=market,
                          price=price, gpus=gpus, available_until=until or in_a_day(), **terms)


def bid_body(*, gpu_class: str = H100, price: str = "2.50", gpus: int = 2, hours: int = 1,
             **changes) -> dict:
    """The JSON body of a bid for POST /api/v1/orders/ (price: USD per GPU-hour, a string);
    `changes` add or replace fields, a field given as MISSING is left out."""
    body = {"side": "bid", "gpu_class": gpu_class, "price": price, "gpus": gpus,
            "hours": hours, **changes}
    return {k: v for k, v in body.items() if v is not MISSING}


def ask_body(node, /, *, price: str = "1.50", gpus: int = 2, **changes) -> dict:
    """The JSON body of an ask of `node` for POST /api/v1/orders/ (price: USD per GPU-hour);
    available_until is in a day unless given; a field given as MISSING is left out."""
    body = {"side": "ask", "node": node.pk, "price": price, "gpus": gpus,
            "available_until": in_a_day().isoformat(), **changes}
    return {k: v for k, v in body.items() if v is not MISSING}


def with_ssh_key(user, name: str = "laptop"):
    """`user` with one new ed25519 SSH key on the account (a bid with ssh needs one);
    returns the KeyPair (tests/support/ssh.py)."""
    from marketplace.ssh_keys import add_key
    from tests.support.ssh import key_pair

    pair = key_pair()
    add_key(owner_id=user.pk, public_key=pair.public_line, name=name)
    return pair
