"""The data plane, a second Redis that keeps nothing on disk (syncd.run_keys): tensor
messages lie there and nothing else does; a full one refuses only tensor writes, and
syncd says so in the run's events; a restart of it loses no published global, which
syncd's files (syncd.published_files) hold once per merge. Real Redis processes."""

import hashlib
import time

import pytest
import redis

from diloco.protocol import SIGNATURE_BYTES, decode_message
from syncd.connection import connect
from syncd.records import Heartbeat
from syncd.store import RunStore
from tests.syncd.runs import heartbeat_all, make_run_sync, merge_once, send
from trainer.launch import free_port
from webapp.processes import start_scratch_redis
from webapp.runs.models import Event

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def keys(url: str, part: str) -> list[bytes]:
    with redis.Redis.from_url(url) as client:
        return sorted(client.scan_iter(match=f"arch:*:{part}*"))


def alerts(sync, words: str) -> list[dict]:
    """The details of the run's alert events whose reason has `words`."""
    sync.recorder.flush()
    return [e.detail for e in Event.objects.filter(run_id=sync.recorder.run_id, kind="alert")
            if words in e.detail.get("reason", "")]


def test_an_updates_message_lies_on_the_data_plane_and_its_entry_on_the_control_redis(
        redis_url, dataplane_url):
    store = RunStore(connect(redis_url), 7, data=connect(dataplane_url))

    store.updates.push_update("a", 1, 0, 4, b"u" * 20_000)

    assert keys(dataplane_url, "blob") and not keys(redis_url, "blob")
    assert keys(redis_url, "updates") and not keys(dataplane_url, "updates")
    [entry] = store.updates.read_updates()
    assert store.updates.update_message(entry, 1 << 20) == b"u" * 20_000


def test_a_merge_publishes_its_messages_on_the_data_plane_and_commits_on_the_control_redis(
        redis_url, dataplane_url, tmp_path):
    sync = make_run_sync(redis_url, tmp_path, "decoupled", dataplane_url=dataplane_url)

    merge_once(sync)

    # The chunks; the reference is the control's. The outer momentum is on neither.
    assert keys(dataplane_url, "full:0:") and not keys(redis_url, "full:0:")
    assert not keys(dataplane_url, "momentum") and not keys(redis_url, "momentum")
    assert not keys(dataplane_url, "blob")  # the merged updates' messages are gone
    with redis.Redis.from_url(dataplane_url) as data:
        assert not data.exists(sync.store.key("versions"), sync.store.key("handled", 0),
                               sync.store.key("status"), sync.store.key("heartbeats"))
    _, meta, _ = decode_message(sync.store.globals.full(0), sync.spec.verify_key)
    assert meta["version"] == 1
    token = sync.store.globals.fencing_tokens()[0]
    assert token == sync.store.fencing_token  # this syncd's grant (0: no lease here)
    assert (tmp_path / f"run-{sync.store.run_id}" / "published"
            / f"0-{token}-odd.published").exists()


def test_a_full_data_plane_refuses_tensor_writes_while_heartbeats_and_status_go_on(
        redis_url, dataplane_url, tmp_path):
    sync = make_run_sync(redis_url, tmp_path, "decoupled", dataplane_url=dataplane_url)
    heartbeat_all(sync)
    send(sync, "a", 0, 4)
    send(sync, "b", 0, 4)
    data = redis.Redis.from_url(dataplane_url)
    data.config_set("maxmemory", 1)  # every write that takes memory is refused now
    status_before = sync.store.status()["seq"] if sync.store.status() else 0

    with pytest.raises(redis.OutOfMemoryError):
        send(sync, "a", 1, 4)
    sync.store.signals.heartbeat("a", Heartbeat.bare(1, time.time(), 8, 256))
    sync.tick()
    sync.clock_state["now"] += 1.5
    sync.tick()

    assert not keys(dataplane_url, "blob:a:1:1:")  # the refused update holds no memory
    assert sync.store.globals.versions()[0] == 0  # the merge waits; nothing half-published
    assert sync.store.signals.heartbeats()["a"].step == 8
    assert sync.store.status()["seq"] > status_before
    [alert] = alerts(sync, "data-plane Redis is full")
    assert alert["refused"] >= 1

    data.config_set("maxmemory", 0)  # room again: the merge goes through
    sync.clock_state["now"] += 1.5
    sync.tick()
    assert sync.store.globals.versions()[0] == 1
    data.close()


@pytest.fixture
def own_dataplane(tmp_path):
    """A data plane of this test's own, which it may stop and start again: (url, restart)."""
    port = free_port()
    folder = tmp_path / "dataplane"
    folder.mkdir()
    started = [start_scratch_redis(folder, port)[0]]

    def restart() -> None:
        started[0].terminate()
        started[0].wait(timeout=10)
        started[0] = start_scratch_redis(folder, port)[0]

    yield f"redis://127.0.0.1:{port}/0", restart
    started[0].terminate()
    started[0].wait(timeout=10)


def test_a_restart_of_the_data_plane_while_syncd_runs_is_published_again(
        redis_url, own_dataplane, tmp_path):
    url, restart = own_dataplane
    sync = make_run_sync(redis_url, tmp_path, "decoupled", dataplane_url=url)
    merge_once(sync)
    merged = sync.store.globals.full(0)

    restart()
    sync.clock_state["now"] += 1.5
    sync.tick()

    assert sync.store.globals.full(0) == merged
    assert alerts(sync, "lost the run's published")


