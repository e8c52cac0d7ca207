"""Fenced writes (syncd/fence.py): a write commits only while its lease holds, on a real
Redis of the tests' own."""

import pytest

from syncd import lease
from syncd.connection import connect
from syncd.fence import LeaseLost, guarded_transaction
from syncd.keys import lease_key

pytestmark = pytest.mark.integration


def test_a_write_is_refused_when_the_lease_changes_hands_during_it(client, redis_url):
    held = lease.acquire(client, 7, "syncd-a", ttl_s=30)
    other = connect(redis_url)

    def fill(pipe):
        pipe.set("arch:7:full:0", b"late")
        # Between WATCH and EXEC the lease moves on (as after an expiry).
        other.delete(lease_key(7))
        lease.acquire(other, 7, "syncd-b", ttl_s=30)

    with pytest.raises(LeaseLost, match="is gone"):
        guarded_transaction(client, held, fill)
    assert client.get("arch:7:full:0") is None
    other.close()


def test_a_write_goes_through_when_its_holder_renews_the_lease_during_it(client, redis_url):
    held = lease.acquire(client, 7, "syncd-a", ttl_s=30)
    keeper = connect(redis_url)  # syncd's lease-keeper thread has a connection of its own
    renewed = []

    def fill(pipe):
        pipe.set("arch:7:full:0", b"merged")
        if not renewed:  # between WATCH and EXEC, once
            renewed.append(lease.renew(keeper, held, ttl_s=30))

    guarded_transaction(client, held, fill)

    assert renewed == [True]
    assert client.get("arch:7:full:0") == b"merged"
    keeper.close()
