"""`/ws/runner/`: the runner's websocket, on which the marketplace pushes lease notices.

Handshake: `Authorization: Bearer <runner token>` (as for the HTTP endpoints,
providers/auth.py), and an `Origin` whose host is in ALLOWED_HOSTS (every websocket route
passes channels' AllowedHostsOriginValidator; the runner sends its marketplace URL). A
missing, malformed, unknown or revoked token: the connection is accepted and closed at
once with code 4401. When the provider rotates the node's token, every open connection
made with the old one is closed with 4401 at once (reason "runner token rotated"; a
connection opening at that moment checks its token again once it joined the node's group,
so none slips through).

Server → runner (JSON text frames, no lease data, no secret):
- on connect: `{"type": "hello", "node": <node id>, "seq": N, "notices": "complete" |
  "partial"}`, N the node's last sequence number; "partial" with the in-memory channel
  layer, where only this process's own changes are pushed (push.completeness);
- `{"type": "leases_changed", "seq": N}` after a commit that created a lease of the node,
  changed a lease's state or its preemption deadline (providers/push.py).
The runner answers either with GET /api/v1/runner/leases/. What the runner sends is ignored.
"""

from __future__ import annotations

import asyncio
import json
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from providers import push

log = logging.getLogger("gpumarket.runner_push")

CLOSE_UNAUTHENTICATED = 4401


def _bearer(scope) -> str | None:
    """The token of an `Authorization: Bearer <token>` handshake header, else None."""
    for name, value in scope.get("headers") or []:
        if name.lower() == b"authorization":
            parts = value.decode("latin-1").split()
            if len(parts) == 2 and parts[0] == "Bearer":
                return parts[1]
            return None
    return None


@database_sync_to_async
def _node_id(token_hash: str) -> int | None:
    from providers.models import Node

    return Node.objects.filter(token_hash=token_hash).values_list("pk", flat=True).first()


class RunnerConsumer(AsyncWebsocketConsumer):
    """One runner connection: joins its node's group and forwards its notices."""

    node_id: int | None = None
    group: str = ""
    _token_hash: str = ""  # SHA-256 of the token this connection was opened with
    _local_loop: asyncio.AbstractEventLoop | None = None
    _ns: str = ""  # push.namespace() of this deployment

    async def connect(self) -> None:
        from providers.models import hash_token

        token = _bearer(self.scope)
        self._token_hash = hash_token(token) if token else ""
        node_id = await _node_id(self._token_hash) if token else None
        await self.accept()
        if node_id is None:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.node_id, self.group = node_id, push.node_group(node_id)
        self._ns = push.namespace()
        if push._is_local(self.channel_layer):
            self._local_loop = asyncio.get_running_loop()
            push.register_loop(self._local_loop)
        await self.channel_layer.group_add(self.group, self.channel_name)
        # a rotation that committed after the check above sent its notice before this
        # connection joined the group: check once more
        if await _node_id(self._token_hash) != node_id:
            await self._close_rotated()
            return
        seq = await asyncio.to_thread(push.current_seq, node_id)
        await self.send(text_data=json.dumps({"type": "hello", "node": node_id, "seq": seq,
                                              "notices": push.completeness(self.channel_layer)}))
        log.info("runner push: node %s connected", node_id)

    async def disconnect(self, code) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if self._local_loop is not None:
            push.unregister_loop(self._local_loop)
            self._local_loop = None

    async def receive(self, text_data=None, bytes_data=None) -> None:
        return  # nothing is expected from the runner

    async def runner_token_rotated(self, event) -> None:
        """The node's token was rotated: close unless this connection's token is the new
        one (a runner that reconnected with it at once)."""
        if event.get("ns", self._ns) != self._ns:  # another deployment's Redis database
            return
        if await _node_id(self._token_hash) != self.node_id:
            await self._close_rotated()

    async def _close_rotated(self) -> None:
        log.info("runner push: node %s: runner token rotated; closing", self.node_id)
        await self.close(code=CLOSE_UNAUTHENTICATED, reason="runner token rotated")

    async def runner_leases_changed(self, event) -> None:
        if event.get("ns", self._ns) != self._ns:  # another deployment's Redis database
            return
        await self.send(text_data=json.dumps({"type": "leases_changed", "seq": event["seq"]}))
