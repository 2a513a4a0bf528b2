"""docs/WEBHOOKS.md's verification example, run as written: it accepts what the worker
signs (webhooks/signing.py) and refuses a wrong secret or a changed body."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT
from webhooks import signing


def _example():
    text = (ROOT / "docs" / "WEBHOOKS.md").read_text()
    code = re.search(r"## Verifying a signature \(Python\)\n\n```python\n(.*?)```", text, re.S)
    scope: dict = {}
    exec(code.group(1), scope)  # our own documentation
    return code.group(1), scope["verify"]


def test_the_documented_example_verifies_our_signature_and_refuses_forgeries():
    code, verify = _example()
    assert len(code.strip().splitlines()) <= 16
    body = b'{"data":{"lease":1},"id":"evt_abc","type":"lease.started"}'
    header = signing.header("whsec_s3cret", body)
    assert verify("whsec_s3cret", body, header)["id"] == "evt_abc"
    for secret, sent in (("whsec_other", body), ("whsec_s3cret", body + b" ")):
        with pytest.raises(ValueError, match="bad signature"):
            verify(secret, sent, header)
    with pytest.raises(ValueError, match="stale"):
        verify("whsec_s3cret", body, signing.header("whsec_s3cret", body, t=1_000_000))
