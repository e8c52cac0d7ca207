"""Hostile stream entries written straight into a run's update stream while a real
RunSync serves it, by a client holding the Redis credential an island holds.

An entry speaks for an island only once the signed message it names says so
(syncd/ingest.py, syncd/quarantine.py): until then syncd records nothing in the
island's name, deletes no key, books no lost time, and skips the entry for good.
The run keeps merging, the named island's genuine updates are still merged, and
another run on the same Redis is untouched.
"""

from __future__ import annotations

import pytest

from bench.hostile import hostile_entries, write_entry
from syncd.service import STOP_WAIT_S, RunSync
from tests.syncd.runs import heartbeat_all, make_run_sync, send
from webapp.runs.models import Event, Run
from webapp.runs.records import DatabaseRecorder

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

GOOD = {"island": "a", "epoch": 1, "fragment": 0, "seq": 10, "chunks": 1, "bytes": 10}


def in_stream(sync: RunSync, stream_id: bytes) -> bool:
    return bool(sync.store.client.xrange(sync.store.key("updates"), stream_id, stream_id))


def rejection_events(sync: RunSync) -> list[dict]:
    sync.recorder.flush()
    return [e.detail for e in Event.objects.filter(run_id=sync.recorder.run_id,
                                                   kind="rejection")]


def keys_of(sync: RunSync) -> set[bytes]:
    return set(sync.store.client.scan_iter(match=sync.store.prefix + "*"))


@pytest.fixture
def two_runs(redis_url, tmp_path) -> tuple[RunSync, RunSync]:
    """The run under attack, and another on the same Redis, each with a merged version."""
    runs = []
    for name in ("attacked", "other"):
        sync = make_run_sync(redis_url, tmp_path / name, "decoupled")
        heartbeat_all(sync)
        for island in ("a", "b"):
            send(sync, island, 0, 4)
        sync.tick()
        assert sync.store.globals.versions()[0] == 1
        runs.append(sync)
    return runs[0], runs[1]


HOSTILE = hostile_entries(GOOD)


@pytest.mark.parametrize("fields", [f for _, f in HOSTILE], ids=[n for n, _ in HOSTILE])
def test_a_hostile_entry_changes_nothing_and_its_neighbours_merge(two_runs, fields):
    attacked, other = two_runs
    other_keys = {k: other.store.client.dump(k) for k in keys_of(other)}
    handled = attacked.store.globals.handled(0)
    send(attacked, "a", 0, 8)
    # The entry names another run's fragment as its message: an entry names no key.
    hostile = write_entry(attacked.store, {**fields, "key": other.store.key("full", 0, 1)})
    send(attacked, "b", 0, 8)

    attacked.tick()

    assert attacked.store.globals.versions()[0] == 2, "a's and b's genuine updates merged"
    assert attacked.store.globals.handled(0) == {**handled, "a": 8, "b": 8}
    assert attacked.rounds.ingester.rejections == {}
    assert all(sum(i.lost.values()) == 0.0 for i in attacked.accounting.islands.values())
    [event] = rejection_events(attacked)
    assert event["quarantined"] == 1
    assert not in_stream(attacked, hostile), "skipped for good"
    assert {k: other.store.client.dump(k) for k in keys_of(other)} == other_keys
    other.tick()
    assert other.store.globals.versions()[0] == 1


def test_a_forged_huge_seq_never_keeps_the_island_from_merging(two_runs):
    attacked, _ = two_runs
    write_entry(attacked.store, {**GOOD, "seq": 10**18})
    attacked.tick()
    send(attacked, "a", 0, 8)
    send(attacked, "b", 0, 8)

    attacked.tick()

    assert attacked.store.globals.versions()[0] == 2
    assert attacked.store.globals.handled(0)["a"] == 8


def test_repeated_hostile_entries_make_one_event_with_their_count(two_runs):
    attacked, _ = two_runs
    for seq in range(100, 150):
        write_entry(attacked.store, {**GOOD, "seq": seq})
    attacked.tick()
    for seq in range(150, 160):
        write_entry(attacked.store, {**GOOD, "seq": seq})
    attacked.tick()
    assert [e["quarantined"] for e in rejection_events(attacked)] == [50]

    attacked.clock_state["now"] += 61
    attacked.tick()

    assert [e["quarantined"] for e in rejection_events(attacked)] == [50, 10]


def test_a_quarantined_entry_is_not_read_again_after_a_restart_of_syncd(two_runs, tmp_path):
    attacked, _ = two_runs
    write_entry(attacked.store, {"junk": "x"})
    write_entry(attacked.store, {**GOOD, "seq": 10**18})
    attacked.tick()
    assert len(rejection_events(attacked)) == 2

    again = RunSync(attacked.store, DatabaseRecorder(attacked.store.run_id), tmp_path / "attacked",
                    clock=lambda: 2000.0, control_every_s=0.0)
    again.tick()

    assert len(rejection_events(again)) == 2
    assert again.store.globals.versions()[0] == 1


def test_a_stop_of_a_run_with_poison_entries_finishes(two_runs):
    attacked, _ = two_runs
    Run.objects.filter(pk=attacked.recorder.run_id).update(state=Run.State.STOPPING)
    for seq in range(5):
        write_entry(attacked.store, {"island": "a", "seq": str(seq)})  # no epoch, no fragment
    attacked.store.control.request_stop(attacked.clock_state["now"])
    attacked.tick()
    attacked.clock_state["now"] += STOP_WAIT_S

    attacked.tick()

    assert attacked.completed
    assert Run.objects.get(pk=attacked.recorder.run_id).state == Run.State.STOPPED
