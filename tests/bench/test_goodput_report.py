"""The goodput benchmark's arithmetic: the oracle bound from the schedule alone, the
system's own costs, one clock for both modes, quality-adjusted goodput against each
mode's fault-free runs, stalls with a quorum alive, the spread over seeds, and the
report page."""

import json

import pytest

from bench import results
from bench.goodput import (
    PROFILES,
    figures,
    oracle_of,
    quality_reference,
    report,
    scheduled_faults,
    standby_slots,
)
from bench.goodput_report import (
    figure_html,
    goodput_fields_above_one,
    merge_interval,
    oracle_goodput,
    revalued_goodput,
    scheduled_loss,
    spread,
    stall_with_quorum,
    system_costs,
)
from bench.quality_goodput import Reference
from diloco.chaos import PRESETS, Fault, schedule
from syncd.environment import data_dir

BASE = {"step_time_s": 0.1, "inner_steps": 10, "fragments": 2}


def test_without_faults_the_oracle_loses_nothing():
    assert oracle_goodput([], 4, 100.0, **BASE) == 1.0


def test_a_kill_costs_its_down_time_and_stretches_the_horizon_by_it():
    kill = Fault(10.0, "kill", ("a",), 10.0)
    # 4 islands train 4 x 100 s of work; 10 island-seconds lost make the run 102.5 s.
    assert oracle_goodput([kill], 4, 100.0, **BASE) == pytest.approx(1 - 10.0 / (4 * 102.5))


def test_each_kind_costs_what_it_takes_away():
    lost = {
        "partition": 8.0,
        "straggle": 8.0 * (1 - 1 / 4),
        "corrupt": 10 / 2 * 0.1,  # one fragment's update of H steps counts H/P
        "degrade": 0.0,
    }
    for kind, seconds in lost.items():
        fault = Fault(10.0, kind, ("a",), 8.0, 4.0 if kind == "straggle" else None)
        bound = oracle_goodput([fault], 1, 100.0, **BASE)
        assert bound == pytest.approx(1 - seconds / (100 + seconds)), kind


def test_faults_after_the_horizon_do_not_count_and_the_last_is_cut_at_it():
    late = Fault(95.0, "partition", ("a",), 10.0)  # the horizon grows to 110 s: all of it
    after = Fault(120.0, "kill", ("a",), 10.0)
    assert oracle_goodput([late, after], 1, 100.0, **BASE) == pytest.approx(1 - 10 / 110)
    assert scheduled_loss([late], 100.0, **BASE) == pytest.approx(5.0)


def test_a_region_outage_costs_every_island_it_hits():
    outage = Fault(10.0, "region_outage", ("a", "b"), 10.0)
    assert oracle_goodput([outage], 2, 100.0, **BASE) == pytest.approx(1 - 20 / (2 * 110))


ISLANDS = {"east-0": "us-east", "east-1": "us-east", "west-0": "us-west", "west-1": "us-west"}
AGGRESSIVE = {"preset": "aggressive", "seed": 3}


def test_the_oracles_faults_are_the_seeded_schedule_cut_at_the_runs_wall_time():
    drawn = schedule(PRESETS["aggressive"], ISLANDS, 3600.0, 3)
    horizon = drawn[2].at_s + 0.5  # the run ended half a second after the third fault

    faults = scheduled_faults(AGGRESSIVE, ISLANDS, horizon)

    # Every fault the schedule drew before the run's end, one row per island hit, whether
    # the system fired it or not (the events are not read at all).
    assert [(f["at_s"], f["kind"]) for f in faults] == \
        [(f.at_s, f.kind) for f in drawn[:3] for _ in f.islands]
    assert [f["island"] for f in faults] == [i for f in drawn[:3] for i in f.islands]
    longer = scheduled_faults(AGGRESSIVE, ISLANDS, drawn[5].at_s + 0.5)
    assert longer[:len(faults)] == faults and len(longer) > len(faults)
    assert scheduled_faults({"preset": "none", "seed": 0}, ISLANDS, 100.0) == []
    assert scheduled_faults(AGGRESSIVE, ISLANDS, -1.0) == []  # ended before it began


