"""Issue 10, item 1 (runner side of token rotation): when the provider rotates a node's
runner token, the running runner's next call gets 401 and it exits with status 3 and a
message that says the token was rotated and gives the `register` command, filled in, that
puts the new one in place; that command works. Real marketplace (pytest-django's live
server), the runner CLI as its own process, simulated GPUs."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from providers.models import Node
from providers.services import node_rotate_token
from tests.e2e.conftest import Runner
from tests.factories import H100_DUMP, registered_node
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]


def _heartbeat_after(node_id: int, moment) -> bool:
    seen = Node.objects.get(pk=node_id).last_heartbeat_at
    return seen is not None and seen > moment


def test_a_rotated_token_stops_the_runner_with_the_fix(live_server, tmp_path):
    _provider, node, token = registered_node(H100_DUMP, name="rotated-node")
    state = tmp_path / "runner"
    runner = Runner(live_server.url, token, H100_DUMP, state)
    assert runner.register().returncode == 0
    try:
        started = timezone.now()
        runner.start(runtime="process")  # no lease runs: any user may run this one
        wait_until("the runner to heartbeat", lambda: _heartbeat_after(node.pk, started))
        new_token = node_rotate_token(user_id=node.provider.user_id, node_id=node.pk).runner_token
        wait_until("the runner to exit", lambda: runner.proc.poll() is not None)
        assert runner.proc.returncode == 3, runner.output()
        last = runner.output().strip().splitlines()[-1]
        assert last == (
            "gpumarket-runner: the marketplace refused the runner token (401): it was rotated "
            "(provider portal, or POST /api/v1/nodes/<id>/rotate-token/) or the node was "
            f"deleted; save the new one with `gpumarket-runner register --url {live_server.url} "
            f"--token NEW_TOKEN --state-dir {state} --simulate {H100_DUMP}`, then start `run` "
            "again (restarting with the old token does not help)"), runner.output()
        assert token not in runner.output() and new_token not in runner.output()

        # the advice works: register with the new token, run again
        runner.token = new_token
        assert runner.register().returncode == 0
        assert json.loads((state / "config.json").read_text())["token"] == new_token
        restarted = timezone.now()
        runner.start(runtime="process")
        wait_until("the restarted runner to heartbeat",
                   lambda: _heartbeat_after(node.pk, restarted))
        assert runner.proc.poll() is None
    finally:
        runner.stop()
