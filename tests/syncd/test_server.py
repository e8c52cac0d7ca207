"""syncd's process loop: live status goes to the run's channel layer group."""

import time

import pytest

from syncd import lease
from syncd.acl import delete_island_user, island_user
from syncd.connection import connect
from syncd.fence import LeaseLost
from syncd.hooks import Hooks
from syncd.server import USER_SWEEP_S, Syncd
from syncd.service import RunSync
from syncd.store import RunStore
from tests.fixtures import redis_users
from webapp.runs.lifecycle import create_run
from webapp.runs.syncd_wiring import web_hooks

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

CONFIG = {
    "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
    "sync": {"inner_steps": 4, "fragments": 2, "min_quorum": 2},
    "eval": {"tokens": 256},
    "islands": [{"name": "a", "region": "us-east"}, {"name": "b", "region": "us-east"}],
}


def test_a_served_run_pushes_numbered_status_snapshots(redis_url, tmp_path):
    run = create_run(name="pushed", mode="decoupled", config=CONFIG, user=None)
    RunStore(connect(redis_url), run.pk).put_spec(run.mode, run.config, run.secret)
    pushed = []
    hooks = Hooks(web_hooks().recorder, web_hooks().rejoin,
                  notify=lambda *message: pushed.append(message))
    served = Syncd(redis_url, tmp_path, hooks)
    served.tick()
    served.runs[str(run.pk)].next_status = 0.0  # the next tick is due a snapshot
    served.tick()

    assert [(run_id, seq) for run_id, seq, _ in pushed] == [(str(run.pk), 1), (str(run.pk), 2)]
    status = pushed[-1][2]
    assert status["versions"] == [0, 0]
    assert set(status["islands"]) == {"a", "b"}


def test_a_run_that_is_no_longer_active_is_let_go(redis_url, tmp_path):
    run = create_run(name="let go", mode="decoupled", config=CONFIG, user=None)
    store = RunStore(connect(redis_url), run.pk)
    store.put_spec(run.mode, run.config, run.secret)
    served = Syncd(redis_url, tmp_path, web_hooks())
    served.tick()
    assert str(run.pk) in served.runs
    store.deactivate()
    served.tick()
    assert served.runs == {}


def test_syncd_makes_a_served_runs_lost_island_user_again_and_deletes_an_ended_runs(
        redis_url, tmp_path):
    run = create_run(name="users", mode="decoupled", config=CONFIG, user=None)
    client = connect(redis_url)
    store = RunStore(client, run.pk)
    store.put_spec(run.mode, run.config, run.secret)
    clock = [0.0]
    served = Syncd(redis_url, tmp_path, web_hooks(), clock=lambda: clock[0])
    served.tick()  # serves the run: its RunSync is built
    assert island_user(run.pk) not in redis_users(client)  # as after a Redis restart

    clock[0] += USER_SWEEP_S
    served.tick()
    assert island_user(run.pk) in redis_users(client)

    store.release(linger_s=1)
    client.delete(store.key("spec"))  # its linger passed
    clock[0] += USER_SWEEP_S
    served.tick()
    assert island_user(run.pk) not in redis_users(client)


def test_syncd_keeps_the_island_users_on_the_data_plane_by_the_runs_on_the_control_plane(
        redis_url, dataplane_url, tmp_path):
    run = create_run(name="data users", mode="decoupled", config=CONFIG, user=None)
    client, data = connect(redis_url), connect(dataplane_url)
    store = RunStore(client, run.pk, data=data)
    store.put_spec(run.mode, run.config, run.secret)
    clock = [0.0]
    served = Syncd(redis_url, tmp_path, web_hooks(), clock=lambda: clock[0],
                   dataplane_url=dataplane_url)
    served.tick()
    try:
        clock[0] += USER_SWEEP_S
        served.tick()  # the data plane restarted: it knew no user
        assert island_user(run.pk) in redis_users(data)

        store.release(linger_s=1)
        client.delete(store.key("spec"))  # the run's linger passed, on the control plane
        clock[0] += USER_SWEEP_S
        served.tick()
        assert island_user(run.pk) not in redis_users(data)
    finally:
        delete_island_user(data, run.pk)


