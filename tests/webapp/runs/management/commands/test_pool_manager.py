"""`manage.py pool_manager --region R --health`: the container health check of a host's
pool manager, 0 while one of this host announces itself for the region, 1 otherwise.
(The pool manager it starts is tests/webapp/runs/test_warm_pool.py's.)"""

import socket
import time

import pytest
from django.core.management import call_command

from syncd.connection import connect
from syncd.pool_store import PoolStore

pytestmark = pytest.mark.integration


def health(region: str) -> int:
    with pytest.raises(SystemExit) as exited:
        call_command("pool_manager", "--region", region, "--health")
    return exited.value.code


def test_the_health_check_fails_while_no_pool_manager_of_this_host_serves_the_region(
        redis_url):
    PoolStore(connect(redis_url)).put_host("us-east", "another-host:1", {"time": time.time()})

    assert health("us-east") == 1


def test_the_health_check_passes_while_this_hosts_pool_manager_announces_itself(redis_url):
    pools = PoolStore(connect(redis_url))
    pools.put_host("us-east", f"{socket.gethostname()}:4242", {"time": time.time()})

    assert health("us-east") == 0
    assert health("us-west") == 1


def test_the_health_check_fails_when_the_announcement_is_stale(redis_url):
    pools = PoolStore(connect(redis_url))
    pools.put_host("us-east", f"{socket.gethostname()}:4242", {"time": time.time() - 60})

    assert health("us-east") == 1
