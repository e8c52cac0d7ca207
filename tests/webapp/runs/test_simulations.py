"""Sweeps of the datacenter simulator (webapp.runs.simulations): the sweep a page asks
for, checked field by field, and a sweep run to its tables."""

import pytest

from webapp.runs.models import Simulation
from webapp.runs.simulations import DEFAULT_SWEEP, check_sweep, run_simulation_now, simulation_group

pytestmark = pytest.mark.django_db


def test_a_sweep_too_big_for_this_page_is_refused():
    with pytest.raises(ValueError) as e:
        check_sweep({"chips": list(range(1000, 11000, 1000)), "islands": [1, 2, 4, 8]})

    assert "At most 40 simulated runs" in e.value.args[0]["chips"]


def test_a_sweep_run_writes_its_progress_and_tables(operator):
    sweep = check_sweep({"chips": [150000], "islands": [2], "hours": 0.1, "knobs": False})
    simulation = Simulation.objects.create(spec=sweep, created_by=operator)

    run_simulation_now(simulation.pk)

    simulation.refresh_from_db()
    assert (simulation.state, simulation.progress) == ("completed", 1.0)
    modes = [(r["mode"], r["islands"]) for r in simulation.result["goodput_table"]]
    assert modes == [("dp", 1), ("elastic", 1), ("decoupled", 2)]
    assert simulation.result["bandwidth_table"]


def test_a_sweep_of_nothing_given_is_the_default_sweep():
    assert check_sweep({}) == {**DEFAULT_SWEEP, "knobs": True}


def test_numbers_may_come_as_text_and_are_sorted_without_repeats():
    sweep = check_sweep({"chips": "600000, 150000 150000", "islands": "8,1", "hours": "2"})

    assert (sweep["chips"], sweep["islands"], sweep["duration_s"]) == (
        [150_000, 600_000], [1, 8], 7200.0)


@pytest.mark.parametrize("field, value, message", [
    ("chips", [], "Give 1 to 10 numbers"),
    ("chips", list(range(1000, 12000, 1000)), "Give 1 to 10 numbers"),
    ("chips", ["many"], "Must be numbers, got 'many'"),
    ("chips", ["1e400"], "Must be numbers"),
    ("chips", [999], "Each must be between 1000 and 5e+06, got 999"),
    ("islands", [65], "Each must be between 1 and 64, got 65"),
    ("hours", 25, "Each must be between 0.1 and 24, got 25"),
])
def test_a_bad_field_is_refused_with_one_sentence_keyed_by_it(field, value, message):
    with pytest.raises(ValueError) as e:
        check_sweep({field: value})

    assert list(e.value.args[0]) == [field]
    assert e.value.args[0][field].startswith(message)


def test_every_bad_field_is_named_at_once():
    with pytest.raises(ValueError) as e:
        check_sweep({"chips": "x", "islands": [0], "hours": 0})

    assert sorted(e.value.args[0]) == ["chips", "hours", "islands"]


def test_each_simulation_has_a_channel_group_of_its_own():
    assert simulation_group(3) != simulation_group(4)
    assert str(3) in simulation_group(3)
