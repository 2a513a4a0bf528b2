"""Schemathesis over the OpenAPI schema of the order and auction endpoints, against the
live server on 127.0.0.1 with an authenticated, funded buyer: no generated request may
get a 5xx, and the ledger's invariants hold afterwards (the ledger guard checks them)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_or_skip
from tests.factories import api_token, funded_buyer, in_a_day, registered_node

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]


def test_schemathesis_finds_no_server_error(live_server, tmp_path):
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    if cli is None:
        require_or_skip("schemathesis is not installed (pip install -e '.[test]')")
    provider, node, _ = registered_node()
    from marketplace import book

    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                   price=2_000_000, gpus=8, available_until=in_a_day())
    token = api_token(funded_buyer(10_000))
    done = subprocess.run(
        [cli, "run", f"{live_server.url}/api/schema/", "-H", f"Authorization: Token {token}",
         "--include-path-regex", r"^/api/v1/(orders|auctions|sealed-bids|gpu-classes)",
         "-c", "not_a_server_error", "-n", "25", "--seed", "20261129",
         "--request-timeout", "20"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert " passed" in out and "generated" in out, out[-2000:]
