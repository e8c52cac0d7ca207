"""The island process (python -m trainer.runner) for real, against the tests' Redis:
syncd's part is played by the test, which publishes the global fragments and marks
updates handled."""

import collections
import dataclasses
import json
import os
import threading
import time
from itertools import pairwise
from types import SimpleNamespace

import pytest
import redis
import torch

from diloco.config import RunConfig
from diloco.config_parse import parse_config
from diloco.fragments import partition
from diloco.island import initial_model
from diloco.protocol import ProtocolError, decode_message, encode_message
from diloco.signing import island_key, publish_key
from syncd.connection import connect
from syncd.records import Heartbeat
from syncd.store import RunStore
from syncd.upload_slots import Ticket
from trainer.launch import ISLAND_KEY_ENV, REDIS_URL_ENV, island_command
from trainer.runner import ProcessIsland
from trainer.sending import Sending
from trainer.supervisor import IslandSupervisor


def handle(store: RunStore, fragment: int, seq: int, island: str = "island-0",
           epoch: int = 1) -> None:
    """What syncd does once done with an update: mark its seq handled and free its
    upload slot."""
    store.globals.mark_handled(fragment, {island: seq})
    store.updates.free_slots([Ticket(island, epoch, fragment, seq).encode()])


def two_process_config(text_path: str) -> RunConfig:
    """A tiny run of one island of two processes on the CPU: a fragment due every two
    steps, merged one step after its send (it never waits for the merge)."""
    return parse_config({
        "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
        "data": {"path": text_path},
        "sync": {"inner_steps": 4, "fragments": 2, "overlap_steps": 1, "min_quorum": 1,
                 "wait_share": 0.0},
        "optim": {"inner_lr": 1e-2, "warmup_steps": 20},
        "eval": {"tokens": 256},
        "train": {"device": "cpu"},
        "islands": [{"name": "island-0", "region": "us-east", "batch_size": 4,
                     "processes": 2}],
    }, ["us-east"])


def publish(store, config: RunConfig, secret: bytes, fragment: int, version: int,
            tensors: dict[str, torch.Tensor]) -> None:
    """Publish a global fragment as syncd does."""
    meta = {"run": store.run_id, "fragment": fragment, "version": version,
            "base_version": version, "codec": "none"}
    full = encode_message("global", meta, tensors, publish_key(secret))
    store.globals.publish(fragment, version, full, None, {}, 0, keep=16)


@pytest.mark.integration
@pytest.mark.parametrize(("end", "ended"), [("done", "exited"), ("stop", "stopped")])
def test_an_island_of_two_processes_trains_mixes_and_stops_under_its_supervisor(
        redis_server, text_path, tmp_path, end, ended):
    """rank 0 talks to Redis, rank 1 follows; a mix goes through, and both end with 0
    when the run is done or the island is stopped."""
    client = connect(redis_server)
    client.flushall()
    store = RunStore(client, 41)
    config = two_process_config(text_path)
    secret = b"two-ranks"
    store.put_spec("decoupled", config.to_dict(), secret.hex())
    store.set_epoch("island-0", 1)
    init = initial_model(config).state_dict()
    fragments = partition({n: t.numel() for n, t in init.items()}, 2)
    for p, f in enumerate(fragments):
        publish(store, config, secret, p, 0, {n: init[n] for n in f.tensor_names})
    sup = IslandSupervisor(island_command(41, "island-0", 1, "cpu"), store,
                           "island-0", 1, tmp_path / "island-0.log", poll_s=0.05, processes=2,
                           env={**os.environ, REDIS_URL_ENV: redis_server,
                                ISLAND_KEY_ENV: island_key(secret, "island-0", 1).hex()})
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(sup.run()))
    thread.start()
    try:
        first = wait_for(lambda: next((u for u in store.updates.read_updates() if u.fragment == 0),
                                      None))
        # syncd's answer to that update: version 1 of fragment 0, the update handled.
        publish(store, config, secret, 0, 1, {n: init[n] + 0.01 for n in
                                              fragments[0].tensor_names})
        handle(store, 0, first.seq)

        def base_version(update) -> int:
            blob = store.updates.update_message(update, 1 << 30)
            return decode_message(blob, island_key(secret, "island-0", 1))[1]["base_version"]

        def mixed_update():
            updates = store.updates.read_updates(count=10_000)
            for u in updates:  # syncd handles each (backpressure waits for it)
                handle(store, u.fragment, u.seq)
            return next((u for u in updates if u.fragment == 0 and base_version(u) == 1),
                        None)

        mixed = wait_for(mixed_update)
        if end == "done":
            store.control.mark_done()
        else:
            store.signals.send_command("island-0", "stop")
        thread.join(timeout=60)
    finally:
        if thread.is_alive():
            store.signals.send_command("island-0", "kill")
            thread.join(timeout=10)
        client.close()

    log = (tmp_path / "island-0.log").read_text()
    assert (outcome["ended"], outcome["exit_code"]) == (ended, 0), log
    assert mixed.seq > first.seq  # rank 0 mixed version 1 in, and rank 1 went on with it
    assert "rank 1 of 2 on cpu" in log and "Traceback" not in log
    assert "ended with exit code" not in log  # no rank failed, rank 1 included


