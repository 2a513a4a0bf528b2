"""The whole buyer path with the CLI only (`python -m buyer_cli`), against a live
marketplace whose node is served by a real runner process (Docker, a user-defined bridge
network, ports published on 127.0.0.1, the runner's push websocket to uvicorn): `login`
with a password, `ssh-keys add`, `templates`, `bid --template cuda-ssh --image … --ssh`,
`wait`, `ssh LEASE -- …` executing the real OpenSSH client (/usr/bin/ssh) with the key,
`stop`, `lease` with the exact charge and its 85/15 split, `wallet` agreeing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from marketplace import book
from marketplace.models import Lease
from settlement.checks import first_violation
from settlement.money import format_usd, lease_cost
from settlement.split import split
from tests.conftest import DATA, require_or_skip
from tests.e2e.conftest import runner_factory  # noqa: F401 (fixture)
from tests.factories import funded_buyer, in_a_day, registered_node
from tests.support.containers import inspected
from tests.support.ssh import key_pair, port_open
from tests.support.waiting import wait_until

from .conftest import PASSWORD

pytestmark = [pytest.mark.e2e, pytest.mark.docker]
TITAN_DUMP = DATA / "nvidia-smi" / "titan-v-x1.driver-560.35.03.txt"  # CUDA 12.6 >= 12.4
MARKET = "titan-v"
ASK_PRICE = 2_400_000  # micro-USD per GPU-hour: the trade price (the ask rests)
SSH = Path("/usr/bin/ssh")


def test_the_buyer_path_with_the_cli_only(gm, server, tmp_path, docker_client, ssh_image,
                                          lease_network, runner_factory):  # noqa: F811
    if not SSH.exists():
        require_or_skip("no OpenSSH client at /usr/bin/ssh (Debian's openssh-client)")
    provider, node, token = registered_node(TITAN_DUMP, name="titan-cli")
    node.gpus.all().delete()  # the runner registers them itself
    runner = runner_factory(server, token, TITAN_DUMP)
    assert runner.register().returncode == 0, runner.output()
    runner.start(network=lease_network, extra=("--public-host", "127.0.0.1"))
    book.place_ask(provider_id=provider.pk, node_id=node.pk, market_slug=MARKET,
                   price=ASK_PRICE, gpus=1, available_until=in_a_day())
    buyer = funded_buyer(20)

    def ok(*args: str, **env) -> str:
        done = gm(*args, HOME=str(tmp_path), **env)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    ok("login", "--url", server, "--username", buyer.username, stdin=PASSWORD + "\n")
    pair = key_pair(comment="me@laptop")
    public, private = tmp_path / "id_ed25519.pub", tmp_path / "id_ed25519"
    public.write_text(pair.public_line + "\n")
    private.write_text(pair.private_openssh())
    private.chmod(0o600)
    assert "SHA256:" in ok("ssh-keys", "add", str(public))
    assert any(line.split()[0] == "cuda-ssh" for line in ok("templates").splitlines())

    placed = json.loads(ok("bid", MARKET, "--gpus", "1", "--price", "2.60", "--hours", "1",
                           "--template", "cuda-ssh", "--image", ssh_image, "--ssh", "--json"))
    [lease_id] = placed["leases"]
    waited = ok("wait", str(lease_id), "--timeout", "60", "--interval", "0.5")
    m = re.search(r"ssh -p (\d+) root@127\.0\.0\.1", waited)
    assert m, waited
    port = int(m.group(1))

    # the lease's own command, with what a user adds after `--`: the key, a first-contact
    # host key policy, and a remote command; the sshd may still be starting: retried
    options = ("-i", str(private), "-o", "StrictHostKeyChecking=no", "-o",
               "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o",
               "ConnectTimeout=5")
    done = wait_until("the real ssh client to log in", lambda: _ssh(gm, lease_id, options,
                                                                    tmp_path), timeout=30)
    assert done.stdout.strip() == "root", done.stderr
    stranger = tmp_path / "stranger"
    stranger.write_text(key_pair().private_openssh())
    stranger.chmod(0o600)
    refused = gm("ssh", str(lease_id), "--", "-i", str(stranger), *options[2:], "true",
                 HOME=str(tmp_path))
    assert refused.returncode == 255 and "Permission denied" in refused.stderr

    stopped = ok("stop", str(lease_id))
    ended = Lease.objects.get(pk=lease_id)
    seconds = int((ended.ended_at - ended.started_at).total_seconds())
    cost = lease_cost(ASK_PRICE, 1, seconds)
    parts = split(cost, 1500)
    assert (ended.status, ended.cost, ended.provider_amount, ended.platform_fee) == \
        ("cancelled", cost, parts.provider, parts.platform_fee)
    assert stopped.strip() == f"lease {lease_id}: cancelled; cost ${format_usd(cost)}"
    shown = ok("lease", str(lease_id)).splitlines()
    assert f"cost:     ${format_usd(cost)} (provider ${format_usd(parts.provider)}, " \
           f"platform ${format_usd(parts.platform_fee)})" in shown
    wallet = json.loads(ok("wallet", "--json"))
    assert (wallet["available"], wallet["held"]) == (format_usd(20_000_000 - cost),
                                                     "0.000000")
    assert first_violation() is None
    wait_until("the runner to remove the container",
               lambda: not inspected(docker_client, id=ended.container_id), timeout=30)
    assert not port_open(port)


def _ssh(gm, lease_id: int, options: tuple[str, ...], home: Path):
    """`gpumarket ssh LEASE -- OPTIONS id -un` when it logged in (exit 0), else None."""
    done = gm("ssh", str(lease_id), "--", *options, "id", "-un", HOME=str(home))
    return done if done.returncode == 0 else None
