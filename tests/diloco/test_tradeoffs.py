"""The costs of K, grace, alpha and tau quote the benchmarks' figures as committed: a
results file re-run with other figures fails here until the texts say the new ones."""

import json
from pathlib import Path

from diloco.config import RunConfig, field_help
from diloco.tradeoffs import COSTS, tradeoffs

ROOT = Path(__file__).resolve().parents[2]


def test_the_costs_of_k_and_tau_quote_the_quick_convergence_results():
    result = json.loads((ROOT / "bench/results/convergence-quick.json").read_text())
    decoupled, sync = result["modes"]["decoupled"]["none"], result["modes"]["sync"]["none"]
    assert result["workload"]["sync"]["min_quorum"] == 2
    assert len(result["workload"]["islands"]) == 4
    assert result["machine"]["commit"] == "f47e1dc" and result["load_before"][0] == 2.69
    k_speed, k_quality = COSTS["min_quorum"]

    assert f"{decoupled['tokens'] / sync['tokens']:.2f}x the tokens" in k_speed
    assert f"{result['checks']['loss_equal_time']['value']:.3f}x sync's at equal time" \
        in k_quality
    assert f"{result['checks']['loss_equal_tokens']['value']:.3f}x at equal tokens" \
        in k_quality
    assert f"{decoupled['merges_per_window']:.3f} merges per H window against " \
           f"{sync['merges_per_window']:.3f}" in k_quality
    assert f"age p95 {decoupled['staleness_p95']:.0f} against {sync['staleness_p95']:.0f}" \
        in k_quality
    assert f"{sync['tokens'] / decoupled['tokens']:.2f}x the tokens of the defaults" \
        in COSTS["overlap_steps"][0]


def test_the_costs_of_tau_and_alpha_quote_the_journals_tau_1_run():
    journal = (ROOT / "docs/journal/benchmarks-2026.md").read_text()
    tau_speed, tau_quality = COSTS["overlap_steps"]

    for figure in ("3,880,960", "3,858,432", "3,823,616"):
        assert figure in tau_speed and figure in journal
    assert "1.040x mode sync's loss at equal tokens" in tau_quality and "1.040" in journal
    assert "alpha 0 1.033x" in COSTS["alpha"][1] and "1.033" in journal


def test_the_cost_of_wait_share_quotes_the_full_convergence_results():
    result = json.loads((ROOT / "bench/results/convergence.json").read_text())
    decoupled, sync = result["modes"]["decoupled"]["none"], result["modes"]["sync"]["none"]
    assert result["machine"]["commit"].startswith("8ef9654") and result["profile"] == "full"
    speed, quality = COSTS["wait_share"]

    assert f"merged {decoupled['tokens']:,} tokens in 240 s against mode sync's " \
           f"{sync['tokens']:,}" in speed
    assert f"{result['checks']['loss_equal_time']['value']:.3f}x mode sync's loss at 240 s " \
           f"and {result['checks']['loss_equal_tokens']['value']:.3f}x at equal tokens" \
           in quality


def test_the_help_of_each_setting_says_its_speed_and_quality_with_the_source():
    described = field_help()
    for name in COSTS:
        text = described[f"sync.{name}"]
        assert "Speed: " in text and "Quality: " in text, name
        assert any(source in text for source in ("docs/journal/benchmarks-2026.md",
                                                 "bench/results/convergence-quick.json",
                                                 "bench/results/convergence.json",
                                                 "bench/results/convergence-inprocess.json",
                                                 "bench simulate")), name


def test_the_estimate_says_the_costs_of_the_configs_own_values():
    sync = RunConfig().sync
    at_defaults = {t["setting"]: t for t in tradeoffs(
        sync.min_quorum, 4, sync.grace_gamma, sync.alpha, sync.overlap_steps,
        sync.wait_share, sync.merge_each_period)}
    waiting = {t["setting"]: t["value"] for t in tradeoffs(4, 4, 0.0, 0.5, 0, 0.15, False)}
    never = {t["setting"]: t["value"] for t in tradeoffs(2, 4, 1.0, 0.0, 1, 0.0, True)}

    assert list(at_defaults) == ["sync.min_quorum", "sync.grace_gamma", "sync.alpha",
                                 "sync.overlap_steps", "sync.wait_share",
                                 "sync.merge_each_period"]
    assert at_defaults["sync.merge_each_period"]["value"].startswith("true: ")
    assert at_defaults["sync.min_quorum"]["value"] == "2 of 4 islands"
    assert at_defaults["sync.alpha"]["value"].startswith("0: the global replaces")
    assert at_defaults["sync.wait_share"]["value"] == (
        "0.35: waits while that slows the run's pace by at most that share")
    assert never["sync.wait_share"] == "0: islands never wait"
    assert all(t["speed"] and t["quality"] and t["source"] for t in at_defaults.values())
    assert waiting == {"sync.min_quorum": "4 of 4 islands: every merge waits for the slowest "
                                          "island",
                       "sync.grace_gamma": "0: no window, a merge at quorum",
                       "sync.alpha": "0.5",
                       "sync.overlap_steps": "0: each island waits for each merge",
                       "sync.wait_share": "0.15: tau is 0, islands always wait",
                       "sync.merge_each_period": "false: a round merges at quorum and grace"}


def test_the_cost_of_merge_each_period_quotes_the_in_process_results():
    result = json.loads((ROOT / "bench/results/convergence-inprocess.json").read_text())
    at_quorum, each_period = (result["seeds"]["1234"][v] for v in ("at_quorum", "each_period"))
    ratios = result["ratios"]
    speed, quality = COSTS["merge_each_period"]

    assert at_quorum["pace"] == each_period["pace"]
    assert f"({each_period['pace'][0]:,} tokens at {each_period['pace'][1]:.1f} virtual s " \
           "either way)" in speed
    assert f"({each_period['virtual_s']} s against {at_quorum['virtual_s']} s" in speed
    assert f"{each_period['merges_per_window']:.3f} merges per H window against " \
           f"{at_quorum['merges_per_window']:.3f} off" in quality
    assert f"{ratios['each_period_vs_at_quorum_tokens']:.3f}x off's at equal tokens" in quality
    assert f"({ratios['each_period_vs_sync_tokens']:.3f}x mode sync's, off: " \
           f"{ratios['at_quorum_vs_sync_tokens']:.3f}x)" in quality
    assert f"{ratios['each_period_vs_at_quorum_time']:.3f}x off's at equal time" in quality
    assert f"islands at nearly one pace {ratios['close_vs_sync_tokens']:.3f}x mode sync's" \
        in quality