def wait_for(find, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = find()
        if found is not None:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s")


def one_island_config(text_path: str, wait_share: float = 0.0, inner_steps: int = 40,
                      **island) -> RunConfig:
    """One island of one process, one fragment sent every `inner_steps` steps and mixed
    one step after its send (with wait_share 0, it never waits for the merge)."""
    return parse_config({
        "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
        "data": {"path": text_path},
        "sync": {"inner_steps": inner_steps, "fragments": 1, "overlap_steps": 1,
                 "min_quorum": 1, "wait_share": wait_share},
        "optim": {"inner_lr": 1e-2, "warmup_steps": 20},
        "train": {"device": "cpu"},
        "islands": [{"name": "island-0", "region": "us-east", "batch_size": 4, **island}],
    }, ["us-east"])


def island_in_a_thread(store, config: RunConfig, secret: bytes):
    """A ProcessIsland of run `store` training in a thread of the test, version 0 of
    its globals published as syncd does."""
    store.put_spec("decoupled", config.to_dict(), secret.hex())
    store.set_epoch("island-0", 1)
    init = initial_model(config).state_dict()
    publish(store, config, secret, 0, 0, init)
    island = ProcessIsland(store, "island-0", 1, "cpu", key=island_key(secret, "island-0", 1))
    thread = threading.Thread(target=island.run, daemon=True, name="island")
    thread.start()
    return island, thread, init


@pytest.mark.integration
def test_an_island_trains_on_while_its_merged_fragment_downloads_and_mixes_it_late(
        redis_server, text_path):
    """The global's download takes the emulated link's 1.5 s: the island keeps stepping
    meanwhile, mixes it at a later step than its tau, and counts it late."""
    client = connect(redis_server)
    client.flushall()
    store = RunStore(client, 42)
    secret = b"late-global"
    island, thread, init = island_in_a_thread(
        store, one_island_config(text_path, latency_ms=1500.0), secret)
    try:
        first = wait_for(lambda: next(iter(store.updates.read_updates()), None))
        publish(store, None, secret, 0, 1, {n: t + 0.01 for n, t in init.items()})
        handle(store, 0, first.seq)
        wait_for(lambda: island.island.state[0].version == 1 or None)
        assert island.pulling.late_globals == 1
        assert wait_for(lambda: store.signals.heartbeats()["island-0"].late_globals
                        or None) == 1
        assert island.pulling.pulls == 1
    finally:
        store.control.mark_done()
        thread.join(timeout=30)
        client.close()
    assert not thread.is_alive()


@pytest.mark.integration
def test_an_island_waits_for_each_merge_while_syncd_says_tau_0_and_overlaps_once_it_says_1(
        redis_server, text_path):
    """syncd chooses the run's tau (syncd/waiting.py): at tau 0 the island waits at its
    first send until the test, playing syncd, merges it (a first wait has no limit); at
    tau 1 it trains past a send that nobody merges."""
    client = connect(redis_server)
    client.flushall()
    store = RunStore(client, 48)
    store.control.set_tau(0)
    secret = b"tau"
    island, thread, init = island_in_a_thread(
        store, one_island_config(text_path, wait_share=0.05, inner_steps=4), secret)
    try:
        wait_for(lambda: island.activity == "waiting" or None)
        assert island.island.step == 4 and island.tending.used == 0
        store.control.set_tau(1)
        wait_for(lambda: island.tending.chosen == 1 or None)  # its tend thread read it
        publish(store, None, secret, 0, 1, init)
        handle(store, 0, 4)
        wait_for(lambda: island.island.step >= 14 or None)  # past sends nobody merged
        assert island.tending.used == 1 and island.island.state[0].version == 1
    finally:
        store.control.mark_done()
        thread.join(timeout=30)
        client.close()
    assert not thread.is_alive()


@pytest.mark.integration
def test_an_island_that_waits_trains_on_once_a_merge_takes_longer_than_its_training(
        redis_server, text_path):
    """A merge that does not come (a cut link, a syncd gone) holds a waiting island for
    at most a period (its training since its send before, times the fragments), then it
    trains on and mixes the merge in when it arrives."""
    client = connect(redis_server)
    client.flushall()
    store = RunStore(client, 49)
    store.control.set_tau(0)
    secret = b"cut"
    island, thread, init = island_in_a_thread(
        store, one_island_config(text_path, wait_share=0.05, inner_steps=4), secret)
    try:
        wait_for(lambda: island.activity == "waiting" or None)  # its first send: no limit
        publish(store, None, secret, 0, 1, init)
        handle(store, 0, 4)
        wait_for(lambda: island.island.step >= 10 or None)  # nobody merges 8: it trains on
        publish(store, None, secret, 0, 2, init)
        handle(store, 0, 8)
        wait_for(lambda: island.island.state[0].version == 2 or None)
        assert island.pulling.late_globals >= 1
    finally:
        store.control.mark_done()
        thread.join(timeout=30)
        client.close()
    assert not thread.is_alive()


@pytest.mark.integration
def test_an_epoch_whose_cursor_lags_what_syncd_handled_sends_seqs_past_it(
        redis_server, text_path):
    """The epoch before was killed after syncd handled its update of step 40 and before
    its tend thread wrote the cursor of that send: this one starts past seq 40, so its
    first update (due every 40 steps) is seq 80, not a duplicate syncd would refuse."""
    client = connect(redis_server)
    client.flushall()
    store = RunStore(client, 47)
    store.globals.mark_handled(0, {"island-0": 40})
    _, thread, _ = island_in_a_thread(store, one_island_config(text_path), b"lag")
    try:
        first = wait_for(lambda: next(iter(store.updates.read_updates()), None))
        assert first.seq == 80
    finally:
        store.control.mark_done()
        thread.join(timeout=30)
        client.close()
    assert not thread.is_alive()


@pytest.mark.integration
def test_the_training_loop_sends_redis_no_command_while_it_trains_sends_and_mixes(
        redis_server, text_path, monkeypatch):
    """Over a wide-area link each round trip to Redis costs the link's latency behind
    whatever the link carries: from its first step through two sends and their mixing
    steps, the island's training thread sends Redis nothing; its tend thread reads and
    writes for it (the heartbeats keep coming, the cursor of each send is written)."""
    commands: collections.Counter[str] = collections.Counter()  # thread -> commands sent
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(self, command, check_health=True):
        commands[threading.current_thread().name] += 1
        return send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    client = connect(redis_server)
    client.flushall()
    store = RunStore(client, 46)
    island, thread, _ = island_in_a_thread(store, one_island_config(text_path), b"tend")
    try:
        wait_for(lambda: training(store))
        # From step 10: the first step's own heartbeat (forced, on the loop) is written.
        wait_for(lambda: island.island.step >= 10 or None)
        before = commands["island"]
        wait_for(lambda: island.island.step >= 90 or None)  # sends at 40 and 80, mixes at 41, 81
        assert commands["island"] == before
        wait_for(lambda: commands["tend"] or None)  # a quarter second after the loop began
        wait_for(lambda: (store.signals.cursor("island-0") or {}).get("step") == 80 or None)
        assert time.time() - store.signals.heartbeats()["island-0"].time < 1.0
    finally:
        store.control.mark_done()
        thread.join(timeout=30)
        client.close()
    assert not thread.is_alive()


def training(store: RunStore) -> Heartbeat | None:
    """island-0's heartbeat once it says it trains."""
    beat = store.signals.heartbeats().get("island-0")
    return beat if beat is not None and beat.state == "training" else None


def test_the_heartbeat_record_has_no_defaults_so_the_island_names_every_field():
    """ProcessIsland.heartbeat builds the record with every field named: a field added
    to Heartbeat and not written there fails the island's first beat."""
    assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
               for f in dataclasses.fields(Heartbeat))


