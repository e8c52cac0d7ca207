import math

import pytest
import torch

from diloco.config import OptimConfig, SyncConfig
from diloco.fragments import partition
from diloco.merge import Update
from diloco.policy import RoundStats
from diloco.synchronizer import Synchronizer, apply_published, history_length

PARAMS = {"tok_emb.weight": torch.randn(16, 4, generator=torch.Generator().manual_seed(0)),
          "blocks.0.mlp.c_fc.weight": torch.randn(8, 4, generator=torch.Generator().manual_seed(1)),
          "ln_f.weight": torch.ones(4)}
ROUND_TOKENS = 4096
STATS = RoundStats(step_time_s=1.0, sync_time_s=0.5)


def synchronizer(fragments: int = 1, **sync) -> Synchronizer:
    # Merging at quorum and grace (merge_each_period false) unless a test says otherwise.
    settings = {"min_quorum": 2, "overlap_steps": 5, "grace_gamma": 1.0,
                "weighting": "tokens", "max_staleness": 4, "merge_each_period": False, **sync}
    parts = partition({n: t.numel() for n, t in PARAMS.items()}, fragments)
    return Synchronizer(PARAMS, parts, SyncConfig(**settings),
                        OptimConfig(outer_lr=0.5, outer_momentum=0.0), ROUND_TOKENS)


def update_for(sync: Synchronizer, island: str, p: int = 0, *, base: int = 0,
               tokens: int = 1024, steps: int = 4, value: float = 0.1, seq: int = 1) -> Update:
    delta = {n: torch.full(shape, value) for n, shape in sync.shapes[p].items()}
    return Update(island, base, tokens, steps, delta, seq)


def test_a_merge_applies_the_outer_step_to_the_weighted_mean_update():
    sync = synchronizer()
    before = {n: t.clone() for n, t in sync.globals[0].items()}
    sync.submit(update_for(sync, "a", tokens=3072, steps=4, value=1.0), 0, now=0.0)
    sync.submit(update_for(sync, "b", tokens=1024, steps=4, value=-1.0), 0, now=0.0)

    result = sync.merge(0, now=1.0)

    # weights 3072**2 : 1024**2 = 0.9 : 0.1; share = 4096 / ROUND_TOKENS = 1
    assert result.weights == pytest.approx({"a": 0.9, "b": 0.1})
    assert result.tokens == 4096
    assert result.inner_steps == {"a": 4, "b": 4}
    for n, t in sync.globals[0].items():
        assert torch.allclose(t, before[n] - 0.5 * 0.8)


def test_each_merge_raises_the_fragment_version_by_one():
    sync = synchronizer()

    for version in (1, 2, 3):
        sync.submit(update_for(sync, "a", base=version - 1), 0, now=float(version))
        result = sync.merge(0, now=float(version))
        assert result.version == version
        assert sync.versions() == [version]


def test_outer_steps_is_the_smallest_fragment_version():
    sync = synchronizer(fragments=3)

    for p in (0, 0, 1):
        sync.submit(update_for(sync, "a", p, base=sync.version(p)), p, now=0.0)
        sync.merge(p, now=0.0)

    assert sync.versions() == [2, 1, 0]
    assert sync.outer_steps == 0
    sync.submit(update_for(sync, "a", 2), 2, now=0.0)
    sync.merge(2, now=0.0)
    assert sync.outer_steps == 1


def test_merging_an_empty_round_publishes_nothing():
    sync = synchronizer()

    assert sync.merge(0, now=0.0) is None
    assert sync.versions() == [0]
    assert sync.published_since(0, 0) == []


def test_two_increments_from_one_island_in_one_round_are_added_up():
    sync = synchronizer()
    sync.submit(update_for(sync, "a", tokens=1024, steps=4, value=0.1, seq=4), 0, now=1.0)

    sync.submit(update_for(sync, "a", tokens=512, steps=2, value=0.3, seq=6), 0, now=2.0)

    [(island, pending)] = sync.open_round(0).items()
    assert island == "a"
    c = pending.contribution
    assert (c.tokens, c.inner_steps, c.seq, c.increments) == (1536, 6, 6, 2)
    assert pending.arrival_time == 1.0  # the round still counts from the first arrival
    # The island's only contribution: its summed increments (0.1 + 0.3), not their mean.
    merged, _ = sync.sums[0].merged()
    assert all(torch.allclose(t, torch.full_like(t, 0.4)) for t in merged.values())


