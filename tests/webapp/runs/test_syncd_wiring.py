"""The web side's hooks that `manage.py syncd` hands to syncd (webapp/runs/syncd_wiring.py):
records in the database, rejoins through the run services, pushes through the channel
layer. (A syncd serving runs with them: tests/syncd/test_server.py.)"""

import pytest

from diloco.signing import island_key
from syncd.hooks import Hooks
from syncd.live import LiveNotifier
from tests.webapp.runs.three_islands import commands
from webapp.runs.models import Event, Island
from webapp.runs.records import DatabaseRecorder
from webapp.runs.syncd_wiring import rejoin, web_hooks


def test_the_hooks_are_the_database_recorder_the_rejoin_and_the_channel_layers_pushes():
    hooks = web_hooks()

    assert isinstance(hooks, Hooks)
    assert hooks.recorder is DatabaseRecorder
    assert hooks.rejoin is rejoin
    assert isinstance(hooks.notify, LiveNotifier)


@pytest.mark.django_db
@pytest.mark.integration
def test_a_chaos_rejoin_starts_the_next_epoch_of_the_island_with_no_actor(
        running, store, enqueued, redis_url):
    web_hooks().rejoin(running.pk, "west-a")

    assert Island.objects.get(run=running, name="west-a").epoch == 2
    assert commands(store(running), "west-a") == [{"kind": "stop", "epoch": 1}]
    key = island_key(bytes.fromhex(running.secret), "west-a", 2).hex()
    assert enqueued == [{"args": [running.pk, "west-a", 2, redis_url, key],
                         "queue": "region.us-west"}]
    event = Event.objects.get(run=running, kind=Event.Kind.REJOIN)
    assert (event.island.name, event.actor, event.detail["epoch"]) == ("west-a", None, 2)
