import math

import pytest

from diloco.policy import Arrival, RoundStats, decide, grace_window, is_stale

STATS = RoundStats(step_time_s=1.0, sync_time_s=0.5)


def arrivals(*times: float) -> list[Arrival]:
    return [Arrival(f"island-{i}", t, base_version=0) for i, t in enumerate(times)]


def decide_at(now: float, times: tuple[float, ...], *, min_quorum: int = 2, alive: int = 4,
              gamma: float = 1.0, tau: int = 5):
    return decide(arrivals(*times), now, min_quorum=min_quorum, alive_islands=alive,
                  gamma=gamma, overlap_steps=tau, stats=STATS)


def test_the_grace_window_is_gamma_times_the_time_left_of_the_overlap():
    # tau * t_step - t_quorum - t_sync = 5 * 1.0 - 1.0 - 0.5
    assert grace_window(1.0, 5, 1.0, 1.0, 0.5) == pytest.approx(3.5)
    assert grace_window(2.0, 5, 1.0, 1.0, 0.5) == pytest.approx(7.0)


def test_the_grace_window_is_never_negative():
    assert grace_window(1.0, 1, 1.0, 3.0, 0.5) == 0.0
    assert grace_window(1.0, 0, 1.0, 0.0, 0.0) == 0.0


def test_gamma_0_closes_the_window_and_infinity_keeps_it_open():
    assert grace_window(0.0, 5, 1.0, 1.0, 0.5) == 0.0
    assert grace_window(math.inf, 5, 1.0, 1.0, 0.5) == math.inf


def test_it_rejects_a_negative_gamma():
    with pytest.raises(ValueError, match="gamma must be at least 0, got -1"):
        grace_window(-1.0, 5, 1.0, 1.0, 0.5)


def test_it_waits_below_the_quorum_and_says_how_many_more():
    decision = decide_at(10.0, (0.0,), min_quorum=3)

    assert not decision.merge
    assert decision.reason == "waiting for 2 more islands (1/3)"
    assert decision.deadline is None


def test_it_says_island_in_the_singular_when_one_more_is_missing():
    decision = decide_at(10.0, (0.0, 1.0), min_quorum=3)

    assert not decision.merge
    assert decision.reason == "waiting for 1 more island (2/3)"


def test_with_no_arrivals_it_waits_for_the_whole_quorum():
    assert decide_at(0.0, (), min_quorum=2).reason == "waiting for 2 more islands (0/2)"


def test_it_merges_at_once_when_every_alive_island_is_in():
    decision = decide_at(2.0, (0.0, 1.0, 2.0), min_quorum=2, alive=3, gamma=math.inf)

    assert decision.merge
    assert decision.reason == "all 3 alive islands arrived"


def test_after_quorum_it_waits_until_the_grace_window_closes():
    # Quorum at t = 1 (first arrival at 0), grace 5 - 1 - 0.5 = 3.5: deadline 4.5.
    times = (0.0, 1.0)

    waiting = decide_at(1.0, times)
    closing = decide_at(4.4, times)
    closed = decide_at(4.5, times)

    assert not waiting.merge and not closing.merge
    assert waiting.deadline == closing.deadline == pytest.approx(4.5)
    assert waiting.grace_s == pytest.approx(3.5)
    assert waiting.reason == "quorum reached; grace 3.5 s left"
    assert closed.merge
    assert closed.reason == "quorum of 2 reached and the grace window closed"
    assert closed.grace_s == pytest.approx(3.5)


def test_the_grace_window_is_sized_from_the_kth_arrival():
    # Three in with K = 2: quorum is reached at the second arrival, t = 2.
    decision = decide_at(2.0, (3.0, 0.0, 2.0), min_quorum=2, alive=4)

    assert decision.deadline == pytest.approx(2.0 + (5 - 2.0 - 0.5))


def test_a_slow_quorum_leaves_no_grace():
    decision = decide_at(6.0, (0.0, 6.0), tau=5)

    assert decision.merge
    assert decision.grace_s == 0.0


def test_without_overlap_there_is_no_grace_to_give():
    decision = decide_at(1.0, (0.0, 1.0), tau=0, gamma=10.0)

    assert decision.merge
    assert decision.grace_s == 0.0


def test_with_endless_grace_it_waits_for_every_alive_island():
    decision = decide_at(1e9, (0.0, 1.0, 2.0), min_quorum=2, alive=4, gamma=math.inf)

    assert not decision.merge
    assert decision.deadline == math.inf


def test_a_straggler_inside_the_grace_window_counts_toward_everyone_in():
    before = decide_at(3.0, (0.0, 1.0), alive=3)
    after = decide_at(3.0, (0.0, 1.0, 3.0), alive=3)

    assert not before.merge
    assert after.merge


def test_it_rejects_a_quorum_below_one():
    with pytest.raises(ValueError, match="min_quorum must be at least 1, got 0"):
        decide_at(0.0, (0.0,), min_quorum=0)


@pytest.mark.parametrize(("base", "newest", "bound", "stale"), [
    (10, 10, 0, False),
    (9, 10, 0, True),
    (6, 10, 4, False),
    (5, 10, 4, True),
    (0, 0, 0, False),
])
def test_an_update_is_stale_when_based_on_a_version_older_than_newest_minus_the_bound(
        base, newest, bound, stale):
    assert is_stale(base, newest, bound) is stale
