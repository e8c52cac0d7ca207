"""bench dataplane: its targets judged as issue 23 states them, and a run end to end on
a tiny profile (timings on a shared test machine mean nothing: the test checks the
keys docs/BENCHMARKS.md reads)."""

import json

import pytest
import torch

from bench import dataplane, results, utilization

LIMITS = {"memcpy_mb_s": 5000.0, "transport_mb_s": 400.0, "transport_read_mb_s": 800.0,
          "served_mb_s": 600.0, "served_read_mb_s": 2000.0, "tcp_mb_s": 2000.0}


def config(size, params, islands, ingest, pull, redis_peak=3.0, syncd_peak=4.0,
           transport="redis"):
    return {"size": size, "params": params, "islands": islands, "ingest_mb_s": ingest,
            "pull_mb_s": pull, "redis_peak_ratio": redis_peak, "syncd_peak_ratio": syncd_peak,
            "transport": transport}


def test_targets_are_judged_from_100m_parameters_against_the_limits():
    checks = dataplane.checks([config("100M", 106_707_456, 2, ingest=160.0, pull=390.0),
                               config("100M", 106_707_456, 16, ingest=110.0, pull=420.0,
                                      redis_peak=3.2, syncd_peak=4.8),
                               config("6M", 5_125_760, 2, ingest=1.0, pull=1.0),
                               config("6M", 5_125_760, 4, ingest=1.0, pull=1.0)], LIMITS)

    assert checks["100M M=2 redis ingest MB/s"]["ok"]
    assert checks["100M M=2 redis ingest / transport"]["ok"]  # 160 >= 0.3 x 400
    assert not checks["100M M=2 redis pull / transport read"]["ok"]  # 390 < 0.5 x 800
    assert not checks["100M M=16 redis ingest MB/s"]["ok"]
    assert checks["100M redis redis_peak_ratio M=16 over M=2 - 1"]["ok"]  # +6.7%
    assert not checks["100M redis syncd_peak_ratio M=16 over M=2 - 1"]["ok"]  # +20%
    assert not any(k.startswith("6M") for k in checks)  # under 100M: not judged
    assert len(checks) == 2 * 4 + 2


def test_a_served_configs_pull_is_judged_against_the_served_read_and_ingest_against_redis():
    checks = dataplane.checks([config("100M", 106_707_456, 2, ingest=125.0, pull=900.0,
                                      transport="served")], LIMITS)

    assert checks["100M M=2 served ingest / transport"]["ok"]  # 125 >= 0.3 x 400 (Redis)
    assert not checks["100M M=2 served pull / transport read"]["ok"]  # 900 < 0.5 x 2000
    assert checks["100M M=2 served pull MB/s"]["ok"]


def merge(at, **seqs):
    return {"at": at, "seqs": seqs}


def test_sustained_ingest_counts_the_updates_merged_after_the_warm_merges_over_their_time():
    h = dataplane.H
    merges = [merge(10.0, a=h, b=h), merge(14.0, a=2 * h, b=2 * h),
              merge(15.0, a=4 * h, b=3 * h),  # a's two increments and b's one: 3 updates
              merge(16.0, a=5 * h, b=5 * h),  # every island's fifth in: the phase's end
              merge(99.0, a=6 * h, b=6 * h)]

    # From the second merge's publish (14 s) to 16 s: 3 + 3 updates of 10 MB in 2 s.
    assert dataplane.sustained_mb_s(merges, 10_000_000, ["a", "b"], 5 * h, warm=2) == 30.0
    # From the first merge's publish (10 s): 2 + 3 + 3 updates in 6 s.
    assert dataplane.sustained_mb_s(merges, 10_000_000, ["a", "b"], 5 * h, warm=1) == \
        (2 + 3 + 3) * 10 / 6.0


def test_sustained_ingest_is_not_told_from_fewer_than_two_merges_after_the_warm_ones():
    merges = [merge(1.0, a=8), merge(2.0, a=16), merge(3.0, a=24), merge(4.0, a=32)]

    assert dataplane.sustained_mb_s(merges, 1_000_000, ["a"], 24, warm=2) is None
    missed = dataplane.checks([config("100M", 106_707_456, 2, ingest=None, pull=900.0)],
                              LIMITS)
    assert not missed["100M M=2 redis ingest MB/s"]["ok"]  # not told: missed


