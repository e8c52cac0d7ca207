"""The run's own keys (syncd.store: its spec, flags, chaos progress, status and the
release of an ended run), against a real Redis. Its parts have tests of their own:
test_update_stream, test_globals_store, test_island_signals, test_run_keys."""

import json
import time

import pytest

from syncd.records import Heartbeat
from syncd.store import KEPT_AFTER_END, RunStore
from tests.syncd.runs import FULL, chunk_store, stored_keys

pytestmark = pytest.mark.integration

@pytest.fixture
def store(redis_url):
    return chunk_store(redis_url)


def test_an_ended_run_keeps_only_its_status_and_logs(store):
    store.put_spec("decoupled", {"islands": []}, "00")
    store.set_epoch("a", 1)
    store.updates.push_update("a", 1, 0, 4, b"u" * 2500)
    store.globals.publish(0, 1, FULL, b"d" * 10, {"a": 4}, 10, keep=2)
    store.signals.heartbeat("a", Heartbeat.bare(1, time.time(), 4, 128))
    store.signals.save_cursor("a", {"step": 4})
    store.signals.put_log("a", ["a line"])
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
    store.globals.publish(0, 1, FULL, None, {}, 10, keep=0)

    store.release(keep=(), linger_s=1)

    assert all(store.client.ttl(k) > 0 for k in store.client.scan_iter(match=store.prefix + "*"))
    assert stored_keys(store, "full") == [] and stored_keys(store, "momentum") == []


def test_the_chaos_progress_is_kept_for_a_restarted_syncd(store):
    assert store.control.chaos_progress() == {}
    store.control.start_chaos(12.5, {"a": "us-east"})
    store.control.set_chaos_done(3)
    assert store.control.chaos_progress() == {"start": "12.5", "done": "3",
                                              "islands": '{"a": "us-east"}'}


def test_the_raw_spec_is_the_spec_as_stored(store):
    assert store.raw_spec() is None
    store.put_spec("decoupled", {"islands": []}, "00")
    assert json.loads(store.raw_spec()) == store.spec()


def test_a_run_is_active_from_its_spec_until_its_release(store):
    assert not store.is_active()

    store.put_spec("decoupled", {"islands": []}, "00")
    assert store.is_active()
    assert not RunStore(store.client, 8).is_active()  # another run of the same Redis

    store.release()
    assert not store.is_active()


def test_the_first_tokenizer_claimed_is_the_runs_and_a_later_one_reads_it_back(store):
    from diloco.tokenizer import TokenizerError, check_tokenizer

    assert store.claim_tokenizer("a" * 64) == "a" * 64
    assert store.claim_tokenizer("b" * 64) == "a" * 64  # a host whose tokenizer differs
    check_tokenizer("a" * 64, store.claim_tokenizer("a" * 64))
    with pytest.raises(TokenizerError, match="is not the run's"):
        check_tokenizer("b" * 64, store.claim_tokenizer("b" * 64))
