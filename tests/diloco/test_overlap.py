"""A run's tau from its pace (tokens per second) waiting and overlapping."""

from itertools import groupby, pairwise

import pytest

from diloco.overlap import (
    MIN_WINDOW_S,
    OVERLAP,
    WAIT,
    WINDOW_SENDS,
    Overlap,
    pace,
    window_seconds,
)


class Run:
    """A run's islands: they train `pace` tokens a second overlapping and `pace` /
    (1 + `slowdown`) waiting; its clock moves a second at a time."""

    def __init__(self, overlap: Overlap, pace: float, slowdown: float):
        self.overlap, self.pace, self.slowdown = overlap, pace, slowdown
        self.now = self.tokens = 0.0
        self.taus: list[int] = []

    def seconds(self, n: int, window_s: float = 10.0) -> list[int]:
        """The tau of each of the next n seconds."""
        for _ in range(n):
            tau = self.overlap.observe(self.now, {"run": (self.now, int(self.tokens))},
                                       window_s)
            self.taus.append(tau)
            self.tokens += self.pace / (1 + self.slowdown) if tau == 0 else self.pace
            self.now += 1.0
        return self.taus[-n:]


def test_a_run_measures_overlapping_then_waiting_before_it_decides():
    run = Run(Overlap(tau=2, wait_share=0.05), pace=1000.0, slowdown=0.5)

    assert run.seconds(10) == [2] * 10  # the config's tau, as the islands start
    assert run.overlap.slowdown() is None
    assert run.seconds(10) == [0] * 10
    assert run.seconds(10) == [2] * 10
    assert run.overlap.slowdown() == pytest.approx(0.5, abs=0.01)


def test_each_window_measures_its_second_half_after_the_islands_settle():
    overlap = Overlap(tau=1, wait_share=0.05)
    for now, tokens in [(0.0, 0), (5.0, 50_000), (10.0, 51_000)]:  # a burst, then steady
        overlap.observe(now, {"a": (now, tokens)}, 10.0)

    assert list(overlap.paces[OVERLAP]) == [pytest.approx(200.0)]


def test_the_pace_sums_each_islands_tokens_over_its_own_clock():
    before = {"a": (100.0, 1000), "b": (50.0, 500), "c": (10.0, 9000), "gone": (1.0, 5)}
    after = {"a": (110.0, 2000), "b": (54.0, 900), "c": (12.0, 100), "new": (9.0, 7)}

    # a: 100/s; b: 100/s over its own 4 s; c restarted: none; gone and new: not in both
    assert pace(before, after) == pytest.approx(200.0)


def test_a_run_overlaps_where_waiting_slows_its_pace_more_than_the_share():
    run = Run(Overlap(tau=1, wait_share=0.05), pace=1000.0, slowdown=0.2)
    run.seconds(20)

    assert run.seconds(30) == [1] * 30
    assert run.overlap.best() == OVERLAP


def test_a_run_waits_where_waiting_costs_its_pace_little():
    run = Run(Overlap(tau=1, wait_share=0.05), pace=1000.0, slowdown=0.02)
    run.seconds(20)

    assert run.seconds(30) == [0] * 30
    assert run.overlap.best() == WAIT


def test_a_run_leaves_waiting_after_one_slow_window():
    run = Run(Overlap(tau=1, wait_share=0.05), pace=1000.0, slowdown=0.0)
    assert run.seconds(21)[-1] == 0

    run.slowdown = 1.0  # the links slowed down: the window in use measures it
    assert run.seconds(10) == [0] * 9 + [1]


def test_a_run_probes_waiting_again_and_follows_a_faster_link():
    run = Run(Overlap(tau=1, wait_share=0.05, reprobe=2), pace=1000.0, slowdown=1.0)
    assert run.seconds(21)[-1] == 1

    run.slowdown = 0.0
    assert run.seconds(19) == [1] * 19  # waiting's pace measured before is still slow
    assert run.seconds(20) == [0] * 20  # the probe, 2 windows after the choice: 2 waiting
    assert run.seconds(10) == [0] * 10
    assert run.overlap.best() == WAIT


