"""GPUMARKET_TEMPLATE_IMAGES: an operator's image for a template in place of the one
templates.json names — a registry mirror, or a local image on a site with no registry
(`pytorch-jupyter=gpumarket/jupyter:local`). Read by settings at startup; no Django
import. README "Templates".

Value: a JSON object (`{"pytorch-jupyter": "mirror.example:5000/pytorch/pytorch:2.5.1"}`)
or `id=image,id=image`; empty: none. Refused (ValueError naming the entry): a value that
is neither, an unknown template id, `custom` (it has no image of its own), an image that
is not a Docker image reference or names a registry at a private or loopback address
(core/image_ref.py; allowed with GPUMARKET_IMAGE_ALLOW_PRIVATE_REGISTRY), an id given twice.
"""

from __future__ import annotations

import json
from pathlib import Path

from core.image_ref import image_reference_problem
from providers.runner.registry_host import private_registry_problem

DATA = Path(__file__).with_name("templates.json")
NO_IMAGE = "custom"


def template_ids() -> set[str]:
    """The ids of templates.json's templates."""
    return {t["id"] for t in json.loads(DATA.read_text(encoding="utf-8"))["templates"]}


def _pairs(raw: str) -> list[tuple[object, object]]:
    if raw.startswith("{"):
        try:
            parsed = json.loads(raw, object_pairs_hook=list)
        except json.JSONDecodeError as exc:
            raise ValueError(f"is not valid JSON ({exc.msg} at character {exc.pos})") from None
        if not isinstance(parsed, list):
            raise ValueError("must be a JSON object {\"template id\": \"image\"}")
        return parsed
    pairs = []
    for item in raw.split(","):
        template_id, sep, image = (part.strip() for part in item.partition("="))
        if not sep or not template_id:
            raise ValueError(f"entry {item.strip()!r} is not id=image")
        pairs.append((template_id, image))
    return pairs


def parse_template_images(raw: str, known: set[str] | None = None, *,
                          allow_private_registry: bool = False) -> dict[str, str]:
    """{template id: image} from the setting's value `raw` (JSON or id=image,…); `known`
    defaults to templates.json's ids. ValueError naming what is wrong."""
    raw = (raw or "").strip()
    if not raw:
        return {}
    known = template_ids() if known is None else known
    out: dict[str, str] = {}
    for template_id, image in _pairs(raw):
        if not isinstance(template_id, str) or template_id not in known:
            raise ValueError(f"unknown template {template_id!r}: known templates are "
                             f"{', '.join(sorted(known))}")
        if template_id == NO_IMAGE:
            raise ValueError(f"template {NO_IMAGE} has no image to replace (its bids bring "
                             "their own)")
        if template_id in out:
            raise ValueError(f"template {template_id} is given twice")
        if not isinstance(image, str):
            raise ValueError(f"{template_id}: the image must be a string")
        problem = image_problem(image, allow_private_registry=allow_private_registry)
        if problem:
            raise ValueError(f"{template_id}: image {image!r} {problem}")
        out[template_id] = image
    return out


def image_problem(value: str, *, allow_private_registry: bool) -> str | None:
    """image_reference_problem, then — unless `allow_private_registry`
    (settings.GPUMARKET_IMAGE_ALLOW_PRIVATE_REGISTRY) — a registry that is `localhost` or
    a non-public IP literal (registry_host.py; host names are not resolved) is refused:
    every provider's engine would connect there, inside the provider's network."""
    problem = image_reference_problem(value)
    if problem or allow_private_registry:
        return problem
    private = private_registry_problem(value)
    if private:
        return (f"must not name a registry at a private or loopback address ({private}): "
                "providers' nodes would pull from their own networks")
    return None
