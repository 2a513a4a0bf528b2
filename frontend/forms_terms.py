"""The bid terms of issue 15 and the lease contract in the bid forms (market page, sealed
bid): `checkpoint` (docs/CHECKPOINTS.md) as five inputs, its credentials password inputs
never rendered back; `failover`, `min_reliability` (docs/FAULTS.md); `notice_signal`,
`stop_grace_seconds` (docs/LEASE_CONTRACT.md). Each is the API's own field (ApiField), the
checkpoint the API's CheckpointField (shape checked, then the bucket probed), so the page
refuses what the API refuses, on the field it names."""

from __future__ import annotations

from django import forms
from rest_framework.exceptions import ValidationError as ApiValidationError

from frontend.forms_fields import ApiField, whole_number
from marketplace.api.checkpoint_field import CheckpointField
from marketplace.api.errors import _flatten
from marketplace.lease_notice import DEFAULT_STOP_GRACE_SECONDS, MAX_STOP_GRACE_SECONDS

#: the checkpoint object's keys the page takes, each its own input `checkpoint_<key>`
CHECKPOINT_KEYS = ("url", "endpoint_url", "region", "access_key_id", "secret_access_key")
TERMS = ("min_reliability", "failover", "notice_signal", "stop_grace_seconds",
         *(f"checkpoint_{k}" for k in CHECKPOINT_KEYS))
_NO_FILL = {"autocomplete": "off", "spellcheck": "false"}


def checkpoint_input(key: str) -> str:
    """The form field of the checkpoint's `key` ("url" → "checkpoint_url"); an unknown or
    empty key (the whole object) → the url's."""
    return f"checkpoint_{key}" if key in CHECKPOINT_KEYS else "checkpoint_url"


def _credential(label: str) -> forms.CharField:
    # PasswordInput(render_value=False): after an error the input comes back empty
    return forms.CharField(label=label, required=False, max_length=256, strip=False,
                           widget=forms.PasswordInput(attrs={"autocomplete": "off"}))


def _failover(serializer, *, default: str) -> ApiField:
    return ApiField(serializer, "failover", label="Failover",
                    to_json=lambda t: {"yes": True, "no": False}.get(t, t),
                    widget=forms.Select(choices=[("", default),
                                                 ("yes", "yes: continue on another node"),
                                                 ("no", "no: a failed lease just ends")]),
                    help_text="a lease failed by the provider's side (a lost GPU, a dead "
                              "node) continues on another node, its running time credited")


def term_fields(serializer, *, failover_default: str) -> dict[str, forms.Field]:
    """The terms' fields for a form on `serializer` (OrderInSerializer or
    SealedBidInSerializer); failover_default: the label of failover's empty choice."""
    return {
        "min_reliability": ApiField(
            serializer, "min_reliability", label="Minimum node reliability (0–1)",
            help_text='optional, e.g. 0.95: only nodes with at least that share of leases '
                      "not failed by the provider's fault over 30 days (new nodes qualify)"),
        "failover": _failover(serializer, default=failover_default),
        "notice_signal": ApiField(
            serializer, "notice_signal", label="Notice signal", initial="",
            widget=forms.Select(choices=[("", "none (the notice file only)"),
                                         *[(s, s) for s in serializer._declared_fields[
                                             "notice_signal"].choices if s]]),
            help_text="sent to the workload when its lease is given notice (preemption, "
                      "maintenance, the end); the notice file is written either way"),
        "stop_grace_seconds": ApiField(
            serializer, "stop_grace_seconds", label="Stop grace (seconds)",
            to_json=whole_number, initial=DEFAULT_STOP_GRACE_SECONDS,
            help_text=f"0–{MAX_STOP_GRACE_SECONDS}: from SIGTERM to SIGKILL when the lease "
                      f"stops (empty: {DEFAULT_STOP_GRACE_SECONDS})"),
        "checkpoint_url": forms.CharField(
            label="Checkpoint bucket (s3://bucket/prefix)", required=False,
            max_length=1024, widget=forms.TextInput(attrs=_NO_FILL),
            help_text="optional: the runner uploads /workspace/checkpoint there before the "
                      "lease stops, and a failover lease starts from it (docs/CHECKPOINTS.md)"),
        "checkpoint_endpoint_url": forms.CharField(
            label="Checkpoint endpoint (http(s)://host:port)", required=False,
            max_length=512, widget=forms.TextInput(attrs=_NO_FILL),
            help_text="an S3-compatible store's; empty: AWS S3"),
        "checkpoint_region": forms.CharField(
            label="Checkpoint region", required=False, max_length=64,
            widget=forms.TextInput(attrs=_NO_FILL), help_text="optional, e.g. us-east-1"),
        "checkpoint_access_key_id": _credential("Checkpoint access key ID"),
        "checkpoint_secret_access_key": _credential("Checkpoint secret access key"),
    }


class BidTerms:
    """Mixin of the bid forms: `clean` turns the checkpoint inputs into the API's
    `checkpoint` (checkpoints.Checkpoint, or None when all are empty; the bucket probed),
    a refusal on the input it names; cleaned_data["checkpoint"] holds it. The terms
    come after the form's own fields."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.order_fields([n for n in self.fields if n not in TERMS])

    def clean(self):
        data = super().clean()
        given = {k: data.get(checkpoint_input(k)) or "" for k in CHECKPOINT_KEYS}
        data["checkpoint"] = None
        if not any(given.values()):
            return data
        if not given["url"]:
            self.add_error("checkpoint_url", "is required with a checkpoint's other fields")
            return data
        if self.errors:  # probe the bucket only for an otherwise good bid
            return data
        body = {k: v for k, v in given.items() if v}
        try:
            data["checkpoint"] = CheckpointField().run_validation(body)
        except ApiValidationError as exc:
            for path, message in _flatten({"checkpoint": exc.detail}):
                key = path.removeprefix("checkpoint").removeprefix(".")
                if not key and message.startswith("endpoint_url:"):
                    key, message = "endpoint_url", message.removeprefix("endpoint_url:")
                self.add_error(checkpoint_input(key), message.strip())
        return data
