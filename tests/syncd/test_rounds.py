"""The rounds of a run in syncd (syncd/rounds.py) against a real Redis and the real
database, driven tick by tick: updates read from the stream, checked, merged and
published, and what a restarted syncd finds again.

Updates are written into the run's stream exactly as an island would write them
(or as an attacker could).
"""

import math
import threading
import time

import pytest
import torch

from diloco.signing import island_key
from syncd.service import RunSync
from tests.syncd.runs import CONFIG, heartbeat_all, make_run_sync, send, stored_keys, write_beat
from webapp.runs.models import Event
from webapp.runs.records import DatabaseRecorder

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def rejections(sync: RunSync) -> list[str]:
    sync.recorder.flush()
    return [e.detail["reason"] for e in Event.objects.filter(run_id=sync.recorder.run_id,
                                                             kind="rejection")]


def test_it_publishes_version_zero_of_every_fragment_when_a_run_starts(run_sync):
    assert run_sync.store.globals.versions() == {0: 0, 1: 0}


def test_syncd_frees_the_upload_slot_of_each_update_it_read_merged_or_refused(run_sync):
    heartbeat_all(run_sync)
    for island, value in (("a", 0.01), ("b", float("nan"))):
        run_sync.store.updates.wait_for_slot(island, 1, 0, 4, slots=2)
        send(run_sync, island, 0, 4, value=value)
    run_sync.store.updates.wait_for_slot("a", 1, 1, 4, slots=3)  # in line, its update to come

    run_sync.tick()

    assert rejections(run_sync) and run_sync.store.updates.slot_holders(3) == [b"1:1:4:a"]


def test_syncd_frees_the_slots_of_old_epochs_lost_islands_strangers_and_handled_updates(
        run_sync):
    heartbeat_all(run_sync)
    store = run_sync.store
    store.client.rpush(store.key("uploads"), "0:0:4:a", "1:0:4:zed", "oops")
    run_sync.tick()
    assert store.updates.slot_holders(3) == []

    store.updates.wait_for_slot("b", 1, 0, 4, slots=2)
    run_sync.liveness.lost.add("b")
    run_sync.rounds.ingester.free_stale_slots(run_sync.clock(), run_sync.liveness)
    assert store.updates.slot_holders(2) == []

    # A syncd that died between a fold and freeing its slot left the ticket behind.
    store.updates.wait_for_slot("a", 1, 1, 4, slots=2)
    run_sync.rounds.sync.settle(1, "a", 4)
    run_sync.rounds.ingester.free_stale_slots(run_sync.clock(), run_sync.liveness)
    assert store.updates.slot_holders(2) == []


def test_a_publish_on_the_data_plane_holds_an_upload_slot_at_the_head_of_the_line(
        run_sync, monkeypatch):
    """The fragment is on the data plane twice while it is published: the islands
    write into the slots the publish leaves, and the publish's ticket goes with it."""
    heartbeat_all(run_sync)
    store = run_sync.store
    publish, seen = store.globals.publish, []

    def publish_seeing_the_slots(*args, **kwargs):
        seen.append(store.updates.slot_holders(2))
        return publish(*args, **kwargs)

    monkeypatch.setattr(store.globals, "publish", publish_seeing_the_slots)
    for island in ("a", "b"):
        store.updates.wait_for_slot(island, 1, 1, 8, slots=2)
    send(run_sync, "a", 0, 4)
    send(run_sync, "b", 0, 4)

    run_sync.tick()

    assert seen == [[f"publish:{store.fencing_token}:0:1".encode(), b"1:1:8:a"]]
    assert store.updates.slot_holders(3) == [b"1:1:8:a", b"1:1:8:b"]


