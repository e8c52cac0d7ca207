"""The run's update stream (syncd.update_stream): update messages in chunks, the
entries that name them, and their deletion and trimming, against a real Redis."""

import pytest

from syncd.bulk import BulkError
from syncd.connection import connect
from syncd.update_stream import UpdateStream
from tests.syncd.runs import stored_keys

pytestmark = pytest.mark.integration


@pytest.fixture
def store(redis_url):
    return UpdateStream(connect(redis_url), 7, chunk_bytes=1024)


def test_the_newest_update_id_is_the_last_stream_entrys(store):
    assert store.newest_update_id() is None
    store.push_update("a", 1, 0, 4, b"u")
    store.push_update("b", 1, 0, 4, b"v")
    assert store.newest_update_id() == store.read_updates()[-1].stream_id


def test_an_update_is_read_back_with_its_island_epoch_fragment_seq_and_message(store):
    store.push_update("a", 2, 1, 9, b"u" * 2500)

    [ref] = store.read_updates()

    assert (ref.island, ref.epoch, ref.fragment, ref.seq) == ("a", 2, 1, 9)
    assert ref.blob.chunks == 3 and ref.blob.size == 2500
    assert store.update_message(ref, max_bytes=4096) == b"u" * 2500


def test_updates_are_read_in_order_after_the_id_given(store):
    for seq in range(3):
        store.push_update("a", 1, 0, seq, b"u")

    first, *rest = store.read_updates()

    assert [ref.seq for ref in store.read_updates(after=first.stream_id)] == [1, 2]
    assert [ref.seq for ref in store.read_updates(count=2)] == [0, 1]
    assert store.read_updates(after=rest[-1].stream_id) == []


def test_an_update_message_larger_than_allowed_is_refused(store):
    store.push_update("a", 1, 0, 0, b"u" * 2500)
    [ref] = store.read_updates()

    with pytest.raises(BulkError):
        store.update_message(ref, max_bytes=1000)


def test_dropped_updates_lose_their_messages_but_keep_their_stream_entries(store):
    store.push_update("a", 1, 0, 0, b"u" * 2500)
    store.push_update("b", 1, 0, 0, b"v")
    first, second = store.read_updates()

    store.drop_updates([first, second])
    store.drop_updates([])

    assert stored_keys(store, "blob") == []
    assert [ref.stream_id for ref in store.read_updates()] == [first.stream_id,
                                                                second.stream_id]
