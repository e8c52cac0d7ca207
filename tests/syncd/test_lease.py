"""Run leases with fencing tokens (syncd/lease.py) on a real Redis of the tests' own."""


import pytest

from syncd import lease
from syncd.fence import Lease, LeaseLost
from syncd.keys import lease_key
from syncd.store import RunStore
from tests.fixtures import wait_until

pytestmark = pytest.mark.integration


def test_a_lease_has_one_holder_and_each_grant_a_larger_fencing_token(client):
    first = lease.acquire(client, 7, "syncd-a", ttl_s=30)
    assert first is not None
    assert lease.acquire(client, 7, "syncd-b", ttl_s=30) is None
    assert lease.holder(client, 7) == (first.token, "syncd-a")

    assert lease.release(client, first)
    second = lease.acquire(client, 7, "syncd-b", ttl_s=30)
    assert second is not None and second.token > first.token
    assert lease.acquire(client, 8, "syncd-a", ttl_s=30) is not None  # runs are independent


def test_only_the_current_holder_renews_or_releases(client):
    held = lease.acquire(client, 7, "syncd-a", ttl_s=0.2)
    assert lease.renew(client, held, ttl_s=30)
    assert client.pttl(lease_key(7)) > 1000
    impostor = Lease("7", "syncd-b", held.token, lease_key(7))
    assert not lease.renew(client, impostor, ttl_s=30)
    assert not lease.release(client, impostor)
    assert lease.holder(client, 7) == (held.token, "syncd-a")


def test_an_expired_lease_is_taken_over_and_the_stale_holders_publish_is_refused(client):
    stale = lease.acquire(client, 7, "syncd-a", ttl_s=0.1)
    stale_store = RunStore(client, 7, fence=stale)
    stale_store.globals.publish(0, 1, b"v1", None, {"a": 4}, 100, keep=16)
    wait_until(lambda: lease.holder(client, 7) is None, 5, "the lease to expire")

    fresh = lease.acquire(client, 7, "syncd-b", ttl_s=30)
    assert fresh.token > stale.token
    with pytest.raises(LeaseLost, match="fencing token"):
        stale_store.globals.publish(0, 2, b"stale", None, {"a": 8}, 100, keep=16)
    with pytest.raises(LeaseLost):
        stale_store.put_status({"versions": [9]})
    assert not lease.renew(client, stale, ttl_s=30)

    assert stale_store.globals.versions() == {0: 1}
    assert stale_store.globals.full(0) == b"v1"
    RunStore(client, 7, fence=fresh).globals.publish(0, 2, b"v2", None, {"a": 8}, 100, keep=16)
    assert stale_store.globals.versions() == {0: 2}




def test_members_announce_themselves_and_drop_out_when_they_stop_renewing(client):
    assert lease.register(client, "syncd-a", ttl_s=30) == 1
    assert lease.register(client, "syncd-b", ttl_s=0.1) == 2
    wait_until(lambda: lease.members_alive(client) == ["syncd-a"], 5, "syncd-b to drop out")
    assert lease.register(client, "syncd-a", ttl_s=30) == 1
    lease.leave(client, "syncd-a")
    assert lease.members_alive(client) == []


@pytest.mark.parametrize(("runs", "members", "share"), [(0, 1, 0), (4, 1, 4), (4, 2, 2),
                                                         (5, 2, 3), (1, 3, 1), (3, 0, 3)])
def test_the_fair_share_is_runs_over_live_members_rounded_up(runs, members, share):
    assert lease.fair_share(runs, members) == share


def test_a_lease_needs_a_positive_time_to_live(client):
    with pytest.raises(ValueError, match="above 0 seconds"):
        lease.acquire(client, 7, "syncd-a", ttl_s=0)
def test_a_stale_holders_publish_never_touches_the_new_holders_chunks(client):
    """The chunks of a publish are written before its fenced transaction: under names of
    the writer's grant, so a refused publish of the same version leaves the new holder's
    message whole, and leaves nothing that lives for good."""
    stale = lease.acquire(client, 7, "syncd-a", ttl_s=0.1)
    wait_until(lambda: lease.holder(client, 7) is None, 5, "the lease to expire")
    fresh = lease.acquire(client, 7, "syncd-b", ttl_s=30)
    fresh_store = RunStore(client, 7, fence=fresh)
    fresh_store.globals.publish(0, 2, b"fresh v2", None, {"a": 8}, 100, keep=16)

    with pytest.raises(LeaseLost):
        RunStore(client, 7, fence=stale).globals.publish(0, 2, b"stale", None, {"a": 8},
                                                         100, keep=16)

    assert fresh_store.globals.full(0) == b"fresh v2"
    chunks = [k for k in client.scan_iter(match="arch:7:full:0:2:*")]
    lasting = [k for k in chunks if client.ttl(k) == -1]
    assert len(lasting) == 1  # the fresh holder's; the stale chunks expire


def test_a_publish_deletes_the_message_its_reference_named_before(client):
    store = RunStore(client, 7)
    store.globals.publish(0, 1, b"v1", None, {}, 1, keep=16)
    store.globals.publish(0, 2, b"v2", None, {}, 1, keep=16)
    assert store.globals.full(0) == b"v2"
    assert sorted(k.decode() for k in client.scan_iter(match="arch:7:full:0:*")) == \
        ["arch:7:full:0:2:0:0"]