@pytest.mark.integration
def test_the_island_writes_every_field_of_its_heartbeat(redis_server, text_path):
    client = connect(redis_server)
    client.flushall()
    store = RunStore(client, 45)
    _, thread, _ = island_in_a_thread(store, one_island_config(text_path), b"fields")
    try:
        beat = wait_for(lambda: training(store))
        raw = json.loads(client.hget(store.key("heartbeats"), "island-0"))
        assert set(raw) == {f.name for f in dataclasses.fields(Heartbeat)}
        assert Heartbeat.from_dict(raw) == store.signals.heartbeats()["island-0"]
        assert (beat.epoch, beat.pid, beat.warm) == (1, os.getpid(), False)
        assert beat.step >= 1 and beat.tokens > 0 and beat.loss is not None
        assert beat.startup_s > 0 and beat.phases and beat.first_step_cpu_s is not None
    finally:
        store.control.mark_done()
        thread.join(timeout=30)
        client.close()


@pytest.mark.integration
def test_an_island_keeps_its_heartbeat_through_a_long_encode(redis_server, text_path,
                                                              monkeypatch):
    """An encode of 2 s (a big model's) on the training thread leaves no gap of a
    second between heartbeats: syncd would take the island for lost."""
    import trainer.sending

    real_encode = trainer.sending.encode_message

    def slow_encode(*args, **kwargs):
        time.sleep(2.0)
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(trainer.sending, "encode_message", slow_encode)
    client = connect(redis_server)
    client.flushall()
    store = RunStore(client, 43)
    island, thread, _ = island_in_a_thread(store, one_island_config(text_path), b"beats")
    try:
        wait_for(lambda: training(store) or None)
        times: list[float] = []
        deadline = time.monotonic() + 5.0  # past the first send, at step 40
        while time.monotonic() < deadline:
            beat = store.signals.heartbeats()["island-0"].time
            if not times or beat != times[-1]:
                times.append(beat)
            time.sleep(0.02)
        assert island.island.step >= 40  # the long encode happened in the window
        assert max(b - a for a, b in pairwise(times)) < 1.0
    finally:
        store.control.mark_done()
        thread.join(timeout=30)
        client.close()


