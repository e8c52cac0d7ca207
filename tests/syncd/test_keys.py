"""The key table (syncd.keys): every key of a run starts with its prefix, the lease, pool
and syncd keys are named as the table says, and who writes and reads each key is what
docs/RELIABILITY.md shows."""

import re
from pathlib import Path

from syncd.keys import (
    ISLAND,
    ISLAND_READS,
    ISLAND_WRITES,
    KEY_USES,
    RUNS_KEY,
    SYNCD_CONTROL_KEY,
    SYNCD_MEMBERS_KEY,
    island_key_patterns,
    lease_key,
    lease_token_key,
    pool_key,
    run_prefix,
)

ROOT = Path(__file__).resolve().parents[2]
KEY_TABLE_HEADING = "### Who writes and reads each key"


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


def test_the_key_table_in_reliability_is_the_one_the_code_holds():
    """docs/RELIABILITY.md's table of who writes and reads each key is KEY_USES, row for
    row (the island users' key patterns are derived from KEY_USES: syncd/acl.py)."""
    text = (ROOT / "docs" / "RELIABILITY.md").read_text()
    table = text.split(KEY_TABLE_HEADING, 1)[1].split("\n\n", 2)[1]
    rows = [[cell.strip().strip("`") for cell in line.strip("|").split("|")]
            for line in table.splitlines()[2:]]
    assert rows == [[use.part, use.plane, ", ".join(use.writers), ", ".join(use.readers)]
                    for use in KEY_USES]


def test_every_key_of_a_run_the_code_names_is_in_the_key_table_and_no_other():
    named = set()
    for folder in ("syncd", "trainer", "webapp"):
        for path in (ROOT / folder).rglob("*.py"):
            named |= set(re.findall(r'\bkey\("([a-z_]+)"', path.read_text()))
    parts = {use.part.removesuffix(":*") for use in KEY_USES}
    named |= {"lease", "lease_token", "active", "started"}  # named by syncd.keys itself
    assert named == parts


def test_islands_write_no_key_shared_between_runs_nor_one_syncd_alone_writes():
    assert RUNS_KEY not in island_key_patterns(7, ISLAND_READS + ISLAND_WRITES)
    assert set(ISLAND_WRITES) == {"updates", "uploads", "blob:*", "heartbeats", "cursor:*",
                                  "fault:*", "tokenizer"}
    assert not [use.part for use in KEY_USES if ISLAND in use.writers
                and use.part in ("spec", "epochs", "versions", "full:*", "handled:*", "lease")]
