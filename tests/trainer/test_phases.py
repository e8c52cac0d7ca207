"""The arithmetic of an island's start-up phases (trainer/phases.py), on plain times."""

import pytest

from trainer.phases import MARKS, PHASES, StartClock


def test_each_phase_runs_from_one_mark_to_the_next():
    clock = StartClock({name: 100.0 + i for i, name in enumerate(MARKS)})
    assert clock.breakdown() == dict.fromkeys(PHASES, 1.0)
    assert list(clock.breakdown()) == list(PHASES)
    assert clock.since("asked") == 8.0


def test_a_phase_without_both_ends_is_left_out_not_guessed():
    clock = StartClock({"asked": None, "launched": 10.0, "started": 10.5})
    clock.mark("imported", 12.0)
    assert clock.breakdown() == {"process": 0.5, "imports": 1.5}
    assert clock.since("asked") is None


def test_a_claimed_standby_spends_nothing_on_process_and_imports():
    claim = 50.0
    clock = StartClock({"asked": 49.9, "launched": claim, "started": claim,
                        "imported": claim})
    for name, at in (("spec", 50.01), ("data", 50.01), ("model", 50.05), ("pull", 50.1),
                     ("first_step", 50.3)):
        clock.mark(name, at)
    phases = clock.breakdown()
    assert (phases["process"], phases["imports"]) == (0.0, 0.0)
    assert phases["dispatch"] == pytest.approx(0.1)
    assert clock.since("launched") == pytest.approx(0.3)  # its start-up counts from the claim


def test_marks_from_clocks_a_little_apart_never_make_a_negative_phase():
    clock = StartClock({"launched": 10.0, "started": 9.99})
    assert clock.breakdown() == {"process": 0.0}


def test_an_unknown_mark_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="mark must be one of asked, launched"):
        StartClock().mark("warmup", 1.0)