def test_a_restart_of_the_data_plane_and_of_syncd_loses_no_published_global(
        redis_url, own_dataplane, tmp_path):
    from syncd.service import RunSync
    from webapp.runs.records import DatabaseRecorder

    url, restart = own_dataplane
    sync = make_run_sync(redis_url, tmp_path, "decoupled", dataplane_url=url)
    merge_once(sync)
    merged = sync.store.globals.full(0)
    globals_before = {n: t.clone() for n, t in sync.rounds.sync.globals[0].items()}
    momentum_before = sync.rounds.sync.optimizers[0].state_dict()

    restart()
    again = RunSync(sync.store, DatabaseRecorder(sync.recorder.run_id), tmp_path,
                    clock=lambda: 2000.0)

    assert again.rounds.sync.version(0) == 1
    assert all(again.rounds.sync.globals[0][n].equal(t) for n, t in globals_before.items())
    momentum = again.rounds.sync.optimizers[0].state_dict()
    assert all(momentum[n].equal(t) for n, t in momentum_before.items())
    assert sync.store.globals.full(0) == merged  # published on the data plane again
    again.recorder.flush()
    assert not Event.objects.filter(run_id=sync.recorder.run_id, kind="rollback").exists()


def test_a_syncd_under_a_new_grant_restores_from_the_committing_grants_file_then_keeps_its_own(
        redis_url, own_dataplane, tmp_path):
    from syncd import lease
    from syncd.service import RunSync
    from webapp.runs.records import DatabaseRecorder

    url, restart = own_dataplane
    sync = make_run_sync(redis_url, tmp_path, "decoupled", dataplane_url=url)
    merge_once(sync)  # committed by grant 0 (this helper holds no lease)
    merged = sync.store.globals.full(0)
    folder = tmp_path / f"run-{sync.store.run_id}" / "published"
    assert (folder / "0-0-odd.published").exists()

    restart()
    grant = lease.acquire(sync.store.client, sync.store.run_id, "syncd-b", ttl_s=60)
    store = RunStore(sync.store.client, sync.store.run_id, fence=grant, data=connect(url))
    clock = {"now": 2000.0}
    again = RunSync(store, DatabaseRecorder(sync.recorder.run_id), tmp_path,
                    clock=lambda: clock["now"], control_every_s=0.0)
    assert store.globals.full(0) == merged  # published again from grant 0's file

    heartbeat_all(again)
    send(again, "a", 0, 8, base_version=1)
    send(again, "b", 0, 8, base_version=1)
    again.tick()

    assert store.globals.versions()[0] == 2
    assert store.globals.fencing_tokens()[0] == grant.token > 0
    # Version 1 published again and version 2, both in this grant's files; grant 0's gone.
    assert sorted(p.name for p in folder.glob("0-*")) == [
        f"0-{grant.token}-even.published", f"0-{grant.token}-odd.published"]

    # And the next grant restores from that grant's file, not grant 0's (gone).
    merged = store.globals.full(0)
    assert lease.release(store.client, grant)
    restart()
    later = lease.acquire(store.client, store.run_id, "syncd-c", ttl_s=60)
    store = RunStore(store.client, store.run_id, fence=later, data=connect(url))
    again = RunSync(store, DatabaseRecorder(sync.recorder.run_id), tmp_path,
                    clock=lambda: clock["now"], control_every_s=0.0)
    assert again.rounds.sync.version(0) == 2
    assert store.globals.full(0) == merged


def test_a_saved_message_that_does_not_verify_sends_the_run_back_to_its_checkpoint(
        redis_url, own_dataplane, tmp_path):
    """What protocol 1 wrote (Ed25519 over SHA-256, not BLAKE3) reads after an upgrade as
    a message that does not verify: with the data plane's copy gone too, syncd goes on
    from the run's newest checkpoint, as a declared rollback, and never publishes it."""
    from syncd.service import RunSync
    from webapp.runs.records import DatabaseRecorder

    url, restart = own_dataplane
    sync = make_run_sync(redis_url, tmp_path, "decoupled", dataplane_url=url)
    sync.recovery.save_checkpoint(sync.rounds, None)  # at versions [0, 0]
    sync.recorder.flush()
    checkpointed = {n: t.clone() for n, t in sync.rounds.sync.globals[0].items()}
    merge_once(sync)
    files, token = sync.rounds.files, sync.store.globals.fencing_tokens().get(0, 0)
    full, momentum = files.load(0, 1, token)
    body = bytes(full[:-SIGNATURE_BYTES])
    files.save(0, 1, token, bytearray(body + sync.spec.publish_key.sign(
        hashlib.sha256(body).digest())), momentum)

    restart()
    again = RunSync(sync.store, DatabaseRecorder(sync.recorder.run_id), tmp_path,
                    clock=lambda: 2000.0)

    assert again.rounds.sync.versions() == [1, 1]  # the checkpoint's, published as newer
    assert all(again.rounds.sync.globals[0][n].equal(t) for n, t in checkpointed.items())
    _, meta, _ = decode_message(sync.store.globals.full(0), sync.spec.verify_key)
    assert meta["version"] == 1
    again.recorder.flush()
    assert Event.objects.filter(run_id=sync.recorder.run_id, kind="rollback").exists()