@pytest.mark.integration
def test_an_island_refuses_a_global_forged_with_a_key_other_than_syncds(redis_server,
                                                                        text_path):
    """A global in Redis signed by anyone but syncd (another run's publish key here;
    an island holds no key that could make one) is never mixed: the island's fetch
    raises before it reads a tensor."""
    client = connect(redis_server)
    client.flushall()
    store = RunStore(client, 44)
    config = one_island_config(text_path)
    store.put_spec("decoupled", config.to_dict(), b"genuine".hex())
    init = initial_model(config).state_dict()
    publish(store, config, b"forger", 0, 1, init)
    island = ProcessIsland(store, "island-0", 1, "cpu", key=island_key(b"genuine", "island-0", 1))
    try:
        with pytest.raises(ProtocolError, match="not signed with this run's publish key"):
            island.pulling.fetch(0, 0)
        publish(store, config, b"genuine", 0, 2, init)
        assert island.pulling.fetch(0, 0)[0] == 2
    finally:
        island.stopping = True
        client.close()


def test_an_island_without_a_key_in_its_environment_does_not_start(monkeypatch):
    """Its key comes from its launcher; it has no run secret to fall back on."""
    from trainer.launch import island_key_from_env

    monkeypatch.delenv(ISLAND_KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=ISLAND_KEY_ENV):
        island_key_from_env()
    monkeypatch.setenv(ISLAND_KEY_ENV, "ab" * 32)
    assert island_key_from_env() == bytes.fromhex("ab" * 32)