def test_probes_that_change_nothing_come_less_and_less_often():
    run = Run(Overlap(tau=1, wait_share=0.05, reprobe=2), pace=1000.0, slowdown=1.0)
    taus = run.seconds(20 + 800)[20:]  # decided: overlap

    probes = [i for i in range(1, len(taus)) if taus[i - 1] == 1 and taus[i] == 0]
    gaps = [b - a for a, b in pairwise(probes)]
    # windows of 10 s: the probe's one (its first window reads waiting far worse: it
    # ends there), then 4, 8, 16 and 32 (BACKOFF x 2) overlapping
    assert gaps == [50, 90, 170, 330]


def test_a_mode_in_use_that_measures_slower_than_the_other_once_did_measures_it_again():
    run = Run(Overlap(tau=1, wait_share=0.05, reprobe=100), pace=1000.0, slowdown=0.0)
    assert run.seconds(21)[-1] == 0  # chosen: waiting costs nothing

    run.pace = 500.0  # the host got busier: waiting now measures slower than overlapping
    taus = run.seconds(40)  # did before, so overlapping is measured again: as slow, and
    assert taus == [0] * 9 + [1] * 10 + [0] * 21  # far worse than the two windows' mean
    assert run.overlap.best() == WAIT


def test_a_probe_whose_first_window_is_close_takes_its_second():
    run = Run(Overlap(tau=1, wait_share=0.05, reprobe=2), pace=1000.0, slowdown=0.2)
    assert run.seconds(21)[-1] == 1

    run.slowdown = 0.08  # waiting now within twice the share: the probe takes 2 windows
    assert run.seconds(19 + 20) == [1] * 19 + [0] * 20


def stretches(taus: list[int], tau: int) -> list[int]:
    """The lengths of the stretches of `tau` in `taus`."""
    return [len(list(group)) for value, group in groupby(taus) if value == tau]


def test_a_probe_leaves_waiting_only_past_the_share_by_half_of_it():
    run = Run(Overlap(tau=1, wait_share=0.1, reprobe=2), pace=1000.0, slowdown=0.0)
    assert run.seconds(21)[-1] == 0

    run.slowdown = 0.12  # past the share, within half of it more: each probe (2 windows
    assert set(stretches(run.seconds(200), 1)) == {20}  # overlapping) returns to waiting
    assert run.overlap.best() == OVERLAP and run.overlap.best(keep=WAIT) == WAIT

    run.slowdown = 0.2  # past it by more: the next probe stays overlapping
    assert run.seconds(400)[100:].count(1) > 250  # waiting only to probe it


def test_a_probe_leaves_overlapping_only_under_the_share_by_half_of_it():
    run = Run(Overlap(tau=1, wait_share=0.1, reprobe=2), pace=1000.0, slowdown=0.3)
    assert run.seconds(21)[-1] == 1

    run.slowdown = 0.08
    assert set(stretches(run.seconds(200), 0)) == {20}
    assert run.overlap.best() == WAIT and run.overlap.best(keep=OVERLAP) == OVERLAP

    run.slowdown = 0.02
    assert run.seconds(600)[300:].count(0) > 250  # the next probe came 16 windows on


def test_tau_0_always_waits_and_a_wait_share_of_0_never_does():
    always = Run(Overlap(tau=0, wait_share=0.05), pace=1000.0, slowdown=5.0)
    never = Run(Overlap(tau=3, wait_share=0.0), pace=1000.0, slowdown=0.0)

    assert always.seconds(60) == [0] * 60
    assert never.seconds(60) == [3] * 60
    assert not always.overlap.adaptive and not never.overlap.adaptive


def test_a_window_is_sixteen_sends_and_at_least_two_seconds():
    assert window_seconds(1.25) == WINDOW_SENDS * 1.25
    assert window_seconds(0.01) == MIN_WINDOW_S


@pytest.mark.parametrize("tau, share, reprobe", [(-1, 0.05, 4), (1, 1.5, 4), (1, -0.1, 4),
                                                 (1, 0.05, 0)])
def test_a_bad_tau_share_or_reprobe_is_refused(tau, share, reprobe):
    with pytest.raises(ValueError):
        Overlap(tau=tau, wait_share=share, reprobe=reprobe)
