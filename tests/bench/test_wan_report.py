"""bench wan's figures and checks (bench/wan.py), from heartbeats and outcomes of the
tests' own."""

import pytest

from bench.wan import SIZES, agreement, checks, figures, loss_at, median_run, run_config


def beat(at: float, **fields) -> dict:
    return {"time": at, "state": "training", "pull_wait_s": 0.0, "backpressure_wait_s": 0.0,
            **fields}


def test_a_runs_figures_are_mean_link_times_the_worst_islands_utilization_and_merges():
    first = {"a": beat(100.0), "b": beat(100.0)}
    last = {"a": beat(110.0, sends=4, send_link_s=0.8, pulls=2, pull_link_s=0.5,
                      pull_wait_s=0.5),
            "b": beat(110.0, sends=6, send_link_s=1.2, pulls=3, pull_link_s=0.75,
                      backpressure_wait_s=1.0)}
    outcome = {"versions": [5, 7], "eval_loss": 2.5, "tokens_merged": 1000}

    out = figures(first, last, outcome, wall_s=120.0, evals=[(30.0, 3.0), (90.0, 2.6)])

    assert (out["send_s"], out["pull_s"]) == (0.2, 0.25)
    assert out["utilization_by_island"] == {"a": 0.95, "b": 0.9}
    assert out["utilization"] == 0.9
    assert (out["merges"], out["merges_per_min"]) == (12, 6.0)
    assert loss_at(out["curve"], 60.0) == 3.0 and loss_at(out["curve"], 10.0) is None


def test_agreement_is_the_emulated_figures_distance_from_the_kernels_as_a_share_of_it():
    assert agreement(1.1, 1.0) == pytest.approx(0.1)
    assert agreement(0.9, 1.0) == pytest.approx(0.1)


def case(size: str, send: float, pull: float, loss: float, utilization: float) -> dict:
    return {"size": size, "send_disagreement": send, "pull_disagreement": pull,
            "loss_disagreement": loss, "kernel": {"utilization": utilization}}


def test_the_checks_take_the_worst_case_and_judge_utilization_only_from_85m():
    quick = checks([case("tiny", 0.05, 0.2, 0.01, 0.5)])
    assert set(quick) == {"send_time_agree", "pull_time_agree", "loss_equal_tokens"}
    assert quick["send_time_agree"]["ok"] and not quick["pull_time_agree"]["ok"]

    full = checks([case("tiny", 0.05, 0.1, 0.01, 0.5), case("85m", 0.1, 0.1, 0.02, 0.96)])
    assert full["utilization_85m"] == {"value": 0.96, "bound": ">= 0.95", "ok": True}
    assert full["send_time_agree"]["value"] == 0.1


def test_the_kernel_run_asks_for_no_emulated_link_and_each_island_for_the_links_rate():
    config = run_config(SIZES["tiny"], 40.0, "none", "/corpus.txt")
    assert config["emulation"] == {"link": "none"}
    assert {i["bandwidth_gbps"] for i in config["islands"]} == {0.04}
    assert {i["region"] for i in config["islands"]} == {"us-east", "us-west"}


def test_a_modes_figures_are_those_of_its_run_of_median_loss_with_every_loss_beside():
    runs = [{"eval_loss": 2.1, "pull_s": 0.3}, {"eval_loss": 1.9, "pull_s": 0.1},
            {"eval_loss": 2.0, "pull_s": 0.2}]

    assert median_run(runs) == {"eval_loss": 2.0, "pull_s": 0.2, "eval_losses": [2.1, 1.9, 2.0]}
    assert median_run(runs[:1]) == {**runs[0], "eval_losses": [2.1]}