def test_the_oracle_bound_moves_with_the_schedule_and_not_with_the_systems_rejoins():
    config = {"islands": [{}] * 4, "sync": {"inner_steps": 10, "fragments": 2}}
    fault_free = {"outcome": {"wall_s": 60.0, "startup_s": 5.0}, "step_time_s": 0.1}
    kill = [{"at_s": 10.0, "kind": "kill", "island": "a", "duration_s": 8.0, "factor": None}]

    bound = oracle_of(kill, fault_free, config)

    assert bound == pytest.approx(1 - 8 / (4 * 57.0))
    # The same kill drawn at 56 s is cut at the horizon.
    assert oracle_of([{**kill[0], "at_s": 56.0}], fault_free, config) > bound
    slow_run, quick_run = (faulted_run(rejoin_s) for rejoin_s in (30.0, 1.0))
    steps = {"a": 0.1, "b": 0.1}
    assert figures(slow_run, 2, steps, REFERENCE)["system_costs"]["rejoin"] > \
        figures(quick_run, 2, steps, REFERENCE)["system_costs"]["rejoin"]


def test_standby_slots_are_allocated_capacity_in_the_runs_and_in_the_oracle():
    # 4 islands beside 4 standbys, 100 s: the kill's 10 island-seconds of 2 x 410.
    kill = Fault(10.0, "kill", ("a",), 10.0)
    assert oracle_goodput([kill], 4, 100.0, **BASE, standby=4) == \
        pytest.approx((4 * 102.5 - 10) / (8 * 102.5))
    run = faulted_run(1.0)  # 200 allocated island-seconds over 50 s of wall time
    with_pool = figures(run, 2, {"a": 0.1, "b": 0.1}, REFERENCE, standby=4)
    assert with_pool["allocated_s"] == pytest.approx(200 + 4 * 50)
    assert with_pool["goodput"] == pytest.approx((900 + 700) * 0.1 / 400)
    assert with_pool["system_costs"]["rejoin"] == pytest.approx(1.0 / 400)
    assert standby_slots({"islands": [{}] * 4}) == 4


def test_a_field_named_goodput_above_one_is_found_wherever_it_is_nested():
    tree = {"goodput": 0.9, "goodput_syncd": 1.5, "per_seed": [
        {"decoupled": {"goodput": 1.02, "uptime": 1.0}}, {"elastic": {"goodput": 1.0}}]}
    assert goodput_fields_above_one(tree) == ["per_seed[0].decoupled.goodput"]
    assert goodput_fields_above_one({"goodput": None}) == []


# Quality's reference: loss 3 at 100 tokens, 2 at 10,000 (two windows each), 0.1
# island-seconds a token after start-up.
REFERENCE = Reference([(100.0, [3.0, 3.0]), (10_000.0, [2.0, 2.0])], 0.1)


def faulted_run(rejoin_s: float) -> dict:
    outcome = {"goodput": 0.8, "allocated_s": 200.0, "tokens_merged": 1000, "uptime": 0.9,
               "startup_s": 5.0, "theta_s": 1.0, "max_stall_s": 2.0, "wall_s": 50.0,
               "lost_s": {"in_flight": 1.0}, "unattributed_s": 0.0, "eval_loss": 2.0,
               "merge_marks": [1.0, 2.0],
               "islands": {"a": {"useful_steps": 900}, "b": {"useful_steps": 700}}}
    return {"outcome": outcome, "startup_s": [5.0, 5.0], "rejoin_s": [rejoin_s],
            "series": [{"t": 1.0, "alive": 2}], "rollbacks": 0, "run": 1, "test_loss": 2.5,
            "evaluations": [(1000, [2.4, 2.6])], "faults_fired": 1,
            "faults": [{"at_s": 10.0, "kind": "kill", "island": "a", "duration_s": 8.0,
                        "factor": None}]}


