"""One island's own credential against its run and a bystander (issue #47): as the run's
real island users (syncd/acl.py, both planes), every write command it holds is sent
with hostile values to every key pattern it may write, beside a bystander run on the
same Redis; then both runs must go on merging (three versions each), their ticks
never failing, and no key of the bystander's may change but by its own syncd.

What the island users may not do at all is tests/syncd/test_acl.py's.
"""

from __future__ import annotations

import time

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.hostile import hostile_entries
from diloco.signing import redis_password
from syncd.acl import WRITE_COMMANDS, island_store, island_url, put_island_users
from syncd.keys import ISLAND_WRITES
from syncd.records import Heartbeat
from syncd.service import RunSync
from syncd.upload_slots import SLOT_START_S, Ticket
from tests.syncd.runs import heartbeat_all, make_run_sync, send
from webapp.runs.models import Event

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

ROUNDS = 3


def merge_rounds(sync: RunSync, first_seq: int) -> None:
    """ROUNDS merges of fragment 0 from genuine updates of both islands."""
    for i in range(ROUNDS):
        heartbeat_all(sync)
        base = sync.store.globals.versions()[0]
        for island in ("a", "b"):
            send(sync, island, 0, first_seq + 4 * i, base_version=base)
        sync.tick()


def hostile_calls(key: str) -> list[tuple]:
    """Every write command an island holds, with hostile values, on `key`."""
    entry = {"island": "a", "epoch": 1, "fragment": 0, "seq": 10, "chunks": 1, "bytes": 10}
    calls = [("DEL", key), ("SET", key, "junk"), ("DEL", key), ("HSET", key, "a", "junk"),
             ("DEL", key), ("RPUSH", key, *(f"1:0:{s}:a" for s in range(5000))),
             ("DEL", key)]
    calls += [("XADD", key, "*", *[str(x) for kv in fields.items() for x in kv])
              for _, fields in hostile_entries(entry) if fields]
    calls += [("SET", key + ":0", "x" * (1 << 20)), ("HSET", key + ":1", "a", "b")]
    assert {c[0].lower() for c in calls} | {"ping", "lpos"} >= set(WRITE_COMMANDS)
    return calls


def attack(redis_url: str, sync: RunSync, *, leave: str) -> int:
    """Send every hostile call on every key pattern the run's islands may write, on
    both planes, as the run's island user that writes; leave each key as `leave` says
    ("junk": of the wrong type, "flood": full of tickets, "gone"); how many calls Redis
    took."""
    password = redis_password(sync.spec.secret)
    island = island_store(island_url(redis_url, sync.store.run_id, password),
                          island_url(redis_url, sync.store.run_id, password),
                          sync.store.run_id)
    taken = 0
    for part in ISLAND_WRITES:
        key = sync.store.key(part.replace("*", "a:1:0:10"))
        for call in hostile_calls(key):
            try:
                island.writer.execute_command(*call)
                taken += 1
            except redis.ResponseError:
                pass  # WRONGTYPE: the key holds another type now
        island.writer.delete(key)
        if leave == "junk":
            island.writer.set(key, "junk")
        elif leave == "flood":
            island.writer.rpush(key, *(f"1:0:{s}:b" for s in range(20_000)))
    return taken


@pytest.fixture
def runs(redis_url, tmp_path) -> tuple[RunSync, RunSync]:
    """The attacked run and a bystander on the same Redis, each with a merged version
    and its island users."""
    made = []
    for name in ("attacked", "bystander"):
        sync = make_run_sync(redis_url, tmp_path / name, "decoupled")
        put_island_users(sync.store.client, sync.store.client, sync.store.run_id,
                         sync.spec.secret)
        merge_rounds(sync, 4)
        made.append(sync)
    return made[0], made[1]


@pytest.mark.parametrize("leave", ["junk", "flood", "gone"])
def test_no_write_an_island_may_send_stops_its_run_or_another_from_merging(
        redis_url, runs, leave):
    attacked, bystander = runs
    before = (attacked.store.globals.versions()[0], bystander.store.globals.versions()[0])

    assert attack(redis_url, attacked, leave=leave) > 0
    attacked.tick()  # syncd's next pass: what it cannot read is quarantined or deleted
    merge_rounds(bystander, 100)
    merge_rounds(attacked, 100)

    assert bystander.store.globals.versions()[0] >= before[1] + ROUNDS
    assert attacked.store.globals.versions()[0] >= before[0] + ROUNDS


FIELD = st.one_of(st.integers(min_value=-2**70, max_value=2**70).map(str),
                  st.binary(max_size=40), st.sampled_from(["a", "b", "0", "1", "1e400", ""]))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(st.dictionaries(
    st.sampled_from(["island", "epoch", "fragment", "seq", "chunks", "bytes", "key", "x"]),
    FIELD, min_size=1), min_size=1, max_size=5))
