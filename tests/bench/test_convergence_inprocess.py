"""bench convergence --in-process: its variants, the loss at a virtual time, merges per
window and the checks, without training (the benchmark trains:
`python -m bench convergence --in-process`)."""

from dataclasses import replace

import pytest

from bench import convergence_inprocess as inprocess


def test_the_variants_share_the_workload_and_differ_only_in_their_merge_settings():
    configs = {v: inprocess.variant_config(v, "", 7) for v in inprocess.VARIANTS}
    for variant, config in configs.items():
        assert [i.speed for i in config.islands] == list(
            inprocess.CLOSE_SPEEDS if variant == "each_period_close" else inprocess.SPEEDS)
        assert (config.seed, config.budget.total_tokens) == (7, inprocess.TOKENS)
        assert (config.model, config.optim) == (configs["sync"].model, configs["sync"].optim)
    sync, at_quorum, each_period, close = (configs[v].sync for v in inprocess.VARIANTS)
    assert (sync.min_quorum, sync.overlap_steps) == (4, 0)
    assert (at_quorum.min_quorum, at_quorum.overlap_steps) == (2, 1)
    assert (at_quorum.merge_each_period, each_period.merge_each_period) == (False, True)
    assert replace(each_period, merge_each_period=False) == at_quorum
    assert close == each_period


def test_the_loss_at_a_time_is_linear_between_evaluations_and_flat_outside():
    curve = [{"time": 10.0, "eval_loss": 3.0}, {"time": 30.0, "eval_loss": 2.0},
             {"time": 20.0, "eval_loss": 2.5}]
    assert inprocess.loss_at(curve, 25.0) == pytest.approx(2.25)
    assert inprocess.loss_at(curve, 5.0) == 3.0
    assert inprocess.loss_at(curve, 40.0) == 2.0


def test_merges_per_window_is_one_when_each_fragment_merges_once_a_round():
    assert inprocess.merges_per_window(merges=40, fragments=4, tokens=1000,
                                       round_tokens=100) == 1.0
    assert inprocess.merges_per_window(80, 4, 1000, 100) == 2.0


def run(loss, at_time, virtual_s):
    return {"eval_loss": loss, "eval_loss_at_time": at_time, "virtual_s": virtual_s,
            "curve": [{"time": 0.0, "eval_loss": loss}]}


def test_the_common_time_is_the_shortest_end_of_the_runs_at_the_same_speeds():
    runs = {"sync": {"virtual_s": 100.0, "curve": [{"time": 50.0, "eval_loss": 3.0},
                                                  {"time": 100.0, "eval_loss": 2.0}]},
            "at_quorum": {"virtual_s": 80.0, "curve": [{"time": 40.0, "eval_loss": 3.0},
                                                      {"time": 80.0, "eval_loss": 2.2}]},
            "each_period_close": {"virtual_s": 60.0, "curve": [{"time": 60.0,
                                                                "eval_loss": 2.5}]}}
    assert inprocess.at_common_time(runs) == 80.0
    assert runs["sync"]["eval_loss_at_time"] == pytest.approx(2.4)
    assert runs["at_quorum"]["eval_loss_at_time"] == 2.2
    assert "eval_loss_at_time" not in runs["each_period_close"]


def test_the_checks_read_the_mean_of_each_seeds_ratio():
    seeds = {"1": {"sync": run(2.0, 2.0, 1), "at_quorum": run(2.2, 2.1, 1),
                   "each_period": run(2.02, 2.05, 1), "each_period_close": run(2.0, 2.0, 1)},
             "2": {"sync": run(2.0, 2.0, 1), "at_quorum": run(2.0, 2.0, 1),
                   "each_period": run(2.0, 2.1, 1), "each_period_close": run(2.1, 2.1, 1)}}
    ratio = inprocess.ratios(seeds)
    assert ratio["each_period_vs_sync_tokens"] == pytest.approx(1.005)
    assert ratio["each_period_vs_at_quorum_tokens"] == pytest.approx((2.02 / 2.2 + 1) / 2)
    checks = inprocess.checks(ratio)
    assert checks["each_period_vs_sync_tokens"]["ok"]
    assert checks["each_period_vs_at_quorum_tokens"]["ok"]
    assert not checks["each_period_vs_at_quorum_time"]["ok"]  # (2.05/2.1 + 2.1/2.0) / 2 > 1
    assert ratio["close_vs_sync_tokens"] == pytest.approx(1.025)
    assert not checks["close_vs_sync_tokens"]["ok"]