def test_two_good_updates_merge_into_version_one(run_sync):
    heartbeat_all(run_sync)
    before = {n: t.clone() for n, t in run_sync.rounds.sync.globals[0].items()}
    send(run_sync, "a", 0, 4)
    send(run_sync, "b", 0, 4)
    run_sync.tick()
    assert run_sync.store.globals.versions()[0] == 1
    assert run_sync.store.globals.handled(0) == {"a": 4, "b": 4}
    moved = any(not torch.equal(before[n], t) for n, t in run_sync.rounds.sync.globals[0].items())
    assert moved


def test_the_next_rounds_updates_are_read_while_a_merge_is_published(run_sync, monkeypatch):
    """a's next update, sent while the merge of version 1 is being written, is folded
    into the next round before that merge is published; b's next, refused meanwhile,
    is written as handled after the merge, so that b's handled seq never goes back."""
    heartbeat_all(run_sync)
    rounds = run_sync.rounds
    save = rounds.files.save
    seen = {}

    def save_once_the_next_round_is_read(p, version, token, full, momentum):
        if (p, version) == (0, 1):
            send(run_sync, "a", 0, 8)
            send(run_sync, "b", 0, 8, tokens=7)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not (
                    "a" in rounds.sync.open_round(0) and rounds.ingester.rejections["b"]):
                time.sleep(0.01)
            seen["next round"] = sorted(rounds.sync.open_round(0))
            seen["versions"] = run_sync.store.globals.versions()
            seen["handled"] = run_sync.store.globals.handled(0)
        return save(p, version, token, full, momentum)

    monkeypatch.setattr(rounds.files, "save", save_once_the_next_round_is_read)
    send(run_sync, "a", 0, 4)
    send(run_sync, "b", 0, 4)
    run_sync.tick()

    assert seen == {"next round": ["a"], "versions": {0: 0, 1: 0}, "handled": {}}
    assert run_sync.store.globals.versions() == {0: 1, 1: 0}
    assert run_sync.store.globals.handled(0) == {"a": 4, "b": 8}
    assert any("do not match" in r for r in rejections(run_sync))


def test_a_publish_that_fails_is_published_on_the_next_pass_and_the_others_stand(
        run_sync, monkeypatch):
    heartbeat_all(run_sync)
    rounds = run_sync.rounds
    save = rounds.files.save
    failures = [OSError("the disk went away for a moment")]

    def save_failing_once(p, version, token, full, momentum):
        if p == 0 and failures:
            raise failures.pop()
        return save(p, version, token, full, momentum)

    monkeypatch.setattr(rounds.files, "save", save_failing_once)
    for fragment in (0, 1):
        send(run_sync, "a", fragment, 4)
        send(run_sync, "b", fragment, 4)

    with pytest.raises(OSError, match="went away"):
        run_sync.tick()
    assert run_sync.store.globals.versions() == {0: 0, 1: 1}

    run_sync.tick()

    assert run_sync.store.globals.versions() == {0: 1, 1: 1}
    assert run_sync.store.globals.handled(0) == {"a": 4, "b": 4}
    run_sync.recorder.flush()
    merges = Event.objects.filter(run_id=run_sync.recorder.run_id, kind="merge")
    assert sorted(e.detail["fragment"] for e in merges) == [0, 1]


def test_a_pass_whose_reading_fails_during_a_publish_ends_after_the_publish(
        run_sync, monkeypatch):
    """syncd's server rebuilds a run from Redis after a failed pass: the merge being
    published must be committed by then, not still under way."""
    heartbeat_all(run_sync)
    rounds = run_sync.rounds
    save, ingest = rounds.files.save, rounds.ingester.ingest
    reading_failed = threading.Event()
    order = []

    def save_after_the_failure(p, version, token, full, momentum):
        reading_failed.wait(30)
        order.append("saved")
        return save(p, version, token, full, momentum)

    def ingest_failing_while_publishing(now, liveness, until=None):
        if until is not None:
            reading_failed.set()
            raise ConnectionError("the control Redis went away")
        return ingest(now, liveness)

    monkeypatch.setattr(rounds.files, "save", save_after_the_failure)
    monkeypatch.setattr(rounds.ingester, "ingest", ingest_failing_while_publishing)
    send(run_sync, "a", 0, 4)
    send(run_sync, "b", 0, 4)

    with pytest.raises(ConnectionError):
        run_sync.tick()
    order.append("the pass ended")

    assert order == ["saved", "the pass ended"]
    assert run_sync.store.globals.versions()[0] == 1


