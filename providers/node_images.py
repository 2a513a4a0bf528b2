"""What each node's engine holds (docs/IMAGES.md): the runner's heartbeat `images`
report stored as providers.NodeImage rows, written only when it changes, and the
questions the market asks of it (which nodes hold an image; "image cached on 3 of 5
nodes").

Image refs are compared in the runner's normal form (providers.runner.pull.normalize).
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.utils import timezone

from core.image_ref import image_reference_problem
from providers.models import Node, NodeImage
from providers.runner.images import REPORT_MAX
from providers.runner.pull import normalize
from providers.services import ProviderError

MAX_BYTES = 2**50  # 1 PiB: past any image, and inside PostgreSQL's bigint


def clean_report(items: list) -> dict[str, int]:
    """{normal ref: bytes} from a heartbeat's `images` ([{"image", "bytes"}], at most
    REPORT_MAX). ProviderError naming `images[i].image` / `images[i].bytes` otherwise."""
    if not isinstance(items, list) or len(items) > REPORT_MAX:
        raise ProviderError(f"must be a list of at most {REPORT_MAX} images", field="images")
    out: dict[str, int] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ProviderError("must be an object {image, bytes}", field=f"images[{i}]")
        ref, size = item.get("image"), item.get("bytes", 0)
        problem = image_reference_problem(ref) if isinstance(ref, str) else "must be text"
        if problem:
            raise ProviderError(problem, field=f"images[{i}].image")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_BYTES:
            raise ProviderError(f"must be a whole number of bytes from 0 to {MAX_BYTES}",
                                field=f"images[{i}].bytes")
        out[normalize(ref)] = size
    return out


def record(*, node: Node, report: dict[str, int]) -> bool:
    """Make the node's NodeImage rows equal `report` (clean_report's). One read when
    nothing changed; otherwise the rows that differ are deleted, updated or added. True
    when anything was written."""
    have = dict(NodeImage.objects.filter(node=node).values_list("image", "bytes"))
    if have == report:
        return False
    now = timezone.now()
    with transaction.atomic():
        gone = [ref for ref in have if ref not in report]
        if gone:
            NodeImage.objects.filter(node=node, image__in=gone).delete()
        for ref, size in report.items():
            if ref in have and have[ref] != size:
                NodeImage.objects.filter(node=node, image=ref).update(bytes=size,
                                                                      reported_at=now)
        NodeImage.objects.bulk_create(
            [NodeImage(node=node, image=ref, bytes=size, reported_at=now)
             for ref, size in report.items() if ref not in have],
            ignore_conflicts=True)
    return True


def nodes_holding(image: str, node_ids: Iterable[int] | None = None) -> set[int]:
    """Ids of the nodes (of `node_ids`, if given) whose engine holds `image`."""
    rows = NodeImage.objects.filter(image=normalize(image))
    if node_ids is not None:
        rows = rows.filter(node_id__in=list(node_ids))
    return set(rows.values_list("node_id", flat=True))


def cached_note(holding: int, nodes: int) -> str:
    """"image cached on 3 of 5 nodes" ("1 node" in the singular)."""
    return f"image cached on {holding} of {nodes} node{'s' if nodes != 1 else ''}"
