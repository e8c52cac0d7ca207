"""Claims of warm standbys against the tests' Redis: signed, started at most once per
epoch, and handed back when the pool manager that took them dies. The island's start
itself is recorded instead of run (what it does is tests/trainer/test_standby.py's)."""

import time

import pytest
import redis

from syncd.pool_store import HAND_BACK_AFTER_S, PoolStore
from syncd.store import RunStore
from trainer.claims import claims_key, sign_claim
from trainer.island_logs import island_log_path
from trainer.pool_manager import PoolManager

pytestmark = pytest.mark.integration

KEY = claims_key("the web app's SECRET_KEY")
REGION = "us-east"


@pytest.fixture
def client(redis_server):
    client = redis.Redis.from_url(redis_server)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def run(client, make_config):
    store = RunStore(client, 41)
    store.put_spec("decoupled", make_config(islands=2).to_dict(), "ab" * 16)
    store.set_epoch("island-0", 1)
    store.set_epoch("island-1", 1)
    return store


def claim(island: str = "island-0", epoch: int = 1, **changes) -> dict:
    return {**sign_claim({"run": 41, "island": island, "epoch": epoch,
                          "asked_at": time.time(), "island_key": "cd" * 32}, KEY), **changes}


@pytest.fixture
def managers(redis_server, tmp_path, monkeypatch):
    """Pool managers of no standbys (every start is cold) whose starts are recorded."""
    started: list[tuple[str, str, str, int]] = []
    made: list[PoolManager] = []

    def make(host: str) -> PoolManager:
        manager = PoolManager(redis_server, REGION, 0, tmp_path, host=host, claims_key=KEY)
        monkeypatch.setattr(manager, "_supervise", lambda supervisor, children, claim:
                            started.append((host, supervisor.store.run_id, supervisor.island,
                                            supervisor.epoch)))
        made.append(manager)
        return manager

    yield make, started
    for manager in made:
        manager._log.close()


def island_log(tmp_path) -> str:
    path = island_log_path(tmp_path, "41", "island-0")
    return path.read_text() if path.exists() else ""


def test_a_replayed_claim_starts_nothing_on_the_same_host_or_another(run, managers,
                                                                      tmp_path):
    make, started = managers
    first, other = make("host-a:1"), make("host-b:2")
    signed = claim()

    first.handle(signed)
    first.handle(signed)
    other.handle(dict(signed))

    assert started == [("host-a:1", "41", "island-0", 1)]
    assert island_log(tmp_path).count("replayed claim: epoch 1 of island 'island-0'") == 2


@pytest.mark.parametrize("forged", [
    claim(sig=None),
    claim(sig="00" * 32),
    {**claim(), "island": "island-1"},  # a signed claim moved to another island
    {**claim(), "island_key": "ee" * 32},  # ... or given another key
])
def test_a_claim_not_signed_by_the_run_services_starts_nothing(run, managers, forged,
                                                                tmp_path):
    make, started = managers

    make("host-a:1").handle(forged)

    assert started == []
    log = island_log_path(tmp_path, "41", forged["island"]).read_text()
    assert "claim refused: the claim is not signed by the run services" in log


def test_a_signed_claim_for_an_epoch_that_is_not_the_islands_current_one_starts_nothing(
        run, managers):
    make, started = managers
    run.set_epoch("island-0", 2)

    make("host-a:1").handle(claim(epoch=1))
    make("host-a:1").handle(claim(epoch=3))

    assert started == []


def test_the_claims_of_a_pool_manager_that_died_are_handed_back_and_started_by_a_survivor(
        run, managers, client):
    make, started = managers
    pools = PoolStore(client)
    pools.push_claim(REGION, claim("island-0"))
    pools.push_claim(REGION, claim("island-1"))
    # A manager takes both and dies before it handles them; its last word is stale.
    taken = pools.take_claims(REGION, "dead:1", 0.1)
    assert [c["island"] for _, c in taken] == ["island-0", "island-1"]
    pools.put_host(REGION, "dead:1", {"time": time.time() - HAND_BACK_AFTER_S - 1})
    survivor = make("alive:2")

    survivor.tick()

    assert started == [("alive:2", "41", "island-0", 1), ("alive:2", "41", "island-1", 1)]
    assert client.llen(f"arch:pool:{REGION}:processing:dead:1") == 0
    assert client.llen(f"arch:pool:{REGION}:processing:alive:2") == 0  # handled
    assert client.llen(f"arch:pool:{REGION}:claims") == 0


def test_the_claims_of_a_pool_manager_still_announcing_itself_stay_with_it(client):
    pools = PoolStore(client)
    pools.push_claim(REGION, {"run": 41, "island": "island-0", "epoch": 1})
    now = time.time()
    (raw, _), = pools.take_claims(REGION, "busy:1", 0.1)
    pools.put_host(REGION, "busy:1", {"time": now})

    assert pools.hand_back_stale(REGION, now + HAND_BACK_AFTER_S - 1) == 0
    pools.done_claim(REGION, "busy:1", raw)
    assert pools.hand_back_stale(REGION, now + HAND_BACK_AFTER_S + 100) == 0  # handled
    assert pools.take_claims(REGION, "other:2", 0.05) == []
