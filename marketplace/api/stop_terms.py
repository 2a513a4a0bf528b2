"""A bid's stop terms (docs/LEASE_CONTRACT.md), the fields bids and sealed bids share:
`notice_signal` ("" or SIGUSR1, SIGUSR2, SIGINT, SIGHUP, SIGTERM: sent to the workload with
a notice) and `stop_grace_seconds` (0–300, default 10: SIGTERM to SIGKILL). A bad value is
a 400 naming the field."""

from __future__ import annotations

from rest_framework import serializers

from core.fields import StrictIntegerField
from marketplace.lease_notice import (
    DEFAULT_STOP_GRACE_SECONDS,
    MAX_STOP_GRACE_SECONDS,
    NOTICE_SIGNALS,
)

STOP_TERMS = ("notice_signal", "stop_grace_seconds")


class StopTermsFields(serializers.Serializer):
    notice_signal = serializers.ChoiceField(choices=["", *NOTICE_SIGNALS], required=False,
                                            default="")
    stop_grace_seconds = StrictIntegerField(min_value=0, max_value=MAX_STOP_GRACE_SECONDS,
                                            required=False,
                                            default=DEFAULT_STOP_GRACE_SECONDS)
