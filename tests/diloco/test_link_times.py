"""t_sync from the islands' measured sends and pulls (diloco/link_times.py), the
configured round trip before both are measured."""

import pytest

from diloco.link_times import LinkCounts, LinkTimes, per_message_s, sync_time


def test_a_message_takes_the_seconds_between_two_readings_over_the_messages_between():
    assert per_message_s(3, 1.5, 7, 5.5) == pytest.approx(1.0)


@pytest.mark.parametrize(("count", "seconds"), [(3, 1.5), (3, 9.0), (1, 0.2)])
def test_no_figure_without_a_new_message_or_when_the_counts_went_back(count, seconds):
    assert per_message_s(3, 1.5, count, seconds) is None


def test_t_sync_is_the_configured_round_trip_before_both_directions_are_measured():
    assert sync_time([], [], 0.4) == (0.4, "configured")
    assert sync_time([[2.0]], [[]], 0.4) == (0.4, "configured")


def test_t_sync_is_the_median_islands_send_plus_its_pull_each_its_own_median():
    # Island c's one slow send and island b's slow link do not move the medians.
    sends = [[1.0, 1.2, 1.1], [5.0, 5.0], [1.3, 9.0, 1.3]]
    pulls = [[0.5], [3.0, 3.0], [0.7, 0.6]]
    measured = sync_time(sends, pulls, 0.001)
    assert measured.source == "measured"
    assert measured.seconds == pytest.approx(1.3 + 0.65)


def counts(epoch: int, sends: int, send_s: float, pulls: int, pull_s: float) -> LinkCounts:
    return LinkCounts(epoch, sends, send_s, pulls, pull_s)


def test_successive_heartbeats_give_the_link_time_of_the_messages_between_them():
    link = LinkTimes()
    link.observe("a", counts(1, 2, 1.0, 1, 0.5))
    assert link.sync_time(0.1) == (0.1, "configured")  # one reading: no figure yet
    link.observe("a", counts(1, 2, 1.0, 1, 0.5))  # the same heartbeat read again
    link.observe("a", counts(1, 4, 9.0, 3, 2.5))
    assert link.sync_time(0.1) == (pytest.approx(4.0 + 1.0), "measured")


def test_a_new_epoch_starts_from_its_own_first_heartbeat():
    link = LinkTimes()
    link.observe("a", counts(1, 9, 90.0, 9, 90.0))
    link.observe("a", counts(2, 1, 0.5, 1, 0.5))  # counts from 0 again: no figure
    assert link.sync_time(0.1).source == "configured"
    link.observe("a", counts(2, 2, 1.0, 2, 0.75))
    assert link.sync_time(0.1) == (pytest.approx(0.75), "measured")


def test_only_the_recent_window_counts():
    link = LinkTimes(window=2)
    link.observe("a", counts(1, 0, 0.0, 0, 0.0))
    for n, seconds in enumerate([10.0, 1.0, 1.0], start=1):
        before = link.last["a"]
        link.observe("a", counts(1, n, before.send_s + seconds, n, before.pull_s + seconds))
    assert link.sync_time(0.1).seconds == pytest.approx(2.0)


def test_a_forgotten_island_no_longer_sizes_t_sync_and_starts_afresh():
    link = LinkTimes()
    for island, seconds in (("near", 1.0), ("far", 100.0), ("lost", 100.0)):
        link.observe(island, counts(1, 1, 0.0, 1, 0.0))
        link.observe(island, counts(1, 2, seconds, 2, seconds))
    assert link.sync_time(0.1).seconds == pytest.approx(200.0)  # the median: a slow one

    link.forget("lost")
    assert link.sync_time(0.1).seconds == pytest.approx(101.0)  # median of two: the mean
    link.observe("lost", counts(2, 1, 5.0, 1, 5.0))  # back: its first reading, no figure
    assert link.sync_time(0.1).seconds == pytest.approx(101.0)