def test_it_rejects_an_update_older_than_the_staleness_bound_and_never_merges_it():
    sync = synchronizer(max_staleness=1)
    for version in (1, 2):
        sync.submit(update_for(sync, "a", base=version - 1), 0, now=0.0)
        sync.merge(0, now=0.0)

    reason = sync.submit(update_for(sync, "old", base=0, seq=9), 0, now=1.0)

    assert reason == "stale: based on version 0, newest is 2, max_staleness 1"
    assert "old" not in sync.open_round(0)
    assert sync.has_handled(0, "old", 9)
    assert sync.submit(update_for(sync, "fresh", base=1), 0, now=1.0) is None
    assert sync.merge(0, now=2.0).weights == {"fresh": 1.0}


def test_it_merges_a_straggler_that_arrives_inside_the_grace_window():
    # K = 2 of 4 alive islands; quorum at t = 1, grace 5 * 1 - 1 - 0.5 = 3.5: until 4.5.
    sync = synchronizer()
    sync.submit(update_for(sync, "a"), 0, now=0.0)
    sync.submit(update_for(sync, "b"), 0, now=1.0)
    assert not sync.decide(0, 1.0, alive_islands=4, stats=STATS).merge

    sync.submit(update_for(sync, "straggler"), 0, now=3.0)
    waiting = sync.decide(0, 3.0, alive_islands=4, stats=STATS)
    closed = sync.decide(0, waiting.deadline, alive_islands=4, stats=STATS)
    result = sync.merge(0, now=waiting.deadline)

    assert not waiting.merge
    assert waiting.deadline == pytest.approx(4.5)
    assert closed.merge
    assert set(result.weights) == {"a", "b", "straggler"}
    assert result.weights["straggler"] == pytest.approx(1 / 3)


def test_an_island_after_the_merge_goes_into_the_next_merge():
    sync = synchronizer()
    sync.submit(update_for(sync, "a"), 0, now=0.0)
    sync.submit(update_for(sync, "b"), 0, now=1.0)
    first = sync.merge(0, now=4.5)

    assert sync.submit(update_for(sync, "late", base=0), 0, now=5.0) is None
    sync.submit(update_for(sync, "a", base=1), 0, now=6.0)
    second = sync.merge(0, now=10.0)

    assert "late" not in first.weights
    assert set(second.weights) == {"late", "a"}
    # the late island's anchor is one version behind the merge it entered
    assert (first.ages, second.ages) == ({"a": 0, "b": 0}, {"late": 1, "a": 0})


def test_an_islands_age_counts_from_the_oldest_anchor_of_its_increments():
    sync = synchronizer(min_quorum=1)
    for version in range(3):
        sync.submit(update_for(sync, "fast", base=version), 0, now=float(version))
        sync.merge(0, now=float(version))
    sync.submit(update_for(sync, "slow", base=0, seq=1), 0, now=3.0)
    sync.submit(update_for(sync, "slow", base=2, seq=2), 0, now=3.5)

    assert sync.merge(0, now=4.0).ages == {"slow": 3}


def test_an_island_after_the_merge_is_dropped_when_that_makes_it_too_stale():
    sync = synchronizer(max_staleness=0)
    sync.submit(update_for(sync, "a"), 0, now=0.0)
    sync.submit(update_for(sync, "b"), 0, now=1.0)
    sync.merge(0, now=4.5)

    reason = sync.submit(update_for(sync, "late", base=0), 0, now=5.0)

    assert reason is not None and reason.startswith("stale")
    assert sync.open_round(0) == {}


def test_decide_uses_the_runs_quorum_and_grace_settings():
    sync = synchronizer(min_quorum=2, grace_gamma=math.inf)
    sync.submit(update_for(sync, "a"), 0, now=0.0)

    assert sync.decide(0, 100.0, alive_islands=3, stats=STATS).reason == \
        "waiting for 1 more island (1/2)"
    sync.submit(update_for(sync, "b"), 0, now=1.0)
    assert not sync.decide(0, 1e9, alive_islands=3, stats=STATS).merge
    sync.submit(update_for(sync, "c"), 0, now=2.0)
    assert sync.decide(0, 2.0, alive_islands=3, stats=STATS).merge


def test_it_remembers_which_updates_a_merge_took_in():
    sync = synchronizer()
    sync.submit(update_for(sync, "a", seq=8), 0, now=0.0)

    assert not sync.has_handled(0, "a", 8)
    sync.merge(0, now=1.0)
    assert sync.has_handled(0, "a", 8)
    assert not sync.has_handled(0, "a", 9)
    assert not sync.has_handled(0, "b", 0)


def merge_rounds(sync: Synchronizer, count: int) -> None:
    for i in range(count):
        value = 0.01 * (i + 1) * (-1) ** i
        sync.submit(update_for(sync, "a", base=sync.version(0), value=value), 0, now=float(i))
        sync.merge(0, now=float(i))


