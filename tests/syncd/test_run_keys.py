"""One run's keys (syncd.run_keys): their names, the lease that fences syncd's writes,
against a real Redis."""

import pytest

from syncd.connection import connect
from syncd.fence import Lease
from syncd.globals_store import GlobalsStore
from syncd.keys import lease_key
from syncd.run_keys import RunKeys

pytestmark = pytest.mark.integration


def test_a_store_without_a_lease_writes_as_before_and_a_lease_must_be_for_its_run(redis_url):
    client = connect(redis_url)
    store = GlobalsStore(client, 7)
    store.publish(0, 1, b"v1", None, {}, 10, keep=16)
    assert store.versions() == {0: 1}
    with pytest.raises(ValueError, match="lease is for run 8"):
        RunKeys(client, 7, fence=Lease("8", "syncd-a", 1, lease_key(8)))


def test_a_runs_keys_are_its_prefix_and_parts_joined_by_colons(redis_url):
    keys = RunKeys(connect(redis_url), 7)

    assert keys.run_id == "7" and keys.prefix == "arch:7:"
    assert keys.key("full", 0, 3) == "arch:7:full:0:3"