def test_no_stream_entry_fails_the_tick_and_the_genuine_updates_still_merge(runs, entries):
    """A fuzzer of stream entries against a live RunSync: whatever fields an island's
    entries hold, syncd's tick goes on, they are gone from the stream, and the genuine
    updates written beside them merge."""
    attacked, _ = runs
    writer = attacked.store.writer
    for fields in entries:
        writer.xadd(attacked.store.key("updates"), fields)
    before = attacked.store.globals.versions()[0]

    merge_rounds(attacked, 1000 + 4 * ROUNDS * before)

    assert attacked.store.globals.versions()[0] == before + ROUNDS
    assert attacked.store.client.xlen(attacked.store.key("updates")) == 0


def test_an_islands_own_writes_go_on_over_keys_left_of_another_type(redis_url, runs):
    """The keys an island writes (heartbeats, updates, uploads) left as strings by its
    run's credential, before syncd's next pass repairs them: a genuine island's
    heartbeat, upload slot and update still go through (each key is deleted and made
    anew), so the island lives on and its run merges."""
    attacked, _ = runs
    attack(redis_url, attacked, leave="junk")
    password = redis_password(attacked.spec.secret)
    url = island_url(redis_url, attacked.store.run_id, password)
    island = island_store(url, url, attacked.store.run_id)
    before = attacked.store.globals.versions()[0]

    for name in ("a", "b"):
        island.signals.heartbeat(name, Heartbeat.bare(epoch=1, time=time.time(), step=4,
                                                      tokens=128))
        island.updates.wait_for_slot(name, 1, 0, 200, slots=4)
    for name in ("a", "b"):
        send(attacked, name, 0, 200, base_version=before, store=island)
    attacked.tick()

    assert attacked.store.globals.versions()[0] == before + 1


def test_tickets_queued_in_real_islands_names_hold_no_slot_past_syncds_next_look(
        redis_url, runs):
    """A flood of upload tickets in the run's real islands' names, current epoch and
    seqs to come, queued by the run's credential around the islands' own: each would
    hold a slot for SLOT_TIMEOUT_S in turn (an hour and more of the run's uploads).
    syncd's next look takes them all off (an island has at most one ticket of an
    update not yet written), the islands queue again and hold a slot at once, their
    updates merge, and a rejection event names each island with the count."""
    attacked, _ = runs
    password = redis_password(attacked.spec.secret)
    url = island_url(redis_url, attacked.store.run_id, password)
    island = island_store(url, url, attacked.store.run_id)
    uploads = attacked.store.key("uploads")
    forged = [Ticket(name, 1, 0, 10**6 + s).encode() for s in range(500) for name in ("a", "b")]
    island.data_writer.rpush(uploads, *forged[:10], "1:0:200:a", "1:0:200:b", *forged[10:])
    before = attacked.store.globals.versions()[0]

    heartbeat_all(attacked)
    attacked.tick()  # syncd's next look

    assert not set(forged) & {raw.decode() for raw in attacked.store.data.lrange(uploads, 0, -1)}
    started = time.monotonic()
    for name in ("a", "b"):
        island.updates.wait_for_slot(name, 1, 0, 200, slots=2)
        send(attacked, name, 0, 200, base_version=before, store=island)
    assert time.monotonic() - started < 1.0
    attacked.tick()
    assert attacked.store.globals.versions()[0] == before + 1
    attacked.recorder.flush()
    told = {e.island.name: e.detail["deleted"] for e in Event.objects.filter(
        run_id=attacked.store.run_id, kind="rejection", detail__cause="tickets_crowded")}
    assert told == {"a": 501, "b": 501}


def test_a_ticket_in_an_islands_name_whose_update_never_comes_holds_a_slot_briefly(
        redis_url, runs):
    """One ticket per island, queued in its name while it has none of its own: not
    crowded, it holds a slot only until SLOT_START_S, its update never written."""
    attacked, _ = runs
    password = redis_password(attacked.spec.secret)
    island = island_store(island_url(redis_url, attacked.store.run_id, password),
                          island_url(redis_url, attacked.store.run_id, password),
                          attacked.store.run_id)
    uploads = attacked.store.key("uploads")
    forged = [Ticket(name, 1, 0, 10**6).encode().encode() for name in ("a", "b")]
    island.data_writer.rpush(uploads, *forged)

    for step in (0.0, SLOT_START_S - 1, 1.0):
        attacked.clock_state["now"] += step
        heartbeat_all(attacked)
        attacked.tick()
        assert not attacked.liveness.lost
        held = attacked.store.data.lrange(uploads, 0, -1)
        assert held == ([] if step == 1.0 else forged)
