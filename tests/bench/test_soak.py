"""The chaos soak's CI tier: a short soak on the real system in which every kind of
fault fires at least once, and every invariant holds afterwards.

It runs `bench.soak.main(quick=True)` in a process of its own (it sets up Django
on a database of its own, which pytest's Django must not share), with its
system and its results under a temporary folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.soak import KINDS
from bench.soak_checks import merge_ledger

ROOT = Path(__file__).resolve().parents[2]


def test_the_ledger_counts_each_merge_once_and_sees_versions_that_do_not_grow():
    events = [("merge", {"fragment": 0, "version": 1, "tokens": 64}),
              ("merge", {"fragment": 1, "version": 1, "tokens": 64}),
              ("merge", {"fragment": 0, "version": 3, "tokens": 128, "reason": "recovered"}),
              ("merge", {"fragment": 0, "version": 3, "tokens": 64}),
              ("rollback", {"versions": [5, 4]}),
              ("merge", {"fragment": 1, "version": 5, "tokens": 64})]

    ledger = merge_ledger(events)

    assert ledger["tokens"] == {0: 256, 1: 128}
    assert ledger["duplicates"] == [{"fragment": 0, "version": 3}]
    assert ledger["out_of_order"] == [{"fragment": 0, "version": 3, "after": 3}]
    assert ledger["newest"] == {0: 5, 1: 5} and ledger["rollbacks"] == 1
    assert ledger["recovered"] == 1


@pytest.mark.integration
@pytest.mark.system
def test_a_quick_soak_fires_every_kind_and_keeps_every_invariant(tmp_path):
    script = textwrap.dedent(f"""
        from pathlib import Path
        from bench import results, soak
        results.RESULTS = Path({str(tmp_path / 'results')!r})
        raise SystemExit(soak.main(quick=True, home=Path({str(tmp_path / 'system')!r})))
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=420)
    results = tmp_path / "results" / "soak-quick.json"
    assert results.exists(), out.stderr[-4000:]
    data = json.loads(results.read_text())

    assert all(data["by_kind"][kind] >= 1 for kind in KINDS), data["by_kind"]
    assert data["invariants"] == dict.fromkeys(data["invariants"], True), \
        json.dumps(data["details"])[:4000]
    assert set(data["invariants"]) == {
        "budget_completed", "versions_only_went_up", "tokens_counted_once",
        "checkpoints_verify", "database_agrees_with_syncd", "hostile_entries_quarantined",
        "merging_after_hostile_entries", "keys_outside_hostile_entries_kept",
        "no_process_left_behind"}
    assert 0 < data["goodput"] <= 1
    assert out.returncode == 0, out.stderr[-4000:]