def test_both_modes_are_valued_at_one_clock_and_costs_are_shares_of_allocation():
    assert revalued_goodput({"a": 100, "b": 50}, {"a": 0.1, "b": 0.2}, 40.0) == \
        pytest.approx((10 + 10) / 40)
    costs = system_costs([2.0, 3.0], [4.0], {"in_flight": 1.0, "rollback": 0.0}, 100.0)
    assert costs == pytest.approx({"startup": 0.05, "rejoin": 0.04, "in_flight": 0.01,
                                   "rollback": 0.0})
    figures_of = figures(faulted_run(2.0), 2, {"a": 0.1, "b": 0.1}, REFERENCE)
    assert figures_of["goodput"] == pytest.approx((900 + 700) * 0.1 / 200)
    assert figures_of["goodput_syncd"] == 0.8
    assert figures_of["tokens_per_island_s"] == pytest.approx(1000 / 200)


def test_the_reference_is_the_same_modes_fault_free_seeds_after_start_up():
    def run(tokens: int, startup_s: float, evaluations: list) -> dict:
        return {"evaluations": evaluations,
                "outcome": {"allocated_s": 400.0, "startup_s": startup_s,
                            "tokens_merged": tokens, "islands": {"a": {}, "b": {}}}}

    reference = quality_reference([
        run(1000, 10.0, [(0, [9.0, 9.0]), (100, [3.0, 3.2]), (1000, [2.0, 2.2])]),
        run(1000, 50.0, [(100, [3.2, 3.4]), (1000, [2.2, 2.4])])])

    # Each seed's 400 island-seconds less its 2 islands' start-up, over their tokens.
    assert reference.s_per_token == pytest.approx((380 + 300) / 2000)
    assert reference.curve == [(100, pytest.approx([3.1, 3.3])),
                               (1000, pytest.approx([2.1, 2.3]))]


def test_a_runs_quality_goodput_counts_its_seconds_after_start_up():
    # 200 allocated island-seconds, 2 islands 5 s in start-up: 190 after it, 1900 tokens
    # at the reference's 0.1 a token; the run's loss 2.5 the reference reached at 1000.
    figures_of = figures(faulted_run(2.0), 2, {"a": 0.1, "b": 0.1}, REFERENCE)

    quality = figures_of["quality_adjusted_goodput"]
    assert quality["uncapped"] == pytest.approx(1000 / 1900)
    assert quality["value"] == quality["uncapped"]
    low, high = quality["interval"]
    assert low < quality["uncapped"] < high
    # With the pool's 4 slots: 400 island-seconds, 6 slots in start-up, 370 after it.
    pooled = figures(faulted_run(2.0), 2, {"a": 0.1, "b": 0.1}, REFERENCE, standby=4)
    assert pooled["quality_adjusted_goodput"]["uncapped"] == pytest.approx(1000 / 3700)


def test_it_rejects_an_empty_run():
    with pytest.raises(ValueError, match="fault_free_s"):
        oracle_goodput([], 4, 0.0, **BASE)


def test_a_stall_counts_only_while_a_quorum_is_alive():
    marks = [1.0, 2.0, 10.0, 11.0]
    alive = [(t / 2, 1 if 4 <= t / 2 <= 8 else 3) for t in range(0, 25)]
    # The 2 -> 10 gap had only 1 island alive for a while; 10 -> 11 -> 12 are short.
    assert stall_with_quorum(marks, 12.0, alive, 2) == pytest.approx(1.0)
    assert stall_with_quorum(marks, 12.0, alive, 1) == pytest.approx(8.0)


def test_the_spread_over_seeds():
    assert spread([0.9, 0.8]) == pytest.approx({"mean": 0.85, "min": 0.8, "max": 0.9,
                                                "spread": 0.1})
    assert spread([0.9, None])["mean"] is None


def test_the_report_page_marks_the_faults():
    run = {"series": [{"t": 0.0, "goodput": None, "outer_steps": 0},
                      {"t": 5.0, "goodput": 0.9, "outer_steps": 3}],
           "chaos_offset_s": 1.0, "evaluations": [(200, [2.4, 2.6])],
           "faults": [{"at_s": 2.0, "kind": "kill", "duration_s": 3.0}]}
    fits = {"decoupled": REFERENCE.fit(), "elastic": REFERENCE.fit()}
    page = figure_html({0: {"decoupled": run, "elastic": run}}, "goodput", fits)
    assert page.startswith("<html>") and "seed 0" in page and "kill" in page
    assert "elastic's reference" in page