def test_the_full_profile_measures_a_llama_of_at_least_100m_parameters_by_its_own_tensors():
    from diloco import hf
    from diloco.presets import LLAMA_114M

    shapes = dataplane.shapes_of("llama-114M")

    assert "llama-114M" in dataplane.PROFILES["full"]["sizes"]
    assert dataplane.run_config("llama-114M", 2)["model"]["source"] == "hf"
    assert {n: torch.Size(s).numel() for n, s in shapes.items()} == \
        hf.tensor_sizes(json.dumps(LLAMA_114M), dataplane.BLOCK, 256)
    assert sum(torch.Size(s).numel() for s in shapes.values()) >= dataplane.TARGET_PARAMS


def test_an_unknown_preset_is_refused_before_anything_starts(monkeypatch, tmp_path):
    monkeypatch.setattr(dataplane, "HOME", tmp_path / "home")

    with pytest.raises(SystemExit, match="unknown preset 'huge'; expected one of demo"):
        dataplane.main(preset="huge")

    assert not (tmp_path / "home").exists()


@pytest.mark.integration
def test_a_tiny_profile_runs_end_to_end(monkeypatch, tmp_path):
    monkeypatch.setattr(results, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(dataplane, "HOME", tmp_path / "home")
    monkeypatch.setitem(dataplane.SIZES, "tiny", {"n_layer": 1, "n_embd": 32, "n_head": 2})
    monkeypatch.setitem(dataplane.PROFILES, "quick", {
        "sizes": ["tiny"], "islands": [2], "rounds": 8, "pulls": 1, "limit_bytes": 1 << 20,
        "transports": ["served", "redis"]})
    monkeypatch.setitem(utilization.SETTINGS, "quick", {
        "model": {"n_layer": 1, "n_embd": 32, "n_head": 2, "block_size": 32},
        "inner_steps": 8, "fragments": 4, "overlap_steps": 1, "outer_steps": 4,
        "bare_s": 1.0, "timeout_s": 600.0})

    assert dataplane.main(quick=True) == 0

    out = json.loads((tmp_path / "results" / "dataplane-quick.json").read_text())
    assert set(out["limits"]) == {"memcpy_mb_s", "transport_mb_s", "transport_read_mb_s",
                                  "served_mb_s", "served_read_mb_s", "tcp_mb_s",
                                  "disk_write_mb_s"}
    assert all(v > 0 for v in out["limits"].values())
    run, on_redis = out["configs"]  # both transports, side by side
    assert (run["transport"], on_redis["transport"]) == ("served", "redis")
    assert on_redis["updates"] >= 4 and on_redis["pull_mb_s"] > 0
    assert (run["islands"], run["codec"], run["syncds"]) == (2, "int4", 1)
    assert run["updates"] >= 4 and run["merges"] >= 1
    for key in ("ingest_mb_s", "ingest_phase_mb_s", "ingest_p95_s", "pull_mb_s",
                "redis_peak_ratio", "syncd_peak_ratio", "syncd_cpu_share"):
        assert run[key] > 0, key
    assert run["ingest_p50_s"] <= run["ingest_p95_s"]
    assert out["checks"] == {}  # nothing of 100M: no target judged
    assert out["wall_s_at_100m"] == {} and run["wall_s"] > 0
    assert out["store"]["hiredis"]
    assert run["dataplane"] and run["disk_per_merged_mb"] > 0
    assert run["syncd_file_mb"] > 0  # each merge's published fragment, once
    assert out["disk"]["size"] == "tiny" and out["disk"]["before"] > 0
    assert out["disk"]["before_mb"]["dataplane_redis"] is None  # one Redis then
    u = out["utilization"]  # a real island over a 2 Gb/s link, beside a bare loop
    assert (u["link_gbps"], u["overlap_steps"], u["target"]) == (2.0, 1, 0.95)
    assert 0 < u["value"] <= 1.5 and u["steps"] >= 32 and u["bare_step_s"] > 0
    assert u["merges"] >= 4 and u["pulls"] > 0  # every fragment merged, and pulled
    assert u["pull_wait_s"] >= 0 and u["late_globals"] >= 0
