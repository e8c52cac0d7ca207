"""Seeded fault schedules."""

from collections import Counter

import pytest

from diloco.chaos import FAULT_KINDS, PRESETS, ChaosPreset, schedule

FOUR = {"east-a": "us-east", "east-b": "us-east", "west-a": "us-west", "west-b": "us-west"}


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another():
    preset = PRESETS["aggressive"]
    assert schedule(preset, FOUR, 600, seed=1) == schedule(preset, FOUR, 600, seed=1)
    assert schedule(preset, FOUR, 600, seed=1) != schedule(preset, FOUR, 600, seed=2)


def test_aggressive_on_four_islands_breaks_something_about_every_30_seconds():
    counts = [len(schedule(PRESETS["aggressive"], FOUR, 3000, seed)) for seed in range(5)]
    per_30_s = sum(counts) / len(counts) / (3000 / 30)
    # A little under 1: an island that is down is not hit again until it is back.
    assert 0.7 <= per_30_s <= 1.1, counts


def test_every_kind_of_the_mix_happens_and_only_those():
    faults = schedule(PRESETS["aggressive"], FOUR, 20000, seed=0)
    kinds = Counter(f.kind for f in faults)
    assert set(kinds) == set(FAULT_KINDS)
    assert kinds.most_common(1)[0][0] == "kill"  # half of the mix
    assert set(f.kind for f in schedule(PRESETS["kills_only"], FOUR, 2000, 0)) == {"kill"}


def test_an_island_that_is_down_is_not_hit_again_until_it_is_back():
    faults = schedule(ChaosPreset(mtbf_s=5.0, outage_s=10.0), FOUR, 500, seed=3)
    busy: dict[str, float] = {}
    for f in faults:
        for island in f.islands:
            assert f.at_s >= busy.get(island, 0.0)
            busy[island] = f.ends_s


def test_a_region_outage_takes_every_island_of_that_region_that_is_up():
    faults = schedule(ChaosPreset(mtbf_s=100.0, mix={"region_outage": 1.0}), FOUR, 400, seed=0)
    assert faults
    for f in faults:
        assert len({FOUR[i] for i in f.islands}) == 1
        assert f.rejoin


def test_outages_last_about_the_mean_and_kills_are_rejoined_after_them():
    faults = schedule(PRESETS["aggressive"], FOUR, 5000, seed=0)
    assert all(5.0 <= f.duration_s <= 15.0 for f in faults)
    assert all(f.rejoin == (f.kind in ("kill", "region_outage")) for f in faults)
    assert all(f.factor == 4.0 for f in faults if f.kind == "straggle")


@pytest.mark.parametrize("bad, message", [
    ({"mtbf_s": 0}, "mtbf_s must be positive"),
    ({"mtbf_s": 10, "mix": {"meteor": 1.0}}, "unknown fault kinds"),
    ({"mtbf_s": 10, "mix": {"kill": 0.0}}, "positive weight"),
    ({"mtbf_s": 10, "outage_s": -1}, "outage_s must be positive"),
])
def test_a_bad_preset_is_refused_with_a_clear_message(bad, message):
    with pytest.raises(ValueError, match=message):
        ChaosPreset(**bad)


def test_a_schedule_needs_islands_and_a_duration():
    with pytest.raises(ValueError, match="at least one island"):
        schedule(PRESETS["aggressive"], {}, 100, 0)
    with pytest.raises(ValueError, match="duration_s must be positive"):
        schedule(PRESETS["aggressive"], FOUR, 0, 0)
