"""The run's update stream (syncd.update_stream): update messages in chunks, the
entries that name them, and their deletion and trimming, against a real Redis."""

import threading

import pytest

from syncd.bulk import BulkError
from syncd.connection import connect
from syncd.update_stream import MAX_TICKETS, BadEntry, UpdateStream
from tests.syncd.runs import stored_keys
from webapp.processes import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def store(redis_url):
    return UpdateStream(connect(redis_url), 7, chunk_bytes=1024)


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


def test_an_island_holds_an_upload_slot_at_once_while_fewer_than_the_slots_are_held(store):
    assert store.wait_for_slot("a", 1, 0, 8, slots=2) >= 0.0
    store.wait_for_slot("b", 1, 0, 8, slots=2)

    assert store.slot_holders(2) == [b"1:0:8:a", b"1:0:8:b"]


def test_an_island_waits_in_line_until_syncd_frees_a_slot(store):
    store.wait_for_slot("a", 1, 0, 8, slots=2)
    store.wait_for_slot("b", 1, 0, 8, slots=2)
    waited: list[float] = []
    third = threading.Thread(target=lambda: waited.append(
        store.wait_for_slot("c", 1, 0, 8, slots=2)))
    third.start()
    wait_for(lambda: store.slot_holders(3)[2:] == [b"1:0:8:c"], 10, "c in line")
    third.join(timeout=0.3)
    assert third.is_alive() and waited == []

    store.free_slots([b"1:0:8:a"])
    third.join(timeout=10)

    assert waited and store.slot_holders(2) == [b"1:0:8:b", b"1:0:8:c"]


def test_an_island_whose_ticket_was_taken_off_queues_again(store):
    store.wait_for_slot("a", 1, 0, 8, slots=1)
    done = threading.Event()
    waiting = threading.Thread(target=lambda: (store.wait_for_slot("b", 1, 0, 8, slots=1),
                                               done.set()))
    waiting.start()
    wait_for(lambda: b"1:0:8:b" in store.slot_holders(2), 10, "b in line")

    store.free_slots([b"1:0:8:b"])  # stale, say: b is queued again, behind a
    wait_for(lambda: b"1:0:8:b" in store.slot_holders(2), 10, "b in line again")
    assert not done.is_set()
    store.free_slots([b"1:0:8:a"])
    waiting.join(timeout=10)

    assert done.is_set() and store.slot_holders(2) == [b"1:0:8:b"]


def publishing(store: UpdateStream, drain_s: float) -> tuple[threading.Thread, list[list]]:
    """A publish of fragment 0's version 1 on a thread; what holds the slots once it
    writes (two slots)."""
    seen: list[list] = []

    def publish() -> None:
        with store.slot_for_publish(0, 1, slots=2, drain_s=drain_s):
            seen.append(store.slot_holders(2))

    thread = threading.Thread(target=publish)
    thread.start()
    return thread, seen


def test_a_publish_writes_once_syncd_read_one_of_the_updates_that_filled_the_slots(store):
    for island in ("a", "b"):
        store.wait_for_slot(island, 1, 0, 8, slots=2)
        store.push_update(island, 1, 0, 8, b"u" * 2500)
    ticket = b"publish:0:0:1"

    thread, seen = publishing(store, drain_s=60)
    wait_for(lambda: store.slot_holders(1) == [ticket], 10, "the publish at the head")
    thread.join(timeout=0.3)
    assert thread.is_alive() and seen == []

    first = store.read_updates()[0]
    store.forget_updates([first])  # as syncd does once it read and verified it
    store.free_slots([b"1:0:8:a"])
    thread.join(timeout=10)

    assert seen == [[ticket, b"1:0:8:b"]] and store.slot_holders(3) == [b"1:0:8:b"]


def test_a_publish_waits_for_no_update_not_yet_written_and_no_longer_than_told(store):
    for island in ("a", "b"):
        store.wait_for_slot(island, 1, 0, 8, slots=2)
    thread, seen = publishing(store, drain_s=60)
    thread.join(timeout=10)
    assert seen == [[b"publish:0:0:1", b"1:0:8:a"]]

    for island in ("a", "b"):
        store.push_update(island, 1, 0, 8, b"u" * 2500)
    thread, seen = publishing(store, drain_s=0.2)
    thread.join(timeout=10)
    assert seen == [[b"publish:0:0:1", b"1:0:8:a"]] and store.slot_holders(3) == [
        b"1:0:8:a", b"1:0:8:b"]


def test_a_flood_of_tickets_is_cut_to_the_longest_queue_syncd_keeps(store):
    """An island may RPUSH what it likes to its run's queue: syncd keeps the first
    MAX_TICKETS, so freeing stale tickets (an LREM each) costs it no more."""
    store.data.rpush(store.key("uploads"), *(f"1:0:{seq}:a" for seq in range(20_000)))

    assert store.slot_holders(2) == [b"1:0:0:a", b"1:0:1:a"]
    assert store.data.llen(store.key("uploads")) == MAX_TICKETS


@pytest.mark.parametrize("fields", [
    {b"chunks": b"1000000", b"bytes": b"10"},  # more chunks than 10 bytes fill
    {b"chunks": b"900000000000", b"bytes": b"1000000000000000"},  # past the model's
])
def test_an_entry_claiming_more_than_its_size_or_the_model_holds_is_bad(store, fields):
    store.max_update_bytes = 1 << 20
    entry = {b"island": b"a", b"epoch": b"1", b"fragment": b"0", b"seq": b"1", **fields}

    assert isinstance(store.parse_entry(b"1-0", entry), BadEntry)