@pytest.mark.parametrize("bad, reason", [
    ({"key": island_key(b"another run's secret", "a", 1)}, "bad signature"),
    ({"value": math.nan}, "non-finite"),
    ({"epoch": 0}, "old epoch"),
    ({"tokens": 7}, "do not match"),
    ({"shapes": {"nonsense.weight": (3, 3)}}, "do not match the fragment"),
])
def test_it_rejects_a_bad_update_with_a_reason_and_never_merges_it(run_sync, bad, reason):
    heartbeat_all(run_sync)
    send(run_sync, "a", 0, 4, **bad)
    send(run_sync, "b", 0, 4)
    run_sync.tick()
    assert any(reason in r for r in rejections(run_sync)), rejections(run_sync)
    # Only b's update is waiting; a bad one never counts towards the quorum.
    assert run_sync.store.globals.versions()[0] == 0
    assert list(run_sync.rounds.sync.open_round(0)) == ["b"]


def blob_keys(sync: RunSync) -> list[bytes]:
    return list(sync.store.client.scan_iter(match=sync.store.key("blob") + "*"))


def test_the_messages_of_updates_are_gone_once_folded_even_while_their_round_waits(run_sync):
    heartbeat_all(run_sync)
    for seq in (4, 8):
        send(run_sync, "a", 0, seq, base_version=run_sync.rounds.sync.version(0))
        send(run_sync, "a", 1, seq, base_version=run_sync.rounds.sync.version(1))
        send(run_sync, "b", 0, seq, base_version=run_sync.rounds.sync.version(0))
        assert blob_keys(run_sync)
        run_sync.tick()
        # b's update of fragment 1 has not come: a's increments wait in the open
        # round's sum, and their messages are gone already.
        assert run_sync.store.globals.versions()[0] == seq // 4
        assert run_sync.rounds.sync.open_round(1)["a"].contribution.increments == seq // 4
        assert blob_keys(run_sync) == []

    send(run_sync, "b", 1, 8)
    run_sync.tick()

    assert run_sync.store.globals.versions() == {0: 2, 1: 1}
    assert blob_keys(run_sync) == []


def test_the_messages_of_stale_updates_are_gone_and_forged_ones_left_to_expire(run_sync):
    heartbeat_all(run_sync)
    for seq in (4, 8):
        send(run_sync, "a", 0, seq, base_version=run_sync.rounds.sync.version(0))
        send(run_sync, "b", 0, seq, base_version=run_sync.rounds.sync.version(0))
        run_sync.tick()
    send(run_sync, "a", 0, 12, base_version=0)  # max_staleness 1: version 2 is newest
    send(run_sync, "b", 0, 12, key=island_key(b"forged", "b", 1))
    run_sync.tick()

    assert [r.split(":")[0] for r in rejections(run_sync)] == ["stale", "bad signature"]
    # A forged entry deletes nothing, not even what lies at its key: b's own update of
    # that seq may be there. Its chunks expire.
    forged = run_sync.store.updates.update_key("b", 1, 0, 12)
    assert {k.decode().rsplit(":", 1)[0] for k in blob_keys(run_sync)} == {forged}
    assert all(0 < run_sync.store.client.ttl(k) <= 3600 for k in blob_keys(run_sync))


def test_a_replayed_update_is_merged_at_most_once(run_sync):
    heartbeat_all(run_sync)
    send(run_sync, "a", 0, 4)
    send(run_sync, "b", 0, 4)
    run_sync.tick()
    send(run_sync, "a", 0, 4)  # the same seq again
    send(run_sync, "b", 0, 8)
    run_sync.tick()
    assert run_sync.store.globals.versions()[0] == 1
    assert list(run_sync.rounds.sync.open_round(0)) == ["b"]


