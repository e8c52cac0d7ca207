"""The bookkeeping of a host's warm standby pool and what makes a claim good
(trainer/pool.py), with plain values and times of the test's own."""

import pytest

from diloco.config import RunConfig
from diloco.config_parse import config_from_spec
from diloco.sizes import MIB, STANDBY_BASE_BYTES, estimate
from trainer.pool import Pool, check_claim, wanted_size, warm_for


def test_a_pool_refills_one_standby_at_a_time_up_to_its_size():
    pool = Pool(2)
    assert pool.needs_refill()
    pool.launched(101, now=0.0)
    assert not pool.needs_refill()  # one refill at a time
    pool.ready(101, now=3.0)
    assert pool.needs_refill()
    pool.launched(102, now=3.0)
    pool.ready(102, now=5.0)
    assert not pool.needs_refill()
    assert pool.counts() == {"size": 2, "ready": 2, "launching": 0, "claimed": 0,
                             "exited_unclaimed": 0}


def test_a_claim_takes_the_standby_ready_the_longest_and_never_the_same_one_twice():
    pool = Pool(3)
    for pid, ready_at in ((7, 2.0), (8, 1.0), (9, 3.0)):
        pool.launched(pid, now=0.0)
        pool.ready(pid, now=ready_at)
    first, second = pool.claim(), pool.claim()
    assert (first.pid, second.pid) == (8, 7)
    assert pool.counts()["claimed"] == 2
    assert pool.needs_refill()


def test_with_nothing_ready_a_claim_gets_none_and_the_start_is_cold():
    pool = Pool(1)
    pool.launched(5, now=0.0)
    assert pool.claim() is None  # still launching
    assert Pool(0).claim() is None  # the pool is off
    assert not Pool(0).needs_refill()


def test_a_standby_that_dies_unclaimed_leaves_the_pool_and_is_replaced():
    pool = Pool(1)
    pool.launched(5, now=0.0)
    pool.ready(5, now=1.0)
    assert pool.exited(5).pid == 5
    assert pool.exited(5) is None
    assert pool.needs_refill()
    assert pool.counts()["exited_unclaimed"] == 1
    pool.ready(5, now=2.0)  # a late "ready" of a process gone is ignored
    assert pool.claim() is None


def test_a_pool_size_must_be_a_whole_number_of_zero_or_more():
    with pytest.raises(ValueError, match="pool size must be a whole number of 0 or more"):
        Pool(-1)



def test_a_smaller_pool_ends_the_launching_standbys_first_then_the_youngest_ready():
    pool = Pool(4)
    for pid, ready_at in ((1, 1.0), (2, 2.0), (3, None), (4, 3.0)):
        pool.launched(pid, now=0.0)
        if ready_at is not None:
            pool.ready(pid, now=ready_at)
    pool.size = 1

    assert pool.surplus() == [3, 4, 2]
    assert pool.claim().pid == 1  # the one kept; the ended are gone from the pool
    assert pool.surplus() == []


def spec(islands: dict[str, int], **model) -> dict:
    """A run spec with `islands` islands per region."""
    config = RunConfig().to_dict()
    config["model"].update(model)
    config["islands"] = [{**config["islands"][0], "name": f"{region}-{i}", "region": region}
                         for region, n in islands.items() for i in range(n)]
    return {"config": config}


def test_by_default_a_host_keeps_the_largest_active_runs_islands_in_its_region_plus_one():
    runs = {"1": spec({"us-east": 2, "us-west": 2}), "2": spec({"us-east": 3}, n_layer=1)}

    assert wanted_size(runs, "us-west", 10**12, serving={}) == (3, warm_for(runs["1"]))
    assert wanted_size(runs, "us-east", 10**12, serving={}) == (4, warm_for(runs["2"]))
    assert wanted_size({}, "us-east", 10**12, serving={}) == (1, {})  # one for a first start
    assert wanted_size(runs, "eu-west", 10**12, serving={}) == (1, {})


def test_islands_that_took_standbys_count_as_filled_slots_so_a_training_run_keeps_one_spare():
    runs = {"1": spec({"us-east": 2, "us-west": 2}), "2": spec({"us-east": 3}, n_layer=1)}

    assert wanted_size(runs, "us-west", 10**12, serving={"1": 2})[0] == 1
    assert wanted_size(runs, "us-west", 10**12, serving={"1": 1})[0] == 2  # one died
    # run 2's islands still want standbys here, whatever run 1 took
    assert wanted_size(runs, "us-east", 10**12, serving={"1": 2})[0] == 4
    assert wanted_size(runs, "us-east", 10**12, serving={"1": 2, "2": 3})[0] == 1


def test_the_default_pool_fits_in_the_memory_the_hosts_islands_leave():
    run = spec({"us-east": 4})
    sized = estimate(config_from_spec(run))
    island = max(need.total for need in sized.islands.values())
    standby = STANDBY_BASE_BYTES + sized.model_bytes
    memory = 2 * island + 2 * standby + MIB  # two islands and two standbys fit

    assert wanted_size({"1": run}, "us-east", memory, serving={"1": 2})[0] == 2
    assert wanted_size({"1": run}, "us-east", 3 * standby + MIB, serving={})[0] == 3
    assert wanted_size({"1": run}, "us-east", 10 * standby, serving={})[0] == 5  # 4 + 1
    assert wanted_size({"1": run}, "us-east", island, serving={"1": 1})[0] == 0  # no room left

CLAIM = {"run": 4, "island": "east-0", "epoch": 3, "asked_at": 10.0}


def test_a_claim_for_the_current_epoch_of_an_active_run_is_good():
    assert check_claim(CLAIM, active=True, current_epoch=3) is None


def test_a_stale_claim_from_an_old_epoch_is_refused():
    assert check_claim(CLAIM, active=True, current_epoch=4) == (
        "stale claim: epoch 3 of island 'east-0', which is at epoch 4 now")


@pytest.mark.parametrize(("claim", "active", "epoch", "reason"), [
    (CLAIM, False, 3, "run 4 is not active"),
    (CLAIM, True, None, "run 4 has no island 'east-0'"),
    (CLAIM, True, 2, "claim for epoch 3 of island 'east-0', which is only at epoch 2"),
    ({"run": 4, "island": "east-0"}, True, 3, "a claim names run, island, epoch"),
    ({**CLAIM, "epoch": "3"}, True, 3, "a claim's epoch is a whole number"),
])
def test_a_claim_for_another_run_or_epoch_is_refused(claim, active, epoch, reason):
    assert check_claim(claim, active, epoch).startswith(reason)


def test_a_standby_prepares_the_corpus_and_model_shape_of_the_run_it_last_served():
    spec = {"config": {"data": {"path": "/data/a.txt", "eval_fraction": 0.1},
                       "model": {"n_layer": 2, "n_embd": 32, "n_head": 2, "block_size": 16,
                                 "dropout": 0.0}}}
    assert warm_for(spec) == {"data": {"path": "/data/a.txt", "eval_fraction": 0.1},
                              "model": {"n_layer": 2, "n_embd": 32, "n_head": 2,
                                        "block_size": 16}}


def test_a_standby_prepares_the_corpus_as_the_run_tokenizes_it():
    data = {"path": "/data/a.jsonl", "eval_fraction": 0.1, "tokenizer": "train",
            "vocab_size": 4096, "text_field": "body", "unknown": 1}

    assert warm_for({"config": {"data": data}})["data"] == {
        "path": "/data/a.jsonl", "eval_fraction": 0.1, "tokenizer": "train",
        "vocab_size": 4096, "text_field": "body"}
