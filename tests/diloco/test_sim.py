"""The datacenter simulator on cases small enough to check by hand."""

import math

import pytest

from diloco import merge, policy, sim
from diloco.sim import SimConfig, simulate

# Four one-chip slices in one job, 1 s steps, no random interruptions.
SMALL = {"chips": 4, "slice_chips": 1, "step_time_s": 1.0, "mtbi_s": math.inf,
         "duration_s": 100.0}
# Two islands of one slice each on a link that takes no time.
PAIR = {"mode": "decoupled", "chips": 2, "islands": 2, "mtbi_s": math.inf,
        "inner_steps": 4, "fragments": 1, "overlap_steps": 1, "bandwidth_gbps": 1e12,
        "latency_s": 0.0, "duration_s": 10.0}


def test_it_wastes_nothing_without_interruptions():
    result = simulate(SimConfig(mode="elastic", islands=1, **SMALL))
    assert result.goodput == pytest.approx(1.0)
    assert result.uptime == 1.0 and result.failures == 0


def test_a_dp_failure_loses_the_steps_since_the_checkpoint_and_the_restart():
    config = SimConfig(mode="dp", islands=1, restart_s=60.0, checkpoint_steps=10, **SMALL)
    result = simulate(config, failures=((25.5, 0),))
    # Steps 1-20 are checkpointed; 21-25 and half a step are lost; the restart ends at
    # 85.5 and steps 21-34 follow, of which 21-30 reach the checkpoint at step 30.
    assert result.goodput == pytest.approx(30 / 100)
    assert result.lost_s["rollback"] == pytest.approx(5.0)
    assert result.lost_s["restart_pause"] == pytest.approx(60.0)
    assert result.failures == 1


def test_an_elastic_failure_pauses_twice_and_trains_on_without_the_slice():
    config = SimConfig(mode="elastic", islands=1, downscale_s=5.0, upscale_s=5.0,
                       return_s=20.0, **SMALL)
    result = simulate(config, failures=((10.5, 0),))
    # 10 steps on 4 slices, pause to 15.5, 15 steps on 3 slices until the slice returns
    # at 30.5, pause to 35.5, 64 steps on 4 slices: 341 slice-steps of 400.
    assert result.goodput == pytest.approx(341 / 400)
    assert result.lost_s["restart_pause"] == pytest.approx(10.0)


def test_decoupled_islands_merge_what_they_send():
    result = simulate(SimConfig(**PAIR))
    # Each island sends at steps 4 and 8; steps 9 and 10 are not merged by the end.
    assert result.goodput == pytest.approx(0.8)
    assert result.merges == 4  # K = 1 without grace: every arrival merges on its own
    assert result.stale_drops == 0


def test_a_decoupled_failure_only_stops_its_own_island():
    quiet = simulate(SimConfig(**PAIR))
    hit = simulate(SimConfig(**{**PAIR, "downscale_s": 3.0, "return_s": 100.0}),
                   failures=((2.5, 0),))
    # Island 0 loses its only slice after 2 steps, which it still sends at step 4;
    # island 1 merges its 8 steps as if nothing happened.
    assert quiet.goodput == pytest.approx(16 / 20)
    assert hit.goodput == pytest.approx((2 + 8) / 20)
    assert hit.uptime == 1.0


def test_it_decides_merges_with_the_live_policy(monkeypatch):
    assert sim.policy is policy and sim.merge is merge
    calls = []

    def never(arrivals, now, **kwargs):
        calls.append(len(arrivals))
        return policy.Decision(False, "held by the test")

    monkeypatch.setattr(policy, "decide", never)
    result = simulate(SimConfig(**PAIR))
    assert calls and result.merges == 0 and result.goodput == 0.0 and result.uptime == 0.0


def test_it_drops_what_the_live_staleness_rule_calls_stale(monkeypatch):
    monkeypatch.setattr(policy, "is_stale", lambda base, newest, bound: True)
    result = simulate(SimConfig(**PAIR))
    assert result.goodput == 0.0 and result.merges == 0 and result.stale_drops == 4


def test_it_weights_merges_with_the_live_weights(monkeypatch):
    seen = []
    real = merge.merge_weights

    def spy(updates, weighting):
        seen.append(weighting)
        return real(updates, weighting)

    monkeypatch.setattr(merge, "merge_weights", spy)
    simulate(SimConfig(**{**PAIR, "weighting": "uniform"}))
    assert seen and set(seen) == {"uniform"}


def test_a_scripted_failure_must_name_an_island():
    with pytest.raises(ValueError, match="names island 3"):
        simulate(SimConfig(**PAIR), failures=((1.0, 3),))
