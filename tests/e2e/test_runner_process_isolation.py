"""Issue 10, item 1: a buyer's workload under the process runtime never gets the runner's
token. Real marketplace (pytest-django's live server on the test PostgreSQL), the real
runner CLI as its own process (`python -m providers.runner run --runtime process`, as root:
each lease runs as a user of its own), a lease whose command searches the whole filesystem,
every process's environment and command line, and its own environment for runner tokens
(`gmr_…`) and prints what it finds. The buyer's log tail, the lease API and the pages never
contain the token; the search itself works (it finds a decoy token in a world-readable file).

The GPUs are simulated from the recorded 8 × H100 dump (`--simulate`); nothing is mocked.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest
from django.test import Client

from marketplace import book
from marketplace.models import Lease
from providers.runner.process_runtime import DEFAULT_UIDS
from tests.conftest import require_or_skip
from tests.e2e.conftest import Runner
from tests.factories import H100_DUMP, funded_buyer, in_a_day, registered_node
from tests.support.api import client_for
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

# Everything a workload can reach: files (not /proc, /sys, /dev: they are read below or
# are devices), every process's environ and cmdline, its own env; tokens only, deduplicated.
SEARCH = r"""
echo "whoami uid=$(id -u) gid=$(id -g) groups=$(id -G) pwd=$(pwd) home=$HOME"
echo "--- env"; env | sort
echo "--- state dir"; cat "$1/config.json" 2>&1 | head -3; ls -la "$1" 2>&1 | head -3
echo "--- tokens in /proc"
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\0' '\n' < "$f"; done 2>/dev/null \
  | grep -ao 'gmr_[A-Za-z0-9_-]\{20,\}' | sort -u
echo "--- tokens in files"
grep -rIash -o --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev \
  'gmr_[A-Za-z0-9_-]\{20,\}' / | sort -u
echo SEARCH-DONE
"""


@pytest.fixture
def decoy():
    """A token-shaped string in a world-readable file under /tmp: the search must find it
    (proof that it reads what anyone may read)."""
    where = Path(tempfile.mkdtemp(prefix="gpumarket-decoy-"))
    os.chmod(where, 0o755)
    token = "gmr_" + secrets.token_urlsafe(32)
    (where / "found-me.txt").write_text(token + "\n")
    os.chmod(where / "found-me.txt", 0o644)
    yield token
    shutil.rmtree(where, ignore_errors=True)


@pytest.mark.timeout(420)
def test_a_lease_searching_everything_never_finds_the_runner_token(live_server, tmp_path,
                                                                    decoy):
    if os.geteuid() != 0:
        require_or_skip("the process runtime gives each lease a user of its own only when "
                        "the runner is root (run the tests as root, as CI does)")
    provider, node, token = registered_node(H100_DUMP, name="isolated-node")
    state = tmp_path / "runner"
    runner = Runner(live_server.url, token, H100_DUMP, state)
    registered = runner.register()
    assert registered.returncode == 0, registered.stderr
    try:
        runner.start(runtime="process")
        buyer = funded_buyer(100)
        book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=None,
                       price=2_490_000, gpus=8, available_until=in_a_day())
        [lease] = book.place_bid(
            buyer_id=buyer.pk, market_slug="h100-sxm-80gb", price=2_490_000, gpus=2,
            duration_seconds=3600, image="ignored:latest",
            command=["sh", "-c", SEARCH, "search", str(state)]).leases
        api = client_for(buyer)

        def tail() -> str:
            answer = api.get(f"/api/v1/leases/{lease.pk}/logs/")
            return answer.json().get("tail") or "" if answer.status_code == 200 else ""

        # the search walks every readable file of the host: a minute or two on a busy one
        done = wait_until("the search to finish and its tail to reach the buyer",
                          lambda: "SEARCH-DONE" in tail() and Lease.objects.get(
                              pk=lease.pk).status in ("completed", "failed"), timeout=280)
        out = runner.output()
    finally:
        runner.stop()
    assert done
    text = tail()
    assert decoy in text, text  # the search reads what any user may read...
    assert token not in text, text  # ...and never the runner's token
    whoami = next(line for line in text.splitlines() if line.startswith("whoami "))
    uid = int(whoami.split("uid=")[1].split()[0])
    assert uid in DEFAULT_UIDS, whoami  # a user of its own, no groups of the runner's
    assert f"groups={uid} " in whoami, whoami
    assert f"pwd={state}" not in whoami and str(state) not in whoami.split("home=")[1]
    env = text.split("--- env\n")[1].split("--- state dir")[0]
    names = {line.split("=", 1)[0] for line in env.splitlines() if "=" in line}
    # only the lease's env (and what the marketplace puts in it) and a minimal base
    assert "DATABASE_URL" not in names and not any(n.startswith("GPUMARKET_RUNNER")
                                                   for n in names), env
    assert {"PATH", "HOME", "NVIDIA_VISIBLE_DEVICES"} <= names
    assert "Permission denied" in text.split("--- state dir\n")[1]
    assert Lease.objects.get(pk=lease.pk).status == "completed"
    assert "NOTHING ELSE IS ISOLATED" in out, out

    everywhere = [api.get(f"/api/v1/leases/{lease.pk}/").content.decode(),
                  api.get("/api/v1/leases/").content.decode()]
    pages = Client()
    pages.force_login(buyer)
    everywhere.append(pages.get("/leases/").content.decode())
    owner = Client()
    owner.force_login(provider)
    everywhere += [owner.get(f"/provider/nodes/{node.pk}/").content.decode(),
                   client_for(provider).get(f"/api/v1/leases/{lease.pk}/logs/").content
                   .decode()]
    assert all(token not in body for body in everywhere)
    assert sum(decoy in body for body in everywhere) >= 1  # the tail is shown somewhere
