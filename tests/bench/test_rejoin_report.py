"""The rejoin benchmark's arithmetic and report (bench/rejoin.py), on figures made up
here: a cycle's seconds from its timestamps and the merge that counts as its first,
percentiles, a warm cycle that found the pool empty counted as cold, the keys
docs/BENCHMARKS.md reads, and a missed target reported as missed."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import rejoin, results
from syncd.records import Heartbeat


def sample(warm: bool, first_step: float, lost: float = 0.1, merge: float = 2.0) -> dict:
    return {"island": "us-east", "kind": "operator", "epoch": 2, "warm": warm,
            "kill_to_lost_s": lost, "lost_cause": "died", "rejoin_to_first_step_s": first_step,
            "rejoin_to_first_merge_s": merge, "phases": {"model": first_step / 2}}


def modes(warm_samples, cold_samples, creates=(2.0, 2.5)):
    return {"warm": {"creates": list(creates), "round_fill_s": 3.0, "first_merge_bound_s": 4.0,
                     "samples": warm_samples},
            "cold": {"creates": [9.0], "round_fill_s": 3.0, "first_merge_bound_s": 4.0,
                     "samples": cold_samples}}


def test_percentiles_are_linear_between_the_closest_ranks():
    assert rejoin.percentile([4.0, 1.0, 2.0, 3.0], 50) == 2.5
    assert rejoin.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 95) == pytest.approx(4.8)
    assert rejoin.percentile([], 50) is None


def test_a_warm_cycle_that_found_the_pool_empty_counts_as_cold():
    summary = rejoin.summarize(modes([sample(True, 0.5), sample(False, 9.0)],
                                     [sample(False, 10.0)]))
    assert summary["warm"]["cycles"] == 1
    assert summary["cold"]["cycles"] == 2
    assert summary["warm"]["rejoin_to_first_step_s"] == {"p50": 0.5, "p95": 0.5, "n": 1}
    assert summary["cold"]["rejoin_to_first_step_s"]["p50"] == 9.5
    assert summary["warm"]["phases_p50_s"] == {"model": 0.25}


def test_the_report_writes_warm_and_cold_with_each_figure_and_says_a_miss(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    code = rejoin.report(rejoin.PROFILES["quick"], True,
                         modes([sample(True, 0.4), sample(True, 1.6)], [sample(False, 10.0)]),
                         1.0)
    data = json.loads((tmp_path / "rejoin-quick.json").read_text())
    for mode in ("warm", "cold"):
        for key in rejoin.METRICS:
            assert set(data[mode][key]) >= {"p50", "p95"}
    assert code == 1  # rejoin to first step p95 is above 1 s
    assert not data["checks"]["warm rejoin to first step p95 (s)"]["ok"]
    assert data["checks"]["warm SIGKILL to lost p95 (s)"]["ok"]
    assert "FAILED: warm rejoin to first step" in capsys.readouterr().err


def test_a_cycles_seconds_run_from_the_kill_and_from_the_rejoin_asked_for():
    # Killed at 100.0, marked lost at 100.4; the outage ends and the rejoin is asked for
    # at 105.0; the new epoch's first step is 1.25 s after it, its first merge at 107.5.
    assert rejoin.cycle_seconds(100.0, 100.4, 105.0, 1.25, 107.5) == {
        "kill_to_lost_s": 0.4, "rejoin_to_first_step_s": 1.25,
        "rejoin_to_first_merge_s": 2.5}


def test_the_first_merge_is_the_first_that_took_in_the_rejoined_epochs_update():
    def merge(at: float, epoch: int, *islands: str) -> SimpleNamespace:
        return SimpleNamespace(time=at, detail={"weights": dict.fromkeys(islands, 0.5),
                                                "epochs": dict.fromkeys(islands, epoch)})

    merges = [merge(1.0, 2, "us-west", "eu"), SimpleNamespace(time=1.5, detail={}),
              merge(2.0, 1, "us-east", "eu"),  # epoch 1's update, pending since the kill
              merge(3.0, 2, "us-east"), merge(4.0, 2, "us-east")]
    assert rejoin.first_merge_of("us-east", 2, merges).time == 3.0
    assert rejoin.first_merge_of("us-east", 1, merges).time == 2.0
    assert rejoin.first_merge_of("ap", 2, merges) is None
    no_epochs = SimpleNamespace(time=5.0, detail={"weights": {"us-east": 1.0}})
    assert rejoin.first_merge_of("us-east", 2, [no_epochs]) is None


def test_the_first_merge_bound_is_a_fragments_cadence_not_the_runs_merge_gaps(
        tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    # H = 20 at the 2nd fastest of 0.1, 0.15, 0.3 s a step (K = 2): 3 s, plus 1 s.
    assert rejoin.first_merge_bound_s([0.3, 0.1, None, 0.15], 20, 2) == 4.0
    assert rejoin.first_merge_bound_s([None], 20, 2) is None
    out = modes([sample(True, 0.4, merge=3.5)], [sample(False, 10.0)])
    out["warm"]["round_fill_s"] = 30.0  # a slow merge path must not loosen the bound
    out["warm"]["first_merge_bound_s"] = 3.0

    rejoin.report(rejoin.PROFILES["quick"], True, out, 1.0)

    data = json.loads((tmp_path / "rejoin-quick.json").read_text())
    check = data["checks"]["warm rejoin to first merge p95 (s), 1 s + a fragment's cadence"]
    assert check == {"value": 3.5, "bound": "<= 3.0", "ok": False}


def test_the_real_size_rejoin_runs_the_presets_model_at_batch_one_in_the_benchs_regions():
    config = rejoin.real_size_workload("gpt2_small", Path("corpus.txt"))

    assert config["model"]["n_embd"] == 768 and config["model"]["n_layer"] == 12
    assert config["sync"]["compression"] == "int4"
    assert [i["batch_size"] for i in config["islands"]] == [1, 1]
    assert {i["region"] for i in config["islands"]} <= set(rejoin.REGIONS)
    with pytest.raises(ValueError, match="unknown preset"):
        rejoin.real_size_workload("gpt5", Path("corpus.txt"))


def test_a_rejoins_wire_time_is_each_fragments_pull_over_the_islands_link():
    config = {"islands": [{"bandwidth_gbps": 2.0, "latency_ms": 10.0}]}

    # Two fragments of 250 MB at 2 Gb/s: 1 s each, plus 10 ms of latency each.
    assert rejoin.pull_wire_s(config, [250_000_000, 250_000_000]) == pytest.approx(2.02)


class Beating:
    """An island's heartbeats on a clock of their own: a step every 2 s (the first ends
    at 0.3 s), a heartbeat every 0.5 s that says the steps done; each read of the
    heartbeats moves the clock 0.1 s on."""

    def __init__(self) -> None:
        self.now = 0.0

    def heartbeats(self) -> dict[str, Heartbeat]:
        self.now += 0.1
        at = self.now - self.now % 0.5
        return {"a": Heartbeat.bare(1, at, 100 + int((at + 1.7) // 2.0), 0)}


def test_the_step_time_before_a_kill_is_whole_steps_however_heartbeats_fall(monkeypatch):
    monkeypatch.setattr(rejoin.time, "sleep", lambda s: None)  # the clock is Beating's

    # syncd's rate window (1 s) gave such a step 1.0 or 1.5 s: a window, not a step.
    assert rejoin.step_time_before(Beating(), "a", span_s=10.0) == pytest.approx(2.0)
