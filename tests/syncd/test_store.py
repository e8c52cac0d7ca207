"""The run's Redis keys (syncd.store), against a real Redis."""

import json
import time

import pytest

from syncd.connection import connect
from syncd.fence import Lease
from syncd.keys import lease_key
from syncd.store import KEPT_AFTER_END, RunStore

pytestmark = pytest.mark.integration

FULL = b"f" * 3000  # three chunks of 1,024 bytes
MOMENTUM = b"m" * 1500


@pytest.fixture
def store(redis_url):
    return RunStore(connect(redis_url), 7, chunk_bytes=1024)


def keys(store: RunStore, part: str) -> list[str]:
    return sorted(k.decode() for k in store.client.scan_iter(match=store.key(part) + "*"))


def test_a_publish_deletes_the_messages_of_the_updates_it_merged(store):
    store.push_update("a", 1, 0, 4, b"u" * 2500)
    store.push_update("b", 1, 0, 4, b"v" * 10)
    merged = store.read_updates()
    assert len(keys(store, "blob")) == 4  # 3 chunks and 1

    store.publish(0, 1, FULL, None, MOMENTUM, {"a": 4, "b": 4}, 10, keep=0, merged=merged)

    assert keys(store, "blob") == []
    assert store.full(0) == FULL and store.momentum(0) == MOMENTUM


def test_refused_updates_lose_their_messages_with_or_without_a_handled_mark(store):
    store.push_update("a", 1, 0, 4, b"u" * 2500)
    store.push_update("b", 1, 0, 4, b"v" * 10)
    first, second = store.read_updates()

    store.drop_updates([first])
    store.mark_handled(0, {"b": 4}, [second])

    assert keys(store, "blob") == []
    assert store.handled(0) == {"b": 4}


def test_a_published_fragment_replaces_the_version_before(store):
    for version in range(1, 5):
        store.publish(0, version, FULL + bytes([version]), None, MOMENTUM, {}, 1, keep=0)

    assert store.full(0) == FULL + bytes([4])
    assert {k.split(":")[4] for k in keys(store, "full:0:")} == {"4"}
    assert {k.split(":")[4] for k in keys(store, "momentum:0:")} == {"4"}
    assert all(store.client.ttl(k) == -1 for k in keys(store, "full:0:"))  # state, not a cache


def test_a_lossy_downlink_keeps_as_many_differences_as_it_is_told(store):
    for version in range(1, 6):
        store.publish(0, version, FULL, b"d" * 1100, MOMENTUM, {}, 1, keep=2)

    assert store.differences(0, [3, 4, 5]) == [None, b"d" * 1100, b"d" * 1100]
    assert {k.split(":")[4] for k in keys(store, "pub:0:")} == {"4", "5"}


def test_an_ended_run_keeps_only_its_status_and_logs(store):
    store.put_spec("decoupled", {"islands": []}, "00")
    store.set_epoch("a", 1)
    store.push_update("a", 1, 0, 4, b"u" * 2500)
    store.publish(0, 1, FULL, b"d" * 10, MOMENTUM, {"a": 4}, 10, keep=2)
    store.heartbeat("a", 1, 4, 128, state="training")
    store.save_cursor("a", {"step": 4})
    store.put_log("a", ["a line"])
    store.put_status({"state": "running"})
    store.client.set(store.key("lease"), "1:syncd")

    store.release(linger_s=60)

    assert store.run_id not in RunStore.active_runs(store.client)
    left = [k.decode()[len(store.prefix):]
            for k in store.client.scan_iter(match=store.prefix + "*")]
    lingering = [k for k in left if 0 < store.client.ttl(store.key(k)) <= 60]
    lasting = sorted(set(left) - set(lingering))
    assert lasting == ["log:a", "status", "status_seq"]  # the log has a week's TTL of its own
    assert {k.split(":")[0] for k in lasting} <= set(KEPT_AFTER_END)
    assert not [k for k in left if k.split(":")[0] in ("blob", "full", "pub", "momentum",
                                                       "updates", "lease")]
    assert store.status()["state"] == "running"


def test_a_deleted_run_keeps_nothing(store):
    store.put_status({"state": "stopped"})
    store.publish(0, 1, FULL, None, MOMENTUM, {}, 10, keep=0)

    store.release(keep=(), linger_s=1)

    assert all(store.client.ttl(k) > 0 for k in store.client.scan_iter(match=store.prefix + "*"))
    assert keys(store, "full") == [] and keys(store, "momentum") == []


def test_the_newest_update_id_is_the_last_stream_entrys(store):
    assert store.newest_update_id() is None
    store.push_update("a", 1, 0, 4, b"u")
    store.push_update("b", 1, 0, 4, b"v")
    assert store.newest_update_id() == store.read_updates()[-1].stream_id


def test_the_chaos_progress_is_kept_for_a_restarted_syncd(store):
    assert store.chaos_progress() == {}
    store.start_chaos(12.5, {"a": "us-east"})
    store.chaos_done(3)
    assert store.chaos_progress() == {"start": "12.5", "done": "3",
                                      "islands": '{"a": "us-east"}'}


def test_a_fault_set_by_syncd_is_what_the_island_reads(store):
    store.set_fault("a", "straggle", time.time() + 30, 4.0, 30)
    assert store.fault("a")["factor"] == 4.0
    assert store.faults(["a", "b"]) == {"a": "straggle"}
    assert 90 - 2 <= store.client.ttl(store.key("fault", "a")) <= 90


def test_the_raw_spec_is_the_spec_as_stored(store):
    assert store.raw_spec() is None
    store.put_spec("decoupled", {"islands": []}, "00")
    assert json.loads(store.raw_spec()) == store.spec()

def test_a_store_without_a_lease_writes_as_before_and_a_lease_must_be_for_its_run(redis_url):
    client = connect(redis_url)
    store = RunStore(client, 7)
    store.publish(0, 1, b"v1", None, b"m", {}, 10, keep=16)
    assert store.versions() == {0: 1}
    with pytest.raises(ValueError, match="lease is for run 8"):
        RunStore(client, 7, fence=Lease("8", "syncd-a", 1, lease_key(8)))


def test_a_run_is_active_from_its_spec_until_its_release(store):
    assert not store.is_active()

    store.put_spec("decoupled", {"islands": []}, "00")
    assert store.is_active()
    assert not RunStore(store.client, 8).is_active()  # another run of the same Redis

    store.release()
    assert not store.is_active()
