"""An island's WAN link to syncd as the status snapshot gives it: its state from the
island's state and active fault, the bytes it carried since the previous status."""

import pytest

from syncd.status import link, link_state


@pytest.mark.parametrize(("state", "fault", "expected"), [
    ("training", "none", "up"),
    ("starting", "none", "up"),
    ("training", "straggle", "up"),  # a slow island, not a slow link
    ("training", "degrade", "degraded"),
    ("training", "partition", "partitioned"),
    ("lost", "partition", "partitioned"),  # silent because it is cut off
    ("lost", "none", "down"),
    ("stopped", "none", "down"),
    ("pending", "none", "down"),
    ("lost", "degrade", "down"),
])
def test_the_link_state_follows_the_islands_state_and_fault(state, fault, expected):
    assert link_state(state, fault) == expected


def island(up: int, down: int, state: str = "training", fault: str = "none") -> dict:
    return {"state": state, "fault": fault, "emulated_bytes_up": up,
            "emulated_bytes_down": down}


def test_a_link_carries_the_bytes_sent_since_the_previous_status():
    assert link(island(1500, 9000), island(1000, 4000)) == {
        "state": "up", "bytes_up": 500, "bytes_down": 5000}


def test_a_link_carries_nothing_in_the_first_status():
    assert link(island(1500, 9000), None) == {"state": "up", "bytes_up": 0, "bytes_down": 0}


def test_a_new_epoch_counts_its_bytes_from_zero():
    assert link(island(300, 700), island(1000, 4000))["bytes_up"] == 300
