"""The published globals (syncd.globals_store): a merge's commit, the versions it
replaces, the lossy downlink's differences and the handled seqs, against a real Redis.
The merged updates come from the run's update stream, so the store is the whole
RunStore."""

import pytest

from syncd.store import RunStore
from tests.syncd.runs import FULL, chunk_store, stored_keys

pytestmark = pytest.mark.integration

@pytest.fixture
def store(redis_url):
    return chunk_store(redis_url)


def test_a_publish_deletes_the_messages_of_the_updates_it_merged(store):
    store.updates.push_update("a", 1, 0, 4, b"u" * 2500)
    store.updates.push_update("b", 1, 0, 4, b"v" * 10)
    merged = store.updates.read_updates()
    assert len(stored_keys(store, "blob")) == 4  # 3 chunks and 1

    store.globals.publish(0, 1, FULL, None, {"a": 4, "b": 4}, 10, keep=0, merged=merged)

    assert stored_keys(store, "blob") == []
    assert store.globals.full(0) == FULL
    assert stored_keys(store, "momentum") == []  # syncd's files hold it, not Redis


def test_refused_updates_lose_their_messages_with_or_without_a_handled_mark(store):
    store.updates.push_update("a", 1, 0, 4, b"u" * 2500)
    store.updates.push_update("b", 1, 0, 4, b"v" * 10)
    first, second = store.updates.read_updates()

    store.updates.drop_updates([first])
    store.globals.mark_handled(0, {"b": 4}, [second])

    assert stored_keys(store, "blob") == []
    assert store.globals.handled(0) == {"b": 4}


def test_a_published_fragment_replaces_the_version_before(store):
    for version in range(1, 5):
        store.globals.publish(0, version, FULL + bytes([version]), None, {}, 1, keep=0)

    assert store.globals.full(0) == FULL + bytes([4])
    assert {k.split(":")[4] for k in stored_keys(store, "full:0:")} == {"4"}
    # state, not a cache
    assert all(store.client.ttl(k) == -1 for k in stored_keys(store, "full:0:"))


def test_a_lossy_downlink_keeps_as_many_differences_as_it_is_told(store):
    for version in range(1, 6):
        store.globals.publish(0, version, FULL, b"d" * 1100, {}, 1, keep=2)

    assert store.globals.differences(0, [3, 4, 5]) == [None, b"d" * 1100, b"d" * 1100]
    assert {k.split(":")[4] for k in stored_keys(store, "pub:0:")} == {"4", "5"}


def test_a_publish_records_the_version_the_handled_seqs_and_the_tokens_merged(store):
    store.globals.publish(0, 1, FULL, None, {"a": 4, "b": 2}, 10, keep=0)
    store.globals.publish(1, 1, FULL, None, {"a": 3}, 5, keep=0)
    store.globals.publish(0, 2, FULL, None, {"a": 8}, 12, keep=0)

    assert store.globals.versions() == {0: 2, 1: 1}
    assert store.globals.handled(0) == {"a": 8, "b": 2}
    assert store.globals.handled_seq(0, "a") == 8 and store.globals.handled_seq(1, "b") == -1
    assert store.globals.handled_seqs([0, 1, 2], "a") == {0: 8, 1: 3, 2: -1}
    assert store.globals.tokens_merged() == {0: 22, 1: 5}


def test_a_fragment_never_published_has_no_full_message_or_versions(store):
    assert store.globals.full(3) is None
    assert store.globals.versions() == {} and store.globals.handled(3) == {}
    assert store.globals.differences(3, [1, 2]) == [None, None]


def test_marking_nothing_handled_and_dropping_nothing_writes_nothing(store):
    store.globals.mark_handled(0, {})

    assert stored_keys(store, "") == []


@pytest.mark.parametrize("pointer", [
    '{"key": "arch:8:full:0:1:1", "chunks": 3, "size": 3000}',  # another run's message
    '{"key": "arch:7:secret", "chunks": 1, "size": 10}',  # another key of the run
    '{"key": "arch:7:full:0:1:1", "chunks": 4611686018427387904, "size": 3000}',
    '{"key": "arch:7:full:0:1:1", "chunks": 1, "size": 4611686018427387904}',
    "junk",
])
def test_a_publish_deletes_nothing_a_pointer_it_did_not_write_names(store, pointer):
    """An island that could write the pointer (without ACL) names no key syncd deletes:
    not another run's, not another of its run's, and no more chunks than the message
    syncd wrote there could have."""
    other = chunk_store_of(store, 8)
    other.globals.publish(0, 1, FULL, None, {}, 1, keep=0)
    store.client.set("arch:7:secret", "s")
    store.client.set(store.key("full", 0), pointer)

    store.globals.publish(0, 2, FULL, None, {}, 1, keep=0)

    assert other.globals.full(0) == FULL and store.client.get("arch:7:secret") == b"s"
    assert store.globals.full(0) == FULL


@pytest.mark.parametrize("pointer", [
    '{"key": "arch:8:full:0:1:1", "chunks": 1, "size": 10}',  # another run's message
    '{"key": "arch:7:full:0:1:1", "chunks": 4611686018427387904, "size": 10}',
])
def test_keeping_a_publish_persists_nothing_a_pointer_it_did_not_write_names(store, pointer):
    """A syncd that takes a run over keeps its predecessor's last publish
    (`keep_published`): a pointer syncd could not have written makes it persist no
    chunk of another run's and no more of its own than the size allows."""
    store.data.set("arch:8:full:0:1:1:0", "x", ex=100)
    store.data.set("arch:7:full:0:1:1:1", "x", ex=100)
    store.client.set(store.key("full", 0), pointer)

    store.globals.keep_published(0)

    assert store.data.ttl("arch:8:full:0:1:1:0") > 0
    assert store.data.ttl("arch:7:full:0:1:1:1") > 0


def chunk_store_of(store: RunStore, run_id: int) -> RunStore:
    return RunStore(store.client, run_id, chunk_bytes=1024)