def test_with_codec_none_an_island_pulls_the_whole_newest_fragment():
    sync = synchronizer()
    merge_rounds(sync, 3)

    [published] = sync.published_since(0, 1)

    assert (published.version, published.codec) == (3, "none")
    assert all(torch.equal(published.payload[n], t) for n, t in sync.globals[0].items())
    assert sync.published_since(0, 3) == []


def test_with_int4_an_island_rebuilds_the_global_exactly_from_the_chain_of_differences():
    sync = synchronizer(downlink_compression="int4")
    held = {n: t.clone() for n, t in sync.globals[0].items()}
    merge_rounds(sync, 3)

    pulled = sync.published_since(0, 0)

    assert [(p.version, p.codec) for p in pulled] == [(1, "int4"), (2, "int4"), (3, "int4")]
    rebuilt = apply_published(held, pulled, sync.shapes[0])
    assert all(torch.equal(rebuilt[n], t) for n, t in sync.globals[0].items())
    assert not torch.equal(rebuilt["tok_emb.weight"], held["tok_emb.weight"])


def test_an_island_one_version_behind_pulls_only_the_last_difference():
    sync = synchronizer(downlink_compression="int8")
    merge_rounds(sync, 2)
    at_1 = apply_published({n: PARAMS[n].clone() for n in sync.shapes[0]},
                           sync.published_since(0, 0)[:1], sync.shapes[0])

    pulled = sync.published_since(0, 1)

    assert [p.version for p in pulled] == [2]
    rebuilt = apply_published(at_1, pulled, sync.shapes[0])
    assert all(torch.equal(rebuilt[n], t) for n, t in sync.globals[0].items())


def test_an_island_further_behind_than_the_history_pulls_the_whole_fragment():
    sync = synchronizer(downlink_compression="int4")
    kept = history_length(sync.sync)
    merge_rounds(sync, kept + 2)

    [published] = sync.published_since(0, 0)

    assert (published.version, published.codec) == (kept + 2, "none")
    rebuilt = apply_published({n: torch.zeros(s) for n, s in sync.shapes[0].items()},
                              [published], sync.shapes[0])
    assert all(torch.equal(rebuilt[n], t) for n, t in sync.globals[0].items())


def test_global_params_hold_every_fragment():
    sync = synchronizer(fragments=3)

    params = sync.global_params()

    assert params.keys() == PARAMS.keys()
    assert all(torch.equal(params[n], PARAMS[n]) for n in PARAMS)


def test_with_a_full_downlink_no_published_version_is_kept_but_the_newest():
    sync = synchronizer()
    merge_rounds(sync, 6)

    assert len(sync.history[0]) == 0
    [published] = sync.published_since(0, 2)
    assert published.version == 6 and published.payload is sync.globals[0]


def test_a_lossy_downlink_keeps_as_many_differences_as_max_staleness():
    sync = synchronizer(downlink_compression="int8", max_staleness=3)
    merge_rounds(sync, 7)

    assert [p.version for p in sync.history[0]] == [5, 6, 7]
    assert [p.version for p in sync.published_since(0, 4)] == [5, 6, 7]
    assert [p.codec for p in sync.published_since(0, 3)] == ["none"]


def test_a_round_carrying_many_rounds_of_tokens_steps_no_farther_than_a_whole_round():
    sync = Synchronizer({"w": torch.zeros(4)}, partition({"w": 4}, 1),
                        SyncConfig(min_quorum=1, max_staleness=4),
                        OptimConfig(outer_lr=0.5, outer_momentum=0.0), round_tokens=1024)
    # An island that kept sending while syncd was away: 50 rounds' worth in one merge.
    sync.submit(Update("a", 0, 50 * 1024, 200, {"w": torch.ones(4)}, 200), 0, now=0.0)

    sync.merge(0, now=1.0)

    assert torch.allclose(sync.globals[0]["w"], torch.full((4,), -0.5))


