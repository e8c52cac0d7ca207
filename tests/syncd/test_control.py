"""Commands for syncd processes (syncd.control), against a real Redis."""

import pytest

from syncd.connection import connect
from syncd.control import kill_syncd, syncd_command

pytestmark = pytest.mark.integration


def test_a_kill_asked_for_is_the_next_command_syncd_reads_once(redis_url):
    client = connect(redis_url)
    assert syncd_command(client) is None

    kill_syncd(client)

    assert syncd_command(client) == "kill"
    assert syncd_command(client) is None
