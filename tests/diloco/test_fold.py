import random

import pytest
import torch

from diloco import codecs
from diloco.fold import RoundSum
from diloco.merge import Update, merge_updates

NAMES = ("emb", "w", "b")


def updates(islands: int, seed: int = 0) -> list[Update]:
    """One update per island: different tokens, steps and deltas."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(islands):
        steps = 4 + i % 3
        tokens = steps * 256 * (1 + i % 2)
        delta = {"emb": torch.randn(6, 4, generator=gen), "w": torch.randn(5, 3, generator=gen),
                 "b": torch.randn(3, generator=gen) * (i + 1)}
        out.append(Update(f"island-{i}", 0, tokens, steps, delta, seq=steps))
    return out


def folded(arrivals: list[Update], weighting: str, rda: bool):
    round_sum = RoundSum(weighting, rda, embedding_names=("emb",))
    for u in arrivals:
        round_sum.add(u)
    return round_sum.merged()


def assert_merges_equal(got, want):
    merged, weights = got
    expected, expected_weights = want
    assert weights == pytest.approx(expected_weights)
    assert list(weights) == list(expected_weights)
    for name in NAMES:
        torch.testing.assert_close(merged[name], expected[name])


@pytest.mark.parametrize("weighting", ["tokens", "uniform"])
@pytest.mark.parametrize("rda", [False, True])
def test_folding_updates_in_any_order_merges_as_merge_updates_does(weighting, rda):
    round_ = updates(7)
    want = merge_updates(round_, weighting, rda, embedding_names=("emb",))

    for seed in range(3):
        arrivals = list(round_)
        random.Random(seed).shuffle(arrivals)
        assert_merges_equal(folded(arrivals, weighting, rda), want)


def increments(update: Update, parts: int) -> list[Update]:
    """An island's update cut into `parts` increments that add up to it."""
    steps = update.inner_steps // parts
    per_step = update.tokens // update.inner_steps
    out = []
    for k in range(parts):
        last = k == parts - 1
        n = update.inner_steps - steps * (parts - 1) if last else steps
        share = n / update.inner_steps
        out.append(Update(update.island, update.base_version, n * per_step, n,
                          {name: t * share for name, t in update.delta.items()},
                          seq=update.seq * 10 + k))
    return out


def test_repeats_of_plain_uniform_weighting_merge_exactly_as_merge_updates():
    # w = 1: an island's increments add up linearly, so folding them one by one is the
    # same as summing them first.
    round_ = updates(5, seed=1)
    arrivals = [*increments(round_[0], 3), *round_[1:3], *increments(round_[3], 2), round_[4]]
    random.Random(4).shuffle(arrivals)

    assert_merges_equal(folded(arrivals, "uniform", rda=False),
                        merge_updates(round_, "uniform"))


@pytest.mark.parametrize("rda", [False, True])
def test_a_repeating_island_is_weighed_by_its_first_increment(rda):
    # Under token weighting and RDA, an island's weight and norms come from its first
    # increment in the round, and its later increments add to its vector at that
    # weight: as if the first increment had carried the summed vector.
    round_ = updates(4, seed=2)
    first, second = increments(round_[1], 2)
    summed = Update(first.island, 0, first.tokens, first.inner_steps,
                    {n: first.delta[n] + second.delta[n] for n in NAMES}, first.seq)
    want = merge_updates([round_[0], summed, *round_[2:]], "tokens", rda,
                         embedding_names=("emb",))
    round_sum = RoundSum("tokens", rda, embedding_names=("emb",))
    for u in (round_[0], first, round_[2], second, round_[3]):
        round_sum.add(u)

    merged, weights = round_sum.merged()

    assert weights == pytest.approx(want[1])
    for name in NAMES:
        if rda and name != "emb":
            # The radius is the first increment's norm, the direction the summed one's.
            norms = {u.island: float(u.delta[name].norm()) for u in round_}
            norms[first.island] = float(first.delta[name].norm())
            radius = sum(weights[i] * norms[i] for i in weights)
            assert float(merged[name].norm()) == pytest.approx(radius, rel=1e-5)
        else:
            torch.testing.assert_close(merged[name], want[0][name])
    c = round_sum.contributions[first.island]
    assert (c.tokens, c.inner_steps, c.seq, c.increments) == \
        (round_[1].tokens, round_[1].inner_steps, second.seq, 2)


def test_a_round_sum_holds_one_tensor_per_name_whatever_the_number_of_islands():
    small, large = RoundSum("tokens", rda=True), RoundSum("tokens", rda=True)
    for u in updates(2):
        small.add(u)
    for u in updates(16):
        large.add(u)

    assert sum(t.numel() for t in large.sums.values()) == \
        sum(t.numel() for t in small.sums.values()) == 6 * 4 + 5 * 3 + 3


def test_folding_leaves_the_update_tensors_alone():
    u = updates(1)[0]
    before = {n: t.clone() for n, t in u.delta.items()}
    round_sum = RoundSum("tokens", rda=True)
    round_sum.add(u)
    round_sum.merged()

    for name in NAMES:
        assert torch.equal(u.delta[name], before[name])


@pytest.mark.parametrize("weighting", ["tokens", "uniform"])
def test_a_fold_takes_the_norms_the_updates_checks_measured(weighting):
    plain, measured = updates(3), updates(3)
    measured = [Update(u.island, u.base_version, u.tokens, u.inner_steps, u.delta, u.seq,
                       {n: float(t.norm()) for n, t in u.delta.items()}) for u in measured]
    assert_merges_equal(folded(measured, weighting, rda=True),
                        folded(plain, weighting, rda=True))

    told = Update("a", 0, 8, 1, {"w": torch.ones(4)}, norms={"w": 3.0})  # |w| is 2
    round_sum = RoundSum("uniform", rda=True)
    round_sum.add(told)
    assert round_sum.radii == {"w": 3.0}


def test_it_refuses_an_update_of_other_tensors_and_an_empty_round():
    round_sum = RoundSum("uniform")
    round_sum.add(Update("a", 0, 8, 1, {"w": torch.ones(2)}))

    with pytest.raises(ValueError, match=r"expected \['w'\]"):
        round_sum.add(Update("b", 0, 8, 1, {"v": torch.ones(2)}))
    with pytest.raises(ValueError, match="at least one update"):
        RoundSum("uniform").merged()
    with pytest.raises(ValueError, match="weighting must be one of"):
        RoundSum("loudest")


def test_a_round_whose_weights_are_all_zero_cannot_merge():
    round_sum = RoundSum("tokens")
    round_sum.add(Update("a", 0, 0, 0, {"w": torch.ones(2)}))

    with pytest.raises(ValueError, match="all zero"):
        round_sum.merged()


@pytest.mark.parametrize("codec", ["none", "bf16", "int4"])
@pytest.mark.parametrize("rda", [False, True])
def test_updates_folded_as_they_came_over_the_wire_merge_as_their_decoded_tensors(codec, rda):
    shapes = {"emb": (6, 4), "w": (5, 3), "b": (3,)}
    decoded, opened = [], []
    for u in updates(4):
        opened_delta = codecs.open_payload(codecs.encode(u.delta, codec), codec, shapes)
        delta = {name: t.decode() for name, t in opened_delta.items()}
        decoded.append(Update(u.island, 0, u.tokens, u.inner_steps, delta, seq=u.seq))
        opened.append(Update(u.island, 0, u.tokens, u.inner_steps, opened_delta, seq=u.seq))

    assert_merges_equal(folded(opened, "tokens", rda), folded(decoded, "tokens", rda))
