"""Status and events to the live pages through the channel layer."""

import pytest
from asgiref.sync import async_to_sync

from syncd.live import status_group
from webapp.runs.live import channel_notifier

pytestmark = pytest.mark.integration


def test_the_channel_notifier_delivers_to_the_runs_group(channel_layer):
    channel = async_to_sync(channel_layer.new_channel)()
    async_to_sync(channel_layer.group_add)(status_group(7), channel)
    channel_notifier()("7", 3, {"versions": [1, 2]})
    message = async_to_sync(channel_layer.receive)(channel)
    assert message == {"type": "run.status", "seq": 3, "status": {"versions": [1, 2]}}
