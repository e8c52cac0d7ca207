"""What syncd knows of an island from its heartbeat, its supervisor's death report and
its epoch (syncd.liveness.condition), with plain values and a clock of the test's own."""

from syncd.liveness import condition

TIMEOUT = 10.0


def beat(epoch=1, at=100.0, state="training"):
    return {"epoch": epoch, "time": at, "state": state}


def death(epoch=1, at=101.0, exit_code=-9):
    return {"epoch": epoch, "time": at, "exit_code": exit_code, "signal": 9}


def test_a_reported_death_makes_the_island_dead_at_once_whatever_its_heartbeat_says():
    assert condition(beat(at=100.0), death(), 1, 100.5, TIMEOUT) == "dead"


def test_without_a_report_an_island_is_alive_until_its_heartbeat_times_out():
    assert condition(beat(at=100.0), None, 1, 109.9, TIMEOUT) == "alive"
    assert condition(beat(at=100.0), None, 1, 110.1, TIMEOUT) == "silent"


def test_the_death_of_an_older_incarnation_says_nothing_of_the_current_one():
    assert condition(beat(epoch=2, at=100.0), death(epoch=1), 2, 100.5, TIMEOUT) == "alive"


def test_a_death_before_the_next_incarnation_spoke_no_longer_counts_once_it_is_current():
    # A rejoin set epoch 2; until epoch 2 speaks the island is neither alive nor lost.
    assert condition(beat(epoch=1), death(epoch=1), 2, 100.5, TIMEOUT) == "unknown"


def test_an_incarnation_that_died_before_its_first_heartbeat_is_dead():
    assert condition(beat(epoch=1), death(epoch=2), 2, 100.5, TIMEOUT) == "dead"
    assert condition(None, death(epoch=1), 1, 100.5, TIMEOUT) == "dead"


def test_a_stopped_island_is_not_alive_and_not_dead():
    assert condition(beat(state="stopped"), None, 1, 100.5, TIMEOUT) == "stopped"
    assert condition(None, None, 1, 100.5, TIMEOUT) == "unknown"
