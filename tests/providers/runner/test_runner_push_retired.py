"""A retired node's runner is shut out of the websocket too (marketplace/node_retire.py):
its open `/ws/runner/` connection closes with 4401 when the retirement commits, and the
old token cannot connect again (the same answer as a rotated token)."""

from __future__ import annotations

import pytest

from marketplace.node_retire import retire_node
from tests.factories import registered_node
from tests.providers.runner.test_runner_push import _closed, _recv, _ws, asgi_url  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_retiring_closes_the_runners_websocket_and_it_cannot_come_back(asgi_url):  # noqa: F811
    user, node, token = registered_node(name="to-retire")
    with _ws(asgi_url, token) as ws:
        assert _recv(ws)["type"] == "hello"
        retire_node(user_id=user.pk, node_id=node.pk)
        assert _closed(ws).code == 4401
    with _ws(asgi_url, token) as ws:
        assert _closed(ws).code == 4401
