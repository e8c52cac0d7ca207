"""The keys of the hosts' pools of warm standbys (syncd.pool_store): claims taken in
order, announcements believed while fresh, against a real Redis."""

import pytest

from syncd.connection import connect
from syncd.keys import pool_key
from syncd.pool_store import PoolStore

pytestmark = pytest.mark.integration


@pytest.fixture
def pools(redis_url):
    return PoolStore(connect(redis_url), fresh_s=3.0)


def test_claims_are_taken_all_at_once_in_the_order_they_were_pushed(pools):
    pools.push_claim("us-east", {"run": 1, "island": "a"})
    pools.push_claim("us-east", {"run": 1, "island": "b"})
    pools.push_claim("us-west", {"run": 1, "island": "c"})

    taken = pools.take_claims("us-east", "host-1", timeout_s=1)
    assert [claim for _, claim in taken] == [{"run": 1, "island": "a"},
                                             {"run": 1, "island": "b"}]
    assert pools.take_claims("us-east", "host-1", timeout_s=0.01) == []


def test_an_unreadable_claim_is_handed_over_as_such(pools):
    pools.client.rpush(pool_key("us-east", "claims"), b"not json")

    assert pools.take_claims("us-east", "host-1", timeout_s=1) == [
        (b"not json", {"unreadable": "not json"})]


def test_only_hosts_that_announced_themselves_lately_count_for_the_ready_standbys(pools):
    pools.put_host("us-east", "fresh", {"ready": 2, "time": 100.0})
    pools.put_host("us-east", "old", {"ready": 5, "time": 90.0})
    pools.put_host("us-east", "gone", {"ready": 1, "time": 100.0})
    pools.remove_host("us-east", "gone")

    assert list(pools.hosts("us-east", now=101.0)) == ["fresh"]
    assert pools.ready("us-east", now=101.0) == 2
    assert pools.ready("us-west", now=101.0) == 0
