"""/ws/markets/<slice market>/: a MIG slice market's slug (with its dots) routes to the
market feed like any other market (the `gpuclass` converter; docs/CATALOG.md)."""

import pytest
from asgiref.sync import async_to_sync

from tests.factories import ensure_catalog
from tests.frontend.conftest import connect, recv

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("clean_channel_layer")]
SLICE = "h200-sxm-141gb.3g.71gb"


def test_a_slice_market_has_its_own_feed():
    ensure_catalog()

    async def scenario():
        comm, connected, _ = await connect(f"/ws/markets/{SLICE}/")
        assert connected
        snap = await recv(comm)
        await comm.disconnect()
        _, unknown, code = await connect("/ws/markets/h200-sxm-141gb.9g.1gb/")
        return snap, unknown, code

    snap, unknown, code = async_to_sync(scenario)()
    assert snap["type"] == "snapshot" and snap["market"] == SLICE
    assert snap["asks"] == [] and snap["bids"] == []
    assert not unknown and code == 4404