def test_a_cosine_staleness_weighting_takes_less_of_an_older_update_and_steps_less():
    plain, gated = synchronizer(min_quorum=1), synchronizer(
        min_quorum=1, staleness_weighting="cosine")
    for sync in (plain, gated):
        sync.submit(update_for(sync, "a", base=0, tokens=ROUND_TOKENS // 2), 0, now=0.0)
        sync.merge(0, now=0.0)
        sync.submit(update_for(sync, "fresh", base=1, value=1.0, tokens=ROUND_TOKENS // 2),
                    0, now=1.0)
        sync.submit(update_for(sync, "old", base=0, value=-1.0, tokens=ROUND_TOKENS // 2),
                    0, now=1.0)
    before = {n: t.clone() for n, t in gated.globals[0].items()}

    assert plain.merge(0, now=2.0).weights == pytest.approx({"fresh": 0.5, "old": 0.5})
    result = gated.merge(0, now=2.0)

    gate = 0.5 * (1 + math.cos(math.pi / 5))  # age 1 of max_staleness 4
    assert result.weights == pytest.approx({"fresh": 1 / (1 + gate), "old": gate / (1 + gate)})
    share = (1 + gate) / 2
    step = 0.5 * share * (1 - gate) / (1 + gate)
    for n, t in gated.globals[0].items():
        assert torch.allclose(t, before[n] - step, atol=1e-6)


def each_period_after(last_round: dict[str, float]) -> Synchronizer:
    """merge_each_period, K = 2, H = 10: a merged round of these islands at these times."""
    sync = synchronizer(min_quorum=2, grace_gamma=0.0, merge_each_period=True, inner_steps=10)
    for island, at in last_round.items():
        sync.submit(update_for(sync, island), 0, now=at)
    sync.merge(0, now=max(last_round.values()))
    return sync


def test_merging_each_period_waits_past_the_quorum_for_the_islands_expected_in_the_period():
    sync = each_period_after({"a": 0.0, "b": 0.5, "c": 1.0, "d": 2.0})
    stats = RoundStats(step_time_s=1.0, sync_time_s=0.5, island_step_s={"d": 1.1})
    sync.submit(update_for(sync, "a", base=1, seq=2), 0, now=10.0)
    sync.submit(update_for(sync, "b", base=1, seq=2), 0, now=10.5)

    # c is due 10 steps of 1 s after its last update, d (the slowest, which closed the
    # last merge) 10 of its 1.1 s: 13 s, past the last merge plus a median period
    # (12 s); each is waited for up to a quarter of a period (2.5 s) past that
    waiting = sync.decide(0, now=11.0, alive_islands=4, stats=stats)
    assert not waiting.merge and waiting.deadline == pytest.approx(15.5)
    sync.submit(update_for(sync, "c", base=1, seq=2), 0, now=11.2)
    assert not sync.decide(0, now=12.5, alive_islands=4, stats=stats).merge
    sync.submit(update_for(sync, "d", base=1, seq=2), 0, now=13.1)
    assert sync.decide(0, now=13.1, alive_islands=4, stats=stats).merge  # every alive one in


def test_merging_each_period_waits_for_no_straggler_nor_an_island_gone_quiet():
    sync = each_period_after({"a": 0.0, "b": 0.5, "slow": 1.0, "gone": 2.0})
    stats = RoundStats(step_time_s=1.0, sync_time_s=0.5, island_step_s={"slow": 20.0})
    sync.submit(update_for(sync, "a", base=1, seq=2), 0, now=10.0)
    sync.submit(update_for(sync, "b", base=1, seq=2), 0, now=10.5)

    # slow is due at 201 s, beyond the reach of the period (10 + 1.5 x 10 s); gone was
    # due at 12 s and, 2.5 s on, has not come
    assert sync.decide(0, now=14.5, alive_islands=4, stats=stats).merge
    plain = synchronizer(min_quorum=2, grace_gamma=0.0, inner_steps=10)
    plain.submit(update_for(plain, "a"), 0, now=2.0)
    plain.submit(update_for(plain, "b"), 0, now=3.0)
    assert plain.decide(0, now=4.0, alive_islands=4, stats=STATS).merge


def test_a_round_of_waiting_islands_waits_for_those_training_or_sending_its_fragment_next():
    sync = synchronizer(fragments=3, min_quorum=2, inner_steps=15, grace_gamma=0.0)
    # Fragment p is due at steps 5 (p = 0), 10 and 15 (p = 2), modulo 15.
    sync.submit(update_for(sync, "c", 2, seq=15), 2, now=1.0)  # held, its next: fragment 0
    sync.submit(update_for(sync, "e", 1, seq=10), 1, now=1.0)  # held, its next: fragment 2
    sync.submit(update_for(sync, "a", 0, seq=5), 0, now=2.0)
    sync.submit(update_for(sync, "b", 0, seq=5), 0, now=3.0)

    # c is on its way here, up to H = 15 steps of 1 s from the round's first arrival; e
    # waits for fragment 1's merge, which may wait for a and b: not waited for; d, which
    # has no update in a round, trains on its way: waited for
    held = sync.decide(0, now=3.0, alive_islands=5, stats=STATS, waiting=frozenset("abce"))
    assert not held.merge and held.deadline == pytest.approx(17.0)
    assert sync.decide(0, now=3.0, alive_islands=5, stats=STATS, waiting=frozenset("abe")).merge
    assert not sync.decide(0, now=3.0, alive_islands=5, stats=STATS,
                           waiting=frozenset("abde")).merge
    sync.submit(update_for(sync, "c", 0, seq=20), 0, now=4.0)
    assert sync.decide(0, now=4.0, alive_islands=5, stats=STATS,
                       waiting=frozenset("abce")).reason == \
        "every island sending fragment 0 next arrived"