def test_the_merge_interval_is_one_fragment_every_h_over_p_steps():
    assert merge_interval(30, 2, 0.02) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="step time above 0"):
        merge_interval(30, 2, 0.0)


def made_up_run(mode: str, eval_loss: float, faults: int) -> dict:
    run = faulted_run(1.0)
    run["mode"] = mode
    run["faults"] = run["faults"] * faults
    run["faults_fired"] = faults
    run["step_time_s"] = 0.1
    run["chaos_offset_s"] = 0.0
    run["outcome"] = {**run["outcome"], "eval_loss": eval_loss,
                      "step_time_s": {"a": 0.1, "b": 0.1}, "max_stall_s": 0.1}
    run["series"] = [{"t": 1.0, "alive": 2, "goodput": 0.5, "outer_steps": 1,
                      "eval_tokens": 100, "eval_loss": 3.0}]
    run["test_loss"] = eval_loss + 0.05
    run["evaluations"] = [(100, [3.0, 3.0]), (1000, [eval_loss + 0.05] * 2)]
    run["restart_delays_s"] = [4.0] if mode == "elastic" else []
    return run


def test_the_report_gives_quality_adjusted_goodput_beside_goodput(tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    base = {"decoupled": made_up_run("decoupled", 2.0, 0),
            "elastic": made_up_run("elastic", 2.4, 0)}
    seeds = {3: {"decoupled": made_up_run("decoupled", 2.2, 1),
                 "elastic": made_up_run("elastic", 2.1, 1),
                 "elastic_warm": made_up_run("elastic", 2.1, 1)}}

    report(PROFILES["quick"], True, {3: base}, seeds, 1.0)

    written = json.loads((tmp_path / "goodput-quick.json").read_text())
    assert set(written["quality_reference"]) == {"decoupled", "elastic"}
    assert written["quality_reference"]["elastic"]["seeds"] == [3]
    row = written["per_seed"][0]
    # Each mode against its own fault-free run: elastic's faulted run reached a lower
    # loss than its reference's end (2.15 against 2.45), decoupled's a higher one.
    elastic, decoupled = (row[m]["quality_adjusted_goodput"] for m in ("elastic", "decoupled"))
    assert elastic["above_one"] and elastic["value"] == 1.0 and elastic["uncapped"] > 1
    assert 0 < decoupled["uncapped"] < 1 and not decoupled["above_one"]
    assert written["quality_adjusted_above_one"] == ["elastic, seed 3", "elastic_warm, seed 3"]
    for mode in ("decoupled", "elastic"):  # a fault-free run against itself
        assert written[mode]["fault_free"]["quality_adjusted_goodput"]["uncapped"] == \
            pytest.approx(1.0)
    per_mode = written["decoupled"]["quality_adjusted_goodput"]
    assert per_mode["uncapped"] == pytest.approx(decoupled["uncapped"])
    assert per_mode["interval"] == pytest.approx(decoupled["interval"])
    printed = capsys.readouterr().out
    assert "quality" in printed and "elastic, seed 3" in printed
    assert "decoupled's reference" in (tmp_path / "goodput-quick.html").read_text()
    # The headline against elastic with the same warm pool, cold beside it, and the
    # oracle's gap signed; the pool's 4 slots count in decoupled and warm elastic.
    d, warm, cold = (written[m]["goodput"] for m in ("decoupled", "elastic_warm", "elastic"))
    assert written["decoupled_vs_elastic_warm"] == pytest.approx(d / warm)
    assert written["decoupled_vs_elastic_cold"] == pytest.approx(d / cold)
    assert written["oracle_gap"] == pytest.approx(d - written["oracle_goodput"])
    assert written["standby_slots"] == {"decoupled": 4, "elastic": 0, "elastic_warm": 4}
    assert row["decoupled"]["allocated_s"] == pytest.approx(200 + 4 * 50)
    assert "decoupled_over_elastic" not in written
    assert written["elastic_warm"]["fault_free"] == written["elastic"]["fault_free"]


def made_up_invocation(useful_steps: int) -> tuple[dict, dict]:
    """One seed's fault-free runs and faulted runs, decoupled's islands credited
    `useful_steps` each."""
    base = {"decoupled": made_up_run("decoupled", 2.0, 0),
            "elastic": made_up_run("elastic", 2.4, 0)}
    decoupled = made_up_run("decoupled", 2.2, 1)
    decoupled["outcome"]["islands"] = {"a": {"useful_steps": useful_steps},
                                       "b": {"useful_steps": useful_steps}}
    return {3: base}, {3: {"decoupled": decoupled, "elastic": made_up_run("elastic", 2.1, 1),
                      "elastic_warm": made_up_run("elastic", 2.1, 1)}}


def test_a_decoupled_run_above_its_oracle_fails_a_check(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    # 2 x 1800 steps of 0.1 s over 400 island-seconds: 0.9, above an oracle of about 0.49.
    assert report(PROFILES["quick"], True, *made_up_invocation(1800), 1.0) == 1

    written = json.loads((tmp_path / "goodput-quick.json").read_text())
    assert written["oracle_gap"] > 0.3
    assert not written["checks"]["decoupled goodput - oracle, at most"]["ok"]
    assert written["checks"]["decoupled goodput - oracle, at least"]["ok"]


def test_the_report_refuses_a_goodput_above_one_after_writing_it(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS", tmp_path)

    with pytest.raises(ValueError, match=r"goodput above 1 in .*decoupled\.goodput"):
        report(PROFILES["quick"], True, *made_up_invocation(3000), 1.0)

    written = json.loads((tmp_path / "goodput-quick.json").read_text())
    assert not written["checks"]["fields named goodput above 1"]["ok"]


@pytest.mark.django_db
def test_checkpoints_are_evaluated_on_the_whole_test_split_window_by_window(tmp_path,
                                                                             text_path):
    # syncd's own eval loss is on validation, within its live budget; the benchmark
    # evaluates the completed run's checkpoints itself, after the run, on every window
    # of the test split: the final one, or all of them in order for a fault-free run.
    from dataclasses import replace

    from bench.goodput import REGIONS, checkpoint_losses
    from diloco.config_parse import parse_config
    from diloco.data import load_corpus
    from diloco.evaluation import Evaluator
    from diloco.island import initial_model
    from syncd import checkpoint
    from webapp.runs.models import Checkpoint, Run

    config = {"model": {"n_layer": 1, "n_embd": 16, "n_head": 2, "block_size": 16},
              "data": {"path": text_path}, "eval": {"tokens": 256},
              "islands": [{"name": f"east-{i}", "region": REGIONS[0]} for i in range(2)]}
    run_config = parse_config(config, list(REGIONS))
    params = initial_model(run_config).state_dict()
    run = Run.objects.create(name="done", config=run_config.to_dict(), state=Run.State.COMPLETED)
    for i, scale in enumerate((0.5, 1.0)):  # the later one is the final model
        path = tmp_path / f"outer-{i}.safetensors"
        sha, nbytes = checkpoint.save(path, {k: v * scale for k, v in params.items()}, {},
                                      [i], 100 * (i + 1))
        Checkpoint.objects.create(run=run, versions={"0": i}, outer_step=i, path=str(path),
                                  sha256=sha, bytes=nbytes)
    corpus = load_corpus(text_path, run_config.data.eval_fraction, data_dir())
    whole = replace(run_config, eval=replace(run_config.eval,
                                             tokens=len(corpus.held_out("test"))))
    test = Evaluator(whole, corpus, "test")

    [(tokens, windows)] = checkpoint_losses(run.pk, config)
    every = checkpoint_losses(run.pk, config, every=True)

    assert tokens == 200 and windows == test.window_losses(params)
    assert len(windows) == len(corpus.held_out("test")) // 16 > 256 // 16
    assert sum(windows) / len(windows) == pytest.approx(test(params))
    assert sum(windows) / len(windows) != pytest.approx(
        Evaluator(whole, corpus, "validation")(params))
    assert [t for t, _ in every] == [100, 200] and every[-1] == (tokens, windows)