@pytest.mark.integration
@pytest.mark.parametrize(("codec", "bound"), [("none", 2), ("int4", 4)])
def test_an_island_whose_updates_syncd_does_not_merge_stops_sending_after_the_bound(
        redis_server, text_path, codec, bound):
    """No syncd merges: the island sends the updates of its one fragment it may keep
    (two float32, four int4 in a run of one island: diloco.sizes.kept_sends), then
    waits before the
    next, beating as `waiting` with the seconds it waited in its heartbeat; once
    syncd handles the first, the next goes out."""
    client = connect(redis_server)
    client.flushall()
    store = RunStore(client, 45)
    config = parse_config({
        "model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
        "data": {"path": text_path},
        "sync": {"inner_steps": 4, "fragments": 1, "overlap_steps": 1, "min_quorum": 1,
                 "wait_share": 0.0, "compression": codec,
                 "upload_slots": 8},  # slots are not the bound
        "train": {"device": "cpu"},
        "islands": [{"name": "island-0", "region": "us-east", "batch_size": 4}],
    }, ["us-east"])
    island, thread, _ = island_in_a_thread(store, config, b"backpressure")
    seqs = [4 * (i + 1) for i in range(bound + 1)]
    try:
        def held_a_second() -> Heartbeat | None:
            beat = store.signals.heartbeats().get("island-0")
            return beat if beat and beat.backpressure_wait_s >= 1.0 else None

        beat = wait_for(held_a_second)
        sent = [u.seq for u in store.updates.read_updates(count=100)]
        assert sent == seqs[:-1] and island.island.step == seqs[-1]  # holding the next
        assert beat.state == "waiting"
        assert time.time() - store.signals.heartbeats()["island-0"].time < 1.0  # still beating
        handle(store, 0, 4)
        wait_for(lambda: len(store.updates.read_updates(count=100)) == bound + 1 or None)
        assert [u.seq for u in store.updates.read_updates(count=100)][bound] == seqs[-1]
    finally:
        store.control.mark_done()
        thread.join(timeout=30)
        client.close()
    assert not thread.is_alive()


def delivering_island(store: RunStore) -> SimpleNamespace:
    """What Sending.deliver reads of its island's sending."""
    return SimpleNamespace(store=store, name="a", epoch=1, slot_wait_s=0.0, upload_slots=2,
                           run_ended=lambda: store.control.done() or not store.is_active())


@pytest.mark.integration
def test_an_update_delivered_while_its_run_goes_on_stays_for_syncd(redis_url, dataplane_url):
    store = RunStore(connect(redis_url), 7, data=connect(dataplane_url))
    store.put_spec("decoupled", {}, "00" * 32)

    Sending.deliver(delivering_island(store), 0, 8, b"u" * 5000)

    [entry] = store.updates.read_updates()
    assert store.updates.update_message(entry, 1 << 20) == b"u" * 5000


@pytest.mark.integration
def test_an_update_delivered_after_its_run_freed_its_keys_leaves_none_of_them(redis_url,
                                                                           dataplane_url):
    store = RunStore(connect(redis_url), 7, data=connect(dataplane_url), chunk_bytes=2048)
    store.put_spec("decoupled", {}, "00" * 32)
    store.release()

    Sending.deliver(delivering_island(store), 0, 8, b"u" * 5000)

    assert store.updates.read_updates() == []
    assert not store.data.keys(store.key("*"))  # no chunk, no queue of upload slots
    assert not store.client.exists(store.key("updates"))