def active_runs(redis_url: str, count: int) -> list[str]:
    """`count` runs with their specs in Redis, as the web app leaves them when started."""
    client = connect(redis_url)
    ids = []
    for i in range(count):
        run = create_run(name=f"split {i}", mode="decoupled", config=CONFIG, user=None)
        RunStore(client, run.pk).put_spec(run.mode, run.config, run.secret)
        ids.append(str(run.pk))
    return ids


class Clock:
    """A monotonic clock the test moves, so lease renewals fall due when it says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_two_syncd_split_the_active_runs_and_never_serve_one_run_twice(redis_url, tmp_path):
    runs = active_runs(redis_url, 4)
    clock = Clock()
    first = Syncd(redis_url, tmp_path, web_hooks(), owner="syncd-a", lease_ttl_s=30, clock=clock)
    first.tick()
    assert sorted(first.runs) == sorted(runs)  # alone, it serves every run

    second = Syncd(redis_url, tmp_path, web_hooks(), owner="syncd-b", lease_ttl_s=30, clock=clock)
    for _ in range(4):  # a renewal round each: the first hands over, the second takes
        clock.now += 10
        second.tick()
        first.tick()
        assert not set(first.leases) & set(second.leases)
        if len(first.runs) == len(second.runs) == 2:
            break
    assert len(first.runs) == len(second.runs) == 2
    assert sorted([*first.runs, *second.runs]) == sorted(runs)
    client = connect(redis_url)
    for served in (first, second):
        for run_id, held in served.leases.items():
            assert lease.holder(client, run_id) == (held.token, served.owner)


def test_a_syncd_that_stops_hands_its_runs_over_at_once(redis_url, tmp_path):
    runs = active_runs(redis_url, 2)
    clock = Clock()
    first = Syncd(redis_url, tmp_path, web_hooks(), owner="syncd-a", lease_ttl_s=30, clock=clock)
    second = Syncd(redis_url, tmp_path, web_hooks(), owner="syncd-b", lease_ttl_s=30, clock=clock)
    first.tick()
    second.tick()
    assert len(first.runs) == 2 and second.runs == {}

    first.close()
    assert lease.members_alive(connect(redis_url)) == ["syncd-b"]
    clock.now += 10
    second.tick()
    assert sorted(second.runs) == sorted(runs)


def test_the_runs_of_a_dead_syncd_are_taken_over_when_their_leases_expire(redis_url, tmp_path):
    runs = active_runs(redis_url, 2)
    dead = Syncd(redis_url, tmp_path, web_hooks(), owner="syncd-dead", lease_ttl_s=0.5)
    dead.tick()
    assert sorted(dead.runs) == sorted(runs)
    stale_store = dead.runs[runs[0]].store
    # From here on `dead` is never ticked again, as after a kill -9.
    heir = Syncd(redis_url, tmp_path, web_hooks(), owner="syncd-heir", lease_ttl_s=0.5)
    deadline = time.monotonic() + 20
    while sorted(heir.runs) != sorted(runs):
        assert time.monotonic() < deadline, f"the heir serves only {sorted(heir.runs)}"
        heir.tick()

    heir_versions = RunStore(connect(redis_url), runs[0]).globals.versions()
    with pytest.raises(LeaseLost):
        stale_store.globals.publish(0, 99, b"stale", None, {}, 0, keep=16)
    assert RunStore(connect(redis_url), runs[0]).globals.versions() == heir_versions
    dead.tick()  # if it ever wakes up, it finds its leases gone and lets the runs be
    assert dead.runs == {} and dead.leases == {}


def test_leases_outlive_one_long_step_of_the_main_loop_but_not_a_stuck_loop(
        redis_url, tmp_path):
    [run_id] = active_runs(redis_url, 1)
    syncd = Syncd(redis_url, tmp_path, web_hooks(), owner="syncd-a", lease_ttl_s=2.0)
    syncd.tick()
    held = syncd.leases[run_id]
    client = connect(redis_url)
    syncd.keep_leases_meanwhile(stall_s=4.0)
    try:
        time.sleep(3.0)  # a long step: no pass of the loop, past the lease's time to live
        assert lease.holder(client, run_id) == (held.token, "syncd-a")

        time.sleep(4.5)  # no progress past the deadline: the lease is let run out
        assert lease.holder(client, run_id) is None
    finally:
        syncd.stopping = True


def test_a_run_that_keeps_failing_is_built_again_less_and_less_often_and_others_go_on(
        redis_url, tmp_path, monkeypatch):
    broken, healthy = active_runs(redis_url, 2)
    builds = []

    def build(store, *args, **kwargs):
        builds.append(store.run_id)
        if store.run_id == broken:
            raise RuntimeError("this run cannot be built")
        return RunSync(store, *args, **kwargs)

    monkeypatch.setattr("syncd.server.RunSync", build)
    clock = Clock()
    served = Syncd(redis_url, tmp_path, web_hooks(), owner="syncd-a", lease_ttl_s=30,
                   clock=clock)
    ticks = 0
    while clock.now < 10:
        served.tick()
        ticks += 1
        clock.now += 0.25

    # Tried at 0 s, then after waits of 1, 2 and 4 s: at 1, 3 and 7 s.
    assert builds.count(broken) == 4
    assert builds.count(healthy) == 1 and ticks == 40
    assert healthy in served.runs
    assert broken in served.leases, "it keeps the run, so its updates wait for it"


def test_a_run_whose_tick_failed_is_granted_anew_so_its_islands_send_again(
        redis_url, tmp_path, monkeypatch):
    """A failed tick loses the run's open rounds and unpublished merges (they lived in
    its RunSync): the islands must see syncd change hands, as after a restart, and
    send again what it has not handled (trainer/resend.py)."""
    broken, healthy = active_runs(redis_url, 2)
    fail = {"now": False}
    original = RunSync.tick

    def tick(self):
        if fail["now"] and self.store.run_id == broken:
            raise RuntimeError("this tick fails")
        return original(self)

    monkeypatch.setattr(RunSync, "tick", tick)
    served = Syncd(redis_url, tmp_path, web_hooks(), owner="syncd-a", lease_ttl_s=30)
    served.tick()
    client = connect(redis_url)
    holders = {r: RunStore(client, r).syncd_holder() for r in (broken, healthy)}
    fail["now"] = True

    served.tick()

    assert RunStore(client, broken).syncd_holder() != holders[broken]
    assert served.leases[broken].token > int(holders[broken].split(":")[0])
    assert RunStore(client, healthy).syncd_holder() == holders[healthy]


def test_a_quiet_syncd_blocks_on_its_runs_update_streams_until_an_update_arrives(
        redis_url, tmp_path):
    run = create_run(name="quiet", mode="decoupled", config=CONFIG, user=None)
    store = RunStore(connect(redis_url), run.pk)
    store.put_spec(run.mode, run.config, run.secret)
    served = Syncd(redis_url, tmp_path, web_hooks())
    served.tick()
    blocked = []
    real_xread = served.client.xread
    served.client.xread = lambda streams, **kwargs: blocked.append((streams, kwargs)) or \
        real_xread(streams, **kwargs)
    store.updates.push_update("a", 1, 0, 0, b"an update")

    served.wait_for_work(quiet_s=2.0)  # returns at once: an entry is there to read

    (streams, kwargs), = blocked
    assert streams == {store.key("updates"): served.runs[str(run.pk)].rounds.ingester.after}
    assert kwargs == {"count": 1, "block": 2_000}


def test_a_syncd_serving_no_run_sleeps_between_passes_instead_of_polling(
        redis_url, tmp_path, monkeypatch):
    served = Syncd(redis_url, tmp_path, web_hooks())
    served.tick()
    slept = []
    monkeypatch.setattr("syncd.server.time.sleep", slept.append)

    served.wait_for_work(idle_s=1.0)

    assert served.runs == {} and slept == [1.0]
