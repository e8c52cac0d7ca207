"""A host's pool manager (trainer.pool_manager) against a real Redis, with no standbys
(size 0) so that nothing is started: its announcements, the claims it refuses and
where it says so, and its leaving. The islands it starts are tested for real in
tests/webapp/runs/test_warm_pool.py."""

import pytest

from syncd.connection import connect
from syncd.pool_store import PoolStore
from syncd.store import RunStore
from trainer.island_logs import island_log_path
from trainer.pool_manager import PoolManager

pytestmark = pytest.mark.integration


@pytest.fixture
def manager(redis_url, tmp_path):
    manager = PoolManager(redis_url, "us-east", 0, tmp_path / "logs", host="host-1",
                          claims_key=b"the run services' claims key")
    yield manager
    manager.shutdown(timeout=1)


@pytest.fixture
def run(redis_url) -> RunStore:
    """Run 7, active, its island a at epoch 2."""
    store = RunStore(connect(redis_url), 7)
    store.put_spec("decoupled", {"islands": [{"name": "a", "region": "us-east"}]}, "00")
    store.set_epoch("a", 2)
    return store


def pool_log(manager: PoolManager) -> str:
    return (manager.log_dir / "pool-us-east.log").read_text()


def test_a_manager_announces_its_pool_and_at_most_every_second(manager, redis_url):
    pools = PoolStore(connect(redis_url))

    manager.announce()
    first = pools.hosts("us-east")["host-1"]
    manager.announce()

    assert pools.hosts("us-east")["host-1"] == first
    assert (first["size"], first["ready"], first["islands"], first["standbys"]) == (0, 0, 0, [])
    manager.announce(force=True)
    assert pools.hosts("us-east")["host-1"]["time"] >= first["time"]


def test_a_stale_claim_is_refused_in_the_pool_log_and_the_islands_log(manager, run):
    manager.handle({"run": 7, "island": "a", "epoch": 1, "asked_at": 0.0})

    refusal = "claim refused: stale claim: epoch 1 of island 'a', which is at epoch 2 now"
    assert refusal in pool_log(manager)
    assert refusal in island_log_path(manager.log_dir, "7", "a").read_text()
    assert manager.islands == {}


def test_a_claim_of_a_run_not_active_is_refused_in_the_pool_log_only(manager, run):
    run.control.request_stop(at=1.0)

    manager.handle({"run": 7, "island": "a", "epoch": 2, "asked_at": 0.0})

    assert "claim refused: run 7 is not active" in pool_log(manager)
    assert not island_log_path(manager.log_dir, "7", "a").exists()


def test_a_tick_hands_each_claim_waiting_to_its_check_and_starts_no_standby(manager, run,
                                                                          redis_url):
    pools = PoolStore(connect(redis_url))
    pools.push_claim("us-east", {"run": 7, "island": "a", "epoch": 3, "asked_at": 0.0})
    pools.push_claim("us-east", {"not": "a claim"})

    manager.tick()

    assert "claim for epoch 3 of island 'a', which is only at epoch 2" in pool_log(manager)
    assert "a claim names run, island, epoch" in pool_log(manager)
    assert manager.standbys == {} and "host-1" in pools.hosts("us-east")


def test_a_manager_that_shuts_down_leaves_the_regions_hosts(manager, redis_url):
    manager.announce()

    manager.shutdown(timeout=1)

    assert PoolStore(connect(redis_url)).hosts("us-east") == {}
