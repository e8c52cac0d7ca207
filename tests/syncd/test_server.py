"""syncd's process loop: live status goes to the run's channel layer group."""

import pytest
from asgiref.sync import async_to_sync

from syncd.server import Syncd, channel_notifier, status_group
from syncd.store import RunStore, connect
from webapp.runs.services import create_run

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
    served = Syncd(redis_url, tmp_path, lambda *message: pushed.append(message))
    served.tick()
    served.runs[str(run.pk)].next_status = 0.0  # the next tick is due a snapshot
    served.tick()

    assert [(run_id, seq) for run_id, seq, _ in pushed] == [(str(run.pk), 1), (str(run.pk), 2)]
    status = pushed[-1][2]
    assert status["versions"] == [0, 0]
    assert set(status["islands"]) == {"a", "b"}


def test_the_channel_notifier_delivers_to_the_runs_group(channel_layer):
    channel = async_to_sync(channel_layer.new_channel)()
    async_to_sync(channel_layer.group_add)(status_group(7), channel)
    channel_notifier()("7", 3, {"versions": [1, 2]})
    message = async_to_sync(channel_layer.receive)(channel)
    assert message == {"type": "run.status", "seq": 3, "status": {"versions": [1, 2]}}


def test_a_run_that_is_no_longer_active_is_let_go(redis_url, tmp_path):
    run = create_run(name="let go", mode="decoupled", config=CONFIG, user=None)
    store = RunStore(connect(redis_url), run.pk)
    store.put_spec(run.mode, run.config, run.secret)
    served = Syncd(redis_url, tmp_path)
    served.tick()
    assert str(run.pk) in served.runs
    store.deactivate()
    served.tick()
    assert served.runs == {}
