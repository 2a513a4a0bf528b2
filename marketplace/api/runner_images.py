"""GET /api/v1/runner/images/: the images the marketplace wants a node to hold, for the
runner's pre-pulls while idle (docs/IMAGES.md): the images of recent leases in the node's
markets that reached running (most leases first), then the templates' images (the site's,
with GPUMARKET_TEMPLATE_IMAGES applied). An image from a registry at localhost or a
private or loopback address (a lease from before such bids were refused) is left out
unless GPUMARKET_IMAGE_ALLOW_PRIVATE_REGISTRY."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Count
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.response import Response

from marketplace.env_templates import templates
from marketplace.models import Lease
from providers.api import RunnerView
from providers.models import Gpu
from providers.runner.pull import normalize
from providers.runner.registry_host import private_registry_problem

RECENT = timedelta(days=1)  # how far back "recent leases" reach
WANTED_MAX = 20  # images in the answer


def wanted_images(node) -> list[dict]:
    """[{"image", "why": "recent leases" | "template", "leases": count (recent leases)}],
    most wanted first, each image once (normal form), at most WANTED_MAX."""
    markets = set(Gpu.objects.filter(node=node).values_list("gpu_class_id", flat=True))
    # only leases that reached running: a failed pull (a registry nobody can reach) or a
    # never-started lease is no reason to pre-pull an image
    rows = (Lease.objects.filter(market_id__in=markets, started_at__isnull=False,
                                 created_at__gte=timezone.now() - RECENT)
            .exclude(image="").values("image").annotate(n=Count("id"))
            .order_by("-n", "image")[:WANTED_MAX])
    out: dict[str, dict] = {}
    allow_private = settings.GPUMARKET_IMAGE_ALLOW_PRIVATE_REGISTRY
    for row in rows:
        ref = normalize(row["image"])
        if not allow_private and private_registry_problem(ref):
            continue
        if ref in out:
            out[ref]["leases"] += row["n"]
        else:
            out[ref] = {"image": ref, "why": "recent leases", "leases": row["n"]}
    for template in sorted(templates().values(), key=lambda t: t.id):
        if template.image and normalize(template.image) not in out:
            ref = normalize(template.image)
            out[ref] = {"image": ref, "why": "template", "leases": 0}
    return list(out.values())[:WANTED_MAX]


class WantedImageOut(serializers.Serializer):
    image = serializers.CharField()
    why = serializers.ChoiceField(choices=["recent leases", "template"])
    leases = serializers.IntegerField()


class WantedImagesOut(serializers.Serializer):
    images = WantedImageOut(many=True)


class RunnerImages(RunnerView):
    """The runner asks which images to pre-pull (its own node's markets)."""

    @extend_schema(responses=WantedImagesOut)
    def get(self, request):
        return Response({"images": wanted_images(request.auth)})