def test_an_update_based_on_a_version_too_old_is_dropped_as_stale(run_sync):
    heartbeat_all(run_sync)
    for seq in (4, 8):
        send(run_sync, "a", 0, seq, base_version=seq // 4 - 1)
        send(run_sync, "b", 0, seq, base_version=seq // 4 - 1)
        run_sync.tick()
    assert run_sync.store.globals.versions()[0] == 2
    send(run_sync, "a", 0, 12, base_version=0)
    run_sync.tick()
    assert any("stale" in r for r in rejections(run_sync))
    assert "a" not in run_sync.rounds.sync.open_round(0)


def test_a_restarted_syncd_goes_on_from_what_redis_holds(run_sync, tmp_path):
    heartbeat_all(run_sync)
    send(run_sync, "a", 0, 4)
    send(run_sync, "b", 0, 4)
    send(run_sync, "a", 1, 4)  # waiting in fragment 1's round when syncd dies
    run_sync.tick()
    merged = {n: t.clone() for n, t in run_sync.rounds.sync.globals[0].items()}

    again = RunSync(run_sync.store, DatabaseRecorder(run_sync.recorder.run_id), tmp_path,
                    clock=lambda: 1000.0, control_every_s=0.0)
    again.tick()
    assert again.rounds.sync.versions() == [1, 0]
    assert all(torch.equal(merged[n], t) for n, t in again.rounds.sync.globals[0].items())
    # a's update was folded into fragment 1's round and freed: the restart lost it,
    # and nothing of it is read again (no message, no entry, no quarantine).
    assert list(again.rounds.sync.open_round(1)) == []
    assert stored_keys(again.store, "blob") == []
    assert rejections(again) == []
    # a sends it again when it sees the lease change hands (trainer/resend.py); one
    # it sent of fragment 0, merged already, is skipped.
    send(again, "a", 1, 4)
    send(again, "a", 0, 4)
    again.tick()
    assert list(again.rounds.sync.open_round(1)) == ["a"]
    assert list(again.rounds.sync.open_round(0)) == []  # merged ones are not merged twice


def test_a_restarted_syncd_quarantines_no_genuine_update_the_one_before_it_read(
        run_sync, tmp_path):
    heartbeat_all(run_sync)
    send(run_sync, "a", 0, 4)
    send(run_sync, "b", 0, 4, value=float("nan"))  # verified, then refused
    send(run_sync, "a", 0, 4)  # sent again: handled already
    run_sync.tick()
    assert run_sync.store.client.xlen(run_sync.store.key("updates")) == 0

    again = RunSync(run_sync.store, DatabaseRecorder(run_sync.recorder.run_id), tmp_path,
                    clock=lambda: 1000.0, control_every_s=0.0)
    again.tick()
    again.recorder.flush()

    assert not Event.objects.filter(run_id=again.recorder.run_id, kind="rejection",
                                    detail__has_key="quarantined").exists()


def test_an_update_is_freed_once_it_is_folded_into_its_round(run_sync):
    heartbeat_all(run_sync)
    send(run_sync, "a", 0, 4)
    run_sync.tick()

    assert list(run_sync.rounds.sync.open_round(0)) == ["a"]
    assert stored_keys(run_sync.store, "blob") == []
    assert run_sync.store.client.xlen(run_sync.store.key("updates")) == 0
    send(run_sync, "b", 0, 4)
    run_sync.tick()
    assert run_sync.store.globals.versions()[0] == 1
    assert run_sync.store.globals.handled(0) == {"a": 4, "b": 4}


def test_a_merge_of_finite_updates_that_overflows_is_not_published(run_sync):
    heartbeat_all(run_sync)
    before = {n: t.clone() for n, t in run_sync.rounds.sync.globals[0].items()}
    for island in ("a", "b"):
        send(run_sync, island, 0, 4, value=3e38)  # finite, and no norm is known yet
    run_sync.tick()

    assert run_sync.store.globals.versions()[0] == 0
    assert run_sync.rounds.sync.version(0) == 0
    assert all(torch.equal(t, before[n]) for n, t in run_sync.rounds.sync.globals[0].items())
    assert any("non-finite" in r for r in rejections(run_sync))
    assert blob_keys(run_sync) == []

    for island in ("a", "b"):
        send(run_sync, island, 0, 8)
    run_sync.tick()

    assert run_sync.store.globals.versions()[0] == 1
    assert all(torch.isfinite(t).all() for t in run_sync.rounds.sync.globals[0].values())


def test_each_merge_records_the_age_of_each_update_and_the_status_shows_it_per_island(
        run_sync):
    heartbeat_all(run_sync)
    send(run_sync, "a", 0, 4)
    send(run_sync, "b", 0, 4)
    run_sync.tick()
    # b is a round behind: its next update is still based on version 0
    send(run_sync, "a", 0, 8, base_version=1)
    send(run_sync, "b", 0, 8, base_version=0)
    run_sync.tick()
    run_sync.recorder.flush()

    merges = Event.objects.filter(run_id=run_sync.recorder.run_id, kind="merge",
                                  detail__fragment=0).order_by("detail__version")
    assert [m.detail["ages"] for m in merges] == [{"a": 0, "b": 0}, {"a": 0, "b": 1}]
    status = run_sync.status(run_sync.clock_state["now"])
    assert status["islands"]["a"]["staleness"]["max"] == 0
    assert status["islands"]["b"]["staleness"] == {"last": 1, "p50": 0.5, "p95": 0.95,
                                                   "max": 1, "count": 2}
    assert status["staleness"]["max"] == 1


def test_the_step_time_that_sizes_rounds_leaves_out_what_backpressure_held_back(run_sync):
    # a's 4 steps take 3 s on the clock, of which its heartbeat reports 2 s held back
    # before the send: 0.25 s a step, its training pace, sizes the period, not 0.75 s.
    def update(now: float, seq: int, held: float) -> None:
        run_sync.clock_state["now"] = now
        write_beat(run_sync, "a", epoch=1, time=now, step=seq, tokens=128,
                   backpressure_wait_s=held)
        send(run_sync, "a", 0, seq)
        run_sync.tick()

    update(1000.0, 4, 0.0)
    update(1003.0, 8, 2.0)
    assert run_sync.rounds.round_stats().step_time_s == pytest.approx(0.25)
    update(1004.0, 12, 2.0)  # no wait since: 4 steps in 1 s
    assert run_sync.rounds.round_stats().step_time_s == pytest.approx(0.25)


def test_a_round_in_its_grace_window_says_when_it_is_decided_again(redis_url, tmp_path):
    """Two of three alive islands are in (the quorum): the round waits out its grace
    window, and a quiet syncd blocks no longer than until it closes (RunSync.wake_in)."""
    config = {**CONFIG, "sync": {**CONFIG["sync"], "inner_steps": 16, "overlap_steps": 8},
              "islands": [*CONFIG["islands"], {"name": "c", "region": "us-east",
                                               "batch_size": 2}]}
    sync = make_run_sync(redis_url, tmp_path, "decoupled", config)
    sync.store.set_epoch("c", 1)
    sync.tick()
    for island in ("a", "b", "c"):
        write_beat(sync, island, epoch=1, time=time.time(), step=4, tokens=128)
    assert sync.wake_in() is None  # no round open
    send(sync, "a", 0, 4)
    send(sync, "b", 0, 4)
    sync.tick()

    assert sync.store.globals.versions()[0] == 0  # waiting for c within the grace window
    wake_in = sync.wake_in()
    assert wake_in is not None and 0 < wake_in < math.inf
    sync.clock_state["now"] += wake_in
    sync.tick()
    assert sync.store.globals.versions()[0] == 1 and sync.wake_in() is None
