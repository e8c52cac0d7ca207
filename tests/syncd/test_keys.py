"""The key table (syncd.keys): every key of a run starts with its prefix, and the lease,
pool and syncd keys are named as the table says."""

from syncd.keys import (
    RUNS_KEY,
    SYNCD_CONTROL_KEY,
    SYNCD_MEMBERS_KEY,
    lease_key,
    lease_token_key,
    pool_key,
    run_prefix,
)


def test_a_runs_keys_start_with_arch_and_its_id_whether_given_as_int_or_str():
    assert run_prefix(7) == run_prefix("7") == "arch:7:"


def test_a_runs_lease_and_its_fencing_counter_are_keys_of_the_run():
    assert lease_key(7) == "arch:7:lease"
    assert lease_token_key("7") == "arch:7:lease_token"
    assert lease_key(7).startswith(run_prefix(7))


def test_a_regions_pool_keys_are_its_claims_and_hosts():
    assert pool_key("us-east", "claims") == "arch:pool:us-east:claims"
    assert pool_key("us-east", "hosts") == "arch:pool:us-east:hosts"


def test_the_keys_of_no_one_run_share_no_runs_prefix():
    shared = (RUNS_KEY, SYNCD_CONTROL_KEY, SYNCD_MEMBERS_KEY, pool_key("us-east", "claims"))
    assert not [key for key in shared if key.split(":")[1].isdigit()]
    assert len(set(shared)) == len(shared)
