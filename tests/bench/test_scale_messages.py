"""bench scale's count of the update messages on the data plane, against a real data
plane holding real pushed updates."""

import pytest

from bench.scale import message_bytes
from syncd.connection import connect
from syncd.store import RunStore

pytestmark = pytest.mark.integration


def test_the_messages_in_flight_are_the_bytes_of_the_runs_update_chunks(redis_url,
                                                                         dataplane_url):
    store = RunStore(connect(redis_url), 7, data=connect(dataplane_url))
    other = RunStore(connect(redis_url), 8, data=connect(dataplane_url))
    pattern = store.key("blob", "*")
    assert message_bytes(store.data, pattern) == 0

    store.updates.push_update("a", 1, 0, 4, b"u" * 20_000)
    store.updates.push_update("b", 1, 2, 9, b"v" * 5_000)
    other.updates.push_update("a", 1, 0, 4, b"w" * 7_000)

    assert message_bytes(store.data, pattern) == 25_000
    store.updates.forget_updates(store.updates.read_updates())
    assert message_bytes(store.data, pattern) == 0
