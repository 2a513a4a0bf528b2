"""A bid's `checkpoint` in the API (bids and sealed bids): checked by
marketplace/checkpoints.py, then the bucket probed (head_bucket and a one-key listing,
3 s, no retry);
write-only — answers show `checkpoints.public` ({url, endpoint_url, region, path,
max_bytes, credentials: "set"}), never a credential."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from marketplace import checkpoints
from marketplace.errors import InvalidInput

SCHEMA = {
    "type": "object", "nullable": True,
    "description": "an S3-compatible bucket the runner uploads the workload's checkpoint "
                   "to (docs/CHECKPOINTS.md); the credentials are write-only",
    "properties": {
        "url": {"type": "string", "description": "s3://bucket/prefix"},
        "endpoint_url": {"type": "string", "description": "http(s)://host:port; empty: AWS"},
        "access_key_id": {"type": "string", "writeOnly": True},
        "secret_access_key": {"type": "string", "writeOnly": True},
        "region": {"type": "string"},
        "path": {"type": "string", "description": "default /workspace/checkpoint"},
        "max_bytes": {"type": "integer", "description": "default 10 GiB"},
    },
    "required": ["url", "access_key_id", "secret_access_key"],
}

OUT_SCHEMA = {
    "type": "object", "nullable": True,
    "properties": {"url": {"type": "string"}, "endpoint_url": {"type": "string"},
                   "region": {"type": "string"}, "path": {"type": "string"},
                   "max_bytes": {"type": "integer"},
                   "credentials": {"type": "string", "enum": ["set"]}},
}


@extend_schema_field(SCHEMA)
class CheckpointField(serializers.Field):
    """The bid's checkpoint store → checkpoints.Checkpoint (None: none). A refusal is a
    400 naming `checkpoint` (or `checkpoint.<key>` for its shape) with the reason; the
    probe runs only when the shape is right."""

    def __init__(self, **kwargs):
        kwargs.setdefault("required", False)
        kwargs.setdefault("allow_null", True)
        kwargs.setdefault("default", None)
        kwargs.setdefault("write_only", True)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        try:
            cp = checkpoints.clean(data)
            if cp is not None:
                checkpoints.probe(cp)
        except InvalidInput as exc:
            inner = exc.field.removeprefix(checkpoints.FIELD).removeprefix(".")
            raise serializers.ValidationError({inner: [exc.message]} if inner
                                              else [exc.message]) from None
        return cp

    def to_representation(self, value):
        return checkpoints.public(getattr(value, "terms", value))


class CheckpointOutMixin:
    """`checkpoint` of an order, sealed bid or lease as answers show it (public)."""

    @extend_schema_field(OUT_SCHEMA)
    def get_checkpoint(self, obj) -> dict | None:
        return checkpoints.public(obj.checkpoint)
